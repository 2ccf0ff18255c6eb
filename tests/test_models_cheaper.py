"""Chapter 09's swappable one-layer model: each shortcut does what it says, and nothing else."""

import pytest
import torch

from course_lib.linear_attention import linear_attention
from course_lib.masks import sliding_window_mask
from course_lib.models.cheaper import CheaperAttentionModel, kv_parameters


def test_window_model_cannot_see_past_its_window():
    torch.manual_seed(0)
    model = CheaperAttentionModel(10, 5, d_model=16, num_heads=2, max_len=12, window=3).eval()
    tokens = torch.randint(0, 10, (2, 12))
    logits, weights = model(tokens)
    assert logits.shape == (2, 12, 5) and weights.shape == (2, 2, 12, 12)
    assert (weights[..., ~sliding_window_mask(12, 3)] == 0).all()
    changed = tokens.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 10              # position 0 is outside the last window
    assert torch.equal(model(changed)[0][:, 3:], logits[:, 3:])
    assert not torch.equal(model(changed)[0][:, :3], logits[:, :3])


def test_grouped_model_has_smaller_kv_projections():
    sizes = {}
    for g in (4, 2, 1):
        torch.manual_seed(0)
        model = CheaperAttentionModel(10, 5, d_model=32, num_heads=4, num_kv_heads=g)
        sizes[g] = kv_parameters(model)
        logits, weights = model(torch.randint(0, 10, (3, 7)))
        assert logits.shape == (3, 7, 5) and weights.shape == (3, 4, 7, 7)
        assert torch.allclose(weights.sum(-1), torch.ones(3, 4, 7))
    assert sizes[4] == 2 * (32 * 32 + 32) and sizes[2] == 2 * (32 * 16 + 16)
    assert sizes[1] == 2 * (32 * 8 + 8)


def test_linear_model_uses_causal_linear_attention():
    torch.manual_seed(0)
    model = CheaperAttentionModel(10, 5, d_model=16, num_heads=2, kind="linear").eval()
    tokens = torch.randint(0, 10, (2, 9))
    logits, weights = model(tokens)
    assert weights is None and logits.shape == (2, 9, 5)
    x = model.tok(tokens) + model.pos(torch.arange(9))
    a = model.attn
    split = lambda t: t.view(2, 9, 2, 8).transpose(1, 2)  # noqa: E731
    q, k, v = split(a.q_proj(x)), split(a.k_proj(x)), split(a.v_proj(x))
    heads = linear_attention(q, k, v, causal=True)
    want = model.readout(model.norm(x + a.out_proj(heads.transpose(1, 2).reshape(2, 9, 16))))
    torch.testing.assert_close(logits, want)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 10             # causal: the past does not see it
    assert torch.equal(model(changed)[0][:, :-1], logits[:, :-1])


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind must be one of"):
        CheaperAttentionModel(10, 5, kind="fast")
    with pytest.raises(ValueError, match="apply to softmax attention"):
        CheaperAttentionModel(10, 5, kind="linear", window=3)
    with pytest.raises(ValueError, match=r"wanted \(batch, n <= 8\)"):
        CheaperAttentionModel(10, 5, max_len=8)(torch.zeros(1, 9, dtype=torch.long))


def test_majority_batch_asks_for_the_most_frequent_token():
    from course_lib.models.cheaper import majority_batch
    tokens, targets = majority_batch(torch.Generator().manual_seed(0), batch=500, n=24, vocab=8)
    assert tokens.shape == targets.shape == (500, 25)
    assert (tokens[:, -1] == 8).all() and (targets[:, :-1] == -100).all()
    counts = torch.nn.functional.one_hot(tokens[:, :-1], 8).sum(1)           # (500, 8)
    answered = targets[:, -1] != -100
    best = counts.max(-1).values
    assert torch.equal(counts[answered].argmax(-1), targets[answered, -1])
    assert ((counts == best[:, None]).sum(-1) > 1).eq(~answered).all()      # ties, and only ties
    assert 0.7 < answered.float().mean() < 1.0
    again = majority_batch(torch.Generator().manual_seed(0), batch=500, n=24, vocab=8)
    assert torch.equal(again[0], tokens) and torch.equal(again[1], targets)


def test_recorded_sweeps_are_whole():
    from course_lib.models import cheaper_results as r
    from course_lib.models.cheaper_sweep import LINEAR_STEPS, SEEDS, WIDTHS
    want = {("softmax", d, 300) for d in WIDTHS} | {("linear", d, s) for d in WIDTHS
                                                     for s in LINEAR_STEPS}
    got = [(row["kind"], row["d_head"], row["steps"]) for row in r.LINEAR_RECALL]
    assert set(got) == want and all(got.count(w) == len(SEEDS) for w in want)
    assert all(sorted(r.by_k(row)) == list(range(1, 25)) for row in r.LINEAR_RECALL)
    assert len(r.MAJORITY) == 2 * len(SEEDS)
    assert {(row["d_head"], row["kv_heads"]) for row in r.SHARING} == {(2, 4), (2, 2), (2, 1),
                                                                       (8, 4), (8, 1)}
    assert sorted(r.by_k(r.WINDOWED)) == list(range(1, 25))
