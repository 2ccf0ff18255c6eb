"""Chapter 10's attention-only model, the live induction training, induction on real text, and
the residual stream drawn as a running sum."""

import matplotlib
import pytest
import torch

from course_lib.diagrams.residual import draw_residual_stream, residual_stream
from course_lib.models import TinyTransformer
from course_lib.stacking import induction_text as IT
from course_lib.stacking.induction import (
    AttentionOnlyBlock,
    AttentionOnlyTransformer,
    Watch,
    ablate_head,
    jump_step,
    watch_induction,
)
from course_lib.stacking.text import CharTokenizer

matplotlib.use("Agg")


def _with_mlps_adding_nothing(model: AttentionOnlyTransformer) -> TinyTransformer:
    """The reference: a TinyTransformer with the same weights whose MLPs output exactly 0."""
    ref = TinyTransformer(model.vocab_size, model.d_model, model.num_heads, model.num_layers,
                          model.max_len)
    missing, unexpected = ref.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(".mlp." in k or ".ln2." in k for k in missing)
    with torch.no_grad():
        for block in ref.blocks:
            block.mlp[2].weight.zero_()
            block.mlp[2].bias.zero_()
    return ref.eval()


@pytest.mark.parametrize("seed,layers", [(0, 1), (1, 2), (2, 3)])
def test_attention_only_model_is_a_tiny_transformer_whose_mlps_add_nothing(seed, layers):
    torch.manual_seed(seed)
    model = AttentionOnlyTransformer(vocab_size=11, d_model=16, num_heads=2, num_layers=layers,
                                     max_len=12).eval()
    assert all(isinstance(b, AttentionOnlyBlock) for b in model.blocks)
    assert not any(".mlp." in k or ".ln2." in k for k in model.state_dict())
    idx = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), _with_mlps_adding_nothing(model)(idx))
    # the parent's cache and generate work unchanged
    assert torch.equal(model.generate(idx[:, :4], 5, use_cache=True),
                       model.generate(idx[:, :4], 5, use_cache=False))


def test_attention_only_block_refuses_a_wrong_shape_by_name():
    block = AttentionOnlyBlock(8, 2)
    with pytest.raises(ValueError, match=r"x has shape \(2, 3, 4\)"):
        block(torch.zeros(2, 3, 4))


def test_watch_measures_every_k_steps_and_after_the_last():
    from course_lib.train import train

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    seen = []
    watch = Watch(model, lambda g: (torch.randn(4, 3, generator=g),
                                    torch.randint(0, 2, (4,), generator=g)),
                  lambda m: seen.append(m.training) or float(m.weight.detach().sum()), every=4)
    train(model, watch, steps=10, progress=False)
    curve = watch.finish()
    assert [s for s, _ in curve] == [0, 4, 8, 10]
    assert curve[-1][1] == pytest.approx(float(model.weight.detach().sum()))
    assert seen == [True, True, True, False]  # measured in whatever mode it was, then restored
    with pytest.raises(ValueError, match="every"):
        Watch(model, None, None, every=0)


def test_live_training_is_deterministic_and_refuses_unknown_settings():
    small = {"task": {"segment": 3, "gap": 2, "vocab": 8}, "batch": 8, "test_batch": 16,
             "model": {"vocab_size": 8, "d_model": 8, "num_heads": 2, "num_layers": 2,
                       "max_len": 8}}
    a = watch_induction(12, seed=3, every=4, progress=False, **small)
    b = watch_induction(12, seed=3, every=4, progress=False, **small)
    assert a["steps"] == [0, 4, 8, 12]
    assert a["accuracy"] == b["accuracy"] and a["loss"] == b["loss"]
    assert jump_step({"steps": [0, 10, 20], "accuracy": [0.1, 0.4, 0.9]}) == 20
    assert jump_step({"steps": [0, 10], "accuracy": [0.1, 0.2]}) is None
    with pytest.raises(ValueError, match="unknown setting"):
        watch_induction(5, progress=False, learning_rate=1.0)
    with pytest.raises(ValueError, match="steps"):
        watch_induction(0, progress=False)


def test_copy_losses_read_the_two_copies_and_refuse_a_stretch_that_is_not_repeated():
    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz ")
    tokens = IT.random_repeat(torch.Generator().manual_seed(0), tokenizer, batch=4, segment=6)
    assert tokens.shape == (4, 12) and torch.equal(tokens[:, :6], tokens[:, 6:])
    assert int(tokens.max()) < 26  # letters only, never the space

    class Copier(torch.nn.Module):  # certain of the token 6 back, else uniform
        def forward(self, idx):
            logits = torch.zeros(*idx.shape, 27)
            logits[:, 5:].scatter_(2, idx[:, :-5, None], 50.0)
            return logits

    losses = IT.copy_losses(Copier(), tokens)
    assert losses["second"] < 1e-6 and losses["first"] == pytest.approx(torch.log(
        torch.tensor(27.0)).item(), abs=1e-4)
    with pytest.raises(ValueError, match="same stretch"):
        IT.copy_losses(Copier(), torch.arange(12).reshape(1, 12))
    with pytest.raises(ValueError, match=r"tokens has shape \(1, 5\)"):
        IT.copy_losses(Copier(), torch.zeros(1, 5, dtype=torch.long))


