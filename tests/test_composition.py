"""Query composition (chapter 10): the question-first task, the patching of queries and keys,
and the shipped models' recorded results."""

import pytest
import torch

from course_lib.masks import causal_mask
from course_lib.measure import threads
from course_lib.models import TinyTransformer
from course_lib.position import apply_rope
from course_lib.stacking import composition as C
from course_lib.train import IGNORE_INDEX, accuracy


@pytest.fixture(autouse=True)
def _one_thread():
    with threads(1):
        yield


def test_question_first_batch_is_chapter_06s_layout():
    tokens, targets = C.question_first_batch(torch.Generator().manual_seed(3), 200)
    n, vocab = C.TASK["n"], C.TASK["vocab"]
    assert tokens.shape == targets.shape == (200, n + 2)
    k = tokens[:, 0] - vocab
    assert k.min() >= 1 and k.max() <= n and len(k.unique()) > 8  # the question comes first
    assert (tokens[:, -1] == vocab).all()  # `?` last
    assert (tokens[:, 1:-1] < vocab).all()  # x_1 .. x_n
    assert (targets[:, :-1] == IGNORE_INDEX).all()
    where = C.asked_position(tokens)
    assert torch.equal(where, n + 1 - k)  # k places before `?`
    assert torch.equal(targets[:, -1], tokens[torch.arange(200), where])


def test_question_middle_batch_puts_the_question_after_the_asked_token():
    tokens, targets = C.question_middle_batch(torch.Generator().manual_seed(4), 3000)
    n, vocab = C.TASK["n"], C.TASK["vocab"]
    assert tokens.shape == targets.shape == (3000, n + 2)
    assert (tokens[:, -1] == vocab).all() and ((tokens == vocab).sum(1) == 1).all()
    is_question = tokens > vocab
    assert (is_question.sum(1) == 1).all()  # one question, somewhere before `?`
    k = tokens.max(1).values - vocab
    assert k.min() == 2 and k.max() == n + 1
    where, question = C.asked_position(tokens), is_question.int().argmax(1)
    assert torch.equal(where, n + 1 - k)
    assert (where < question).all()  # the asked token came before the question
    assert len(question.unique()) == n  # the question stands anywhere from column 1 to n
    assert torch.equal(targets[:, -1], tokens[torch.arange(3000), where])
    assert (targets[:, :-1] == IGNORE_INDEX).all()


def _model(seed=0, layers=2):
    torch.manual_seed(seed)
    return TinyTransformer(vocab_size=11, d_model=16, num_heads=2, num_layers=layers,
                           max_len=12).eval()


def _tokens(seed=1):
    return torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(seed))


def test_no_patch_is_the_model_itself():
    model, tokens = _model(), _tokens()
    clean = C.stream_before(model, tokens, 1)
    for layer in (0, 1):
        logits, _ = C.patch_queries_keys(model, tokens, C.stream_before(model, tokens, layer),
                                         layer, "none")
        torch.testing.assert_close(logits, model(tokens), rtol=0, atol=1e-6)
    for patch in C.PATCHES:  # the "ablated" stream is the clean one: no patch changes anything
        logits, weights = C.patch_queries_keys(model, tokens, clean, 1, patch)
        torch.testing.assert_close(logits, model(tokens), rtol=0, atol=1e-6)
        torch.testing.assert_close(weights, model.blocks[1].weights, rtol=0, atol=1e-6)


