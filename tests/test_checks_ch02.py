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


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
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


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "calls the course's own" feedback, not a pass.
REFERENCE_CALLS = [
    (check.softmax_rows, lambda s: attention.softmax(s)),
    (check.self_attention,
     lambda x, w_q, w_k, w_v: attention.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)),
    (check.self_attention, lambda x, w_q, w_k, w_v: (
        torch.nn.functional.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v),
        attention_ok(x, w_q, w_k, w_v)[1])),
]


@pytest.mark.parametrize("wrong,words", [
    (lambda q, k: q @ k.transpose(-2, -1), "raw dot products"),
    (lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1], "divided by d_k"),
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
    (lambda s: torch.softmax(s, dim=-1), "calls the course's own"),
    (lambda s: s.softmax(-1), "calls the course's own"),
    (lambda s: torch.nn.functional.softmax(s, -1), "calls the course's own"),
])
def test_wrong_softmax(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.softmax_rows(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda x, wq, wk, wv: softmax_ok((x @ wq) @ (x @ wk).transpose(-2, -1)) @ (x @ wv),
     "should return a pair"),
    (lambda x, wq, wk, wv: (None, softmax_ok((x @ wq) @ (x @ wk).transpose(-2, -1))),
     "without the 1/sqrt"),
    (lambda x, wq, wk, wv: (None, attention_ok(x, wq, wk, wv)[1].transpose(-2, -1)), "transposed"),
    (lambda x, wq, wk, wv: (attention_ok(x, wq, wk, wv)[1] @ x, attention_ok(x, wq, wk, wv)[1]),
     "the output"),
    (lambda x, wq, wk, wv: (1, 2, 3), "length 3"),
])
def test_wrong_self_attention(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.self_attention(wrong)
