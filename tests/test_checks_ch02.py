"""Chapter 02's checkers pass right answers and turn every kind of wrong answer into feedback."""

import math

import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib import attention
from course_lib.checks import CheckFailure
from course_lib.checks import ch02 as check


def scores_ok(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def softmax_ok(s):
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def attention_ok(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    w = softmax_ok(scores_ok(q, k))
    return w @ v, w


def batched_ok(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
    return w @ v, w


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.batched_attention, batched_ok),
    (check.batched_attention, lambda x, w_q, w_k, w_v: attention_ok(x, w_q, w_k, w_v)),
    (check.attention_scores, scores_ok),
    (check.softmax_rows, softmax_ok),
    (check.self_attention, attention_ok),
    (check.attention_scores,
     lambda q, k: (q.numpy() @ np.swapaxes(k.numpy(), -1, -2)) / np.sqrt(q.shape[-1])),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.attention_scores.hints[0]),
    (lambda *a: (torch.full((2, 2), float("nan")), torch.full((2, 2), float("nan"))),
     "shape|a tuple of 2 tensors"),
]


# (check, malformed prediction or wrong why, words its feedback must hold): test_checks_generic
PREDICTION_MISTAKES = [
    (check.shuffle_prediction, None, "is None"),
    (check.shuffle_prediction, 3, "should be one of"),
    (check.shuffle_prediction, "rot", "should be one of"),
    (check.shuffle_why, "b", "not symmetric here"),
    (check.shuffle_why, "c", "only half of it"),
]

# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.batched_attention, lambda x, w_q, w_k, w_v:
     attention.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)),
    (check.softmax_rows, lambda s: attention.softmax(s)),
    (check.self_attention,
     lambda x, w_q, w_k, w_v: attention.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)),
    (check.self_attention, lambda x, w_q, w_k, w_v: (
        torch.nn.functional.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v),
        attention_ok(x, w_q, w_k, w_v)[1])),
]


@pytest.mark.parametrize("wrong,words", [
    (lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), "one row per query"),
    (lambda q, k: torch.full(scores_ok(q, k).shape, float("nan")), "NaN"),
    (lambda q, k: scores_ok(q, k)[..., :-1], "shape"),
])
def test_wrong_scores(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.attention_scores(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda s: torch.exp(s) / torch.exp(s).sum(-1, keepdim=True), "overflows"),
    (lambda s: torch.exp(s - s.amax(-1, keepdim=True)), "not 1"),
    (lambda s: torch.exp(s - s.amax()) / torch.exp(s - s.amax()).sum(-2, keepdim=True),
     "columns sum to 1"),
    (lambda s: torch.softmax(s, dim=-1), "which this exercise rules out"),
    (lambda s: s.softmax(-1), "which this exercise rules out"),
    (lambda s: torch.nn.functional.softmax(s, -1), "which this exercise rules out"),
])
def test_wrong_softmax(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.softmax_rows(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda x, wq, wk, wv: softmax_ok((x @ wq) @ (x @ wk).transpose(-2, -1)) @ (x @ wv),
     "should return a pair"),
    (lambda x, wq, wk, wv: (attention_ok(x, wq, wk, wv)[1] @ x, attention_ok(x, wq, wk, wv)[1]),
     "the output"),
    (lambda x, wq, wk, wv: (1, 2, 3), "length 3"),
])
def test_wrong_self_attention(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.self_attention(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda x, w_q, w_k, w_v: batched_ok(x, w_q, w_k, w_v)[0], "should return a pair"),
    (lambda x, w_q, w_k, w_v: (batched_ok(x, w_q, w_k, w_v)[0],
                               batched_ok(x, w_q, w_k, w_v)[1][0]), "shape"),
])
def test_wrong_batched_attention(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.batched_attention(wrong)


def test_shuffle_prediction_is_committed_whatever_it_says(capsys):
    from course_lib.checks import _predict
    for choice in (" Shuffled ", "same", "different"):
        _predict.forget()
        check.shuffle_prediction(choice)
        out = capsys.readouterr().out
        assert out.index("📌 Recorded") < out.index("The run:")
    run = check.shuffle_experiment()
    assert run["shuffled"] < 1e-12 < 0.1 < run["same"]
    _predict.forget()
    check.shuffle_why("a")
    _predict.forget()


def _dilution_run(seed, trials=500, scale=True):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n in (4, 64, 1024):
        q, k = torch.randn(trials, 1, 16, generator=g), torch.randn(trials, n, 16, generator=g)
        s = q @ k.transpose(-2, -1) / (4 if scale else 1)
        out[n] = torch.softmax(s, -1).amax(-1).mean().item()
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_any_honest_dilution_run_passes(seed, capsys):
    check.dilution_experiment(_dilution_run(seed))
    assert "dilutes" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,words", [
    (None, "is None"),
    ({4: 0.5, 64: 0.1}, "no entry for 1024"),
    (_dilution_run(0, scale=False), "sqrt"),
    ({4: 0.25, 64: 1 / 64, 1024: 1 / 1024}, "LARGEST weight"),
    ({4: 0.9, 64: 0.5, 1024: 0.3}, "too LARGE"),
    ({4: 0.5, 64: 0.1, 1024: float("nan")}, "finite"),
    ({4: 2.0, 64: 0.1, 1024: 0.02}, "cannot be a softmax weight"),
])
def test_wrong_dilution_measurements(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.dilution_experiment(wrong)