def test_patches_match_a_hand_computed_attention():
    model, tokens = _model(), _tokens()
    clean = C.stream_before(model, tokens, 1)
    ablated = clean + torch.randn(clean.shape, generator=torch.Generator().manual_seed(2))
    block = model.blocks[1]
    attn, n = block.attn, tokens.shape[1]
    for patch in C.PATCHES:
        q_src = ablated if patch in ("queries", "both") else clean
        k_src = ablated if patch in ("keys", "both") else clean

        def heads(proj, x):  # (B, n, d) -> (B, h, n, d_head), rotated by position
            y = proj(block.ln1(x)).view(3, n, attn.num_heads, attn.d_head).transpose(1, 2)
            return apply_rope(y, torch.arange(n))
        q, k = heads(attn.q_proj, q_src), heads(attn.k_proj, k_src)
        scores = (q @ k.transpose(-2, -1)) / attn.d_head ** 0.5
        want = scores.masked_fill(~causal_mask(n), float("-inf")).softmax(-1)
        _, got = C.patch_queries_keys(model, tokens, ablated, 1, patch)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_query_patch_moves_only_its_row_a_key_patch_only_later_rows():
    model, tokens = _model(), _tokens()
    clean = C.stream_before(model, tokens, 1)
    p = 5
    ablated = clean.clone()
    ablated[:, p] += torch.randn(clean.shape[-1], generator=torch.Generator().manual_seed(3))
    # the ablated stream differs at one position only (not by a constant: LayerNorm drops it)
    _, base = C.patch_queries_keys(model, tokens, ablated, 1, "none")
    _, by_q = C.patch_queries_keys(model, tokens, ablated, 1, "queries")
    _, by_k = C.patch_queries_keys(model, tokens, ablated, 1, "keys")
    rows = torch.arange(tokens.shape[1]) != p
    assert torch.equal(by_q[:, :, rows], base[:, :, rows])  # only query p asked differently
    assert not torch.allclose(by_q[:, :, p], base[:, :, p])
    assert torch.equal(by_k[:, :, :p], base[:, :, :p])  # earlier queries never see key p
    assert not torch.allclose(by_k[:, :, p:], base[:, :, p:])


def test_patching_rejects_bad_arguments():
    model, tokens = _model(), _tokens()
    clean = C.stream_before(model, tokens, 1)
    with pytest.raises(ValueError, match="patch"):
        C.patch_queries_keys(model, tokens, clean, 1, "values")
    with pytest.raises(ValueError, match="layer"):
        C.patch_queries_keys(model, tokens, clean, 2, "none")
    with pytest.raises(ValueError, match="ablated has shape"):
        C.patch_queries_keys(model, tokens, clean[:, :-1], 1, "none")


@pytest.mark.parametrize("name", sorted(C.SPECS))
def test_shipped_models_load_and_reproduce_their_records(name):
    rec = C.record(name)
    model = C.load(name)
    assert model.num_parameters() == rec["parameters"]
    assert rec["steps_done"] == C.SPECS[name]["steps"]
    tokens, targets = C.test_batch(rec["spec"]["task"])
    with torch.no_grad():
        got = accuracy(model(tokens), targets)
    assert abs(got - rec["test_accuracy"]) <= 0.0015, (name, got, rec["test_accuracy"])


def test_shipped_models_match_what_the_lecture_says():
    accuracies = {name: C.record(name)["test_accuracy"] for name in C.SPECS}
    assert accuracies["2layer"] > 0.99 and accuracies["middle_2layer"] > 0.9
    assert max(accuracies["1layer"], accuracies["1layer_wide"], accuracies["middle_1layer"]) < 0.35
    params = {name: C.record(name)["parameters"] for name in C.SPECS}
    assert abs(params["1layer_wide"] - params["2layer"]) < 0.01 * params["2layer"]
    assert C.record("1layer_wide")["steps_done"] == 10 * C.record("2layer")["steps_done"]


@pytest.mark.parametrize("name,carrier", [("2layer", "keys"), ("middle_2layer", "queries")])
def test_patching_finds_the_side_that_carries_layer_0(name, carrier):
    model = C.load(name)
    tokens, targets = C.test_batch(C.SPECS[name]["task"])
    table = C.patching_table(model, tokens, targets, C.recall_answer_at(tokens))
    other = {"keys": "queries", "queries": "keys"}[carrier]
    assert table["none"]["accuracy"] > 0.9
    assert table[carrier]["accuracy"] < 0.5 < 0.75 < table[other]["accuracy"]
    assert table["ablated"]["accuracy"] < 0.3


def test_the_command_makes_loadable_models(tmp_path, capsys):
    assert C.main(["--quick", "--out", str(tmp_path), "1layer"]) == 0
    assert "1layer: 3 steps" in capsys.readouterr().out
    model = C.load("1layer", tmp_path)
    assert C.record("1layer", tmp_path)["steps_done"] == C.QUICK_STEPS
    assert model(_tokens_for_task()).shape == (4, C.TASK["n"] + 2, C.VOCAB_SIZE)
    with pytest.raises(FileNotFoundError, match="python -m course_lib.stacking.composition"):
        C.load("2layer", tmp_path)


def _tokens_for_task():
    return C.question_first_batch(torch.Generator().manual_seed(0), 4)[0]