def test_residual_stream_parts_are_the_sublayer_outputs_and_sum_to_the_final_stream():
    torch.manual_seed(0)
    model = TinyTransformer(vocab_size=10, d_model=16, num_heads=2, num_layers=2, max_len=8)
    tokens = torch.randint(0, 10, (2, 7), generator=torch.Generator().manual_seed(1))
    stream = residual_stream(model, tokens)
    assert stream["names"] == ["embedding", "attn 0", "mlp 0", "attn 1", "mlp 1"]
    parts, final = stream["parts"], stream["final"]
    assert parts.shape == (5, 2, 7, 16)
    torch.testing.assert_close(parts.sum(0), final, rtol=0, atol=1e-5)
    with torch.no_grad():  # the hooks' numbers are the sub-layers' own outputs, by hand
        x = model.embed(tokens)
        torch.testing.assert_close(parts[0], x)
        positions = torch.arange(7).expand(2, 7)
        mask = torch.ones(7, 7, dtype=torch.bool).tril()[None, None]
        for i, block in enumerate(model.blocks):
            attended, _ = block.attn(block.ln1(x), mask=mask, positions=positions)
            torch.testing.assert_close(parts[1 + 2 * i], attended)
            x = x + attended
            torch.testing.assert_close(parts[2 + 2 * i], block.mlp(block.ln2(x)))
            x = x + parts[2 + 2 * i]
        torch.testing.assert_close(model.lm_head(model.ln_f(final)), model(tokens))
    only = residual_stream(AttentionOnlyTransformer(10, 16, 2, 2, 8), tokens)
    assert only["names"] == ["embedding", "attn 0", "attn 1"]
    torch.testing.assert_close(only["parts"].sum(0), only["final"], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="tokens has shape"):
        residual_stream(model, tokens[0])


def test_the_drawn_chain_ends_on_the_final_stream():
    torch.manual_seed(0)
    model = TinyTransformer(vocab_size=10, d_model=16, num_heads=2, num_layers=2, max_len=8)
    tokens = torch.randint(0, 10, (1, 6), generator=torch.Generator().manual_seed(2))
    stream = residual_stream(model, tokens)
    fig, drawn = draw_residual_stream(stream, list("abcdef"), position=4)
    torch.testing.assert_close(drawn["norms"], stream["parts"][:, 0].norm(dim=-1))
    torch.testing.assert_close(drawn["ends"][-1], drawn["final"], rtol=0, atol=1e-5)
    assert 0 < drawn["share"] <= 1
    matplotlib.pyplot.close(fig)
    with pytest.raises(ValueError, match="position"):
        draw_residual_stream(stream, list("abcdef"), position=6)
    with pytest.raises(ValueError, match="labels"):
        draw_residual_stream(stream, list("abc"), position=1)


def test_the_command_makes_a_loadable_model(tmp_path, capsys):
    assert IT.main(["--quick", "--out", str(tmp_path)]) == 0
    rec = IT.record("induction_text", tmp_path)
    assert rec["steps_done"] == IT.QUICK_STEPS and rec["curve"]["step"] == [0, IT.QUICK_STEPS]
    model = IT.load("induction_text", tmp_path)
    assert isinstance(model, AttentionOnlyTransformer) and not model.training
    assert "induction_text: 3 steps" in capsys.readouterr().out
    with pytest.raises(ValueError, match="name"):
        IT.record("induction_txt")


def test_shipped_model_matches_its_spec_and_reproduces_its_record():
    rec = IT.record()
    assert rec["spec"] == IT.SPECS["induction_text"], "the code's spec and the shipped one differ"
    assert rec["steps_done"] == rec["spec"]["steps"], "shipped weights from a --quick run"
    assert rec["command"] == "python -m course_lib.stacking.induction_text induction_text"
    model = IT.load()
    assert model.num_parameters() == rec["parameters"]
    again = IT.measure(model, rec["spec"], model.tokenizer)
    for key, value in rec["result"].items():  # another CPU rounds a little differently
        assert again[key] == pytest.approx(value, abs=2e-3), key
    curve = rec["curve"]
    assert curve["step"][-1] == rec["steps_done"]
    assert {len(v) for k, v in curve.items() if k != "every"} == {len(curve["step"])}


def test_ablating_a_head_of_the_shipped_model_restores_it():
    model = IT.load()
    probe = IT.probe_batch(IT.SPECS["induction_text"], model.tokenizer)
    before = IT.copy_losses(model, probe)
    with ablate_head(model, 1, 0):
        IT.copy_losses(model, probe)
    assert IT.copy_losses(model, probe) == before
