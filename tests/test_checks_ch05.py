"""Chapter 05's checkers pass right answers and turn every kind of wrong answer into feedback."""


import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib import multihead
from course_lib.attention import scaled_dot_product_attention
from course_lib.checks import CheckFailure
from course_lib.checks import ch05 as check


def split_ok(x, h):
    B, n, d = x.shape
    return x.view(B, n, h, d // h).transpose(1, 2)


def merge_ok(x):
    B, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(B, n, h * dh)


def mha_ok(x, w_q, w_k, w_v, w_o, h, mask=None):
    q, k, v = split_ok(x @ w_q, h), split_ok(x @ w_k, h), split_ok(x @ w_v, h)
    heads, w = scaled_dot_product_attention(q, k, v, mask=mask)
    return merge_ok(heads) @ w_o, w


def prev_ok(w):
    return torch.diagonal(w, offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.split_heads, split_ok),
    (check.merge_heads, merge_ok),
    (check.multi_head_attention, mha_ok),
    (check.previous_token_score, prev_ok),
    (check.split_heads, lambda x, h: split_ok(x, h).numpy()),
    (check.previous_token_score, lambda w: prev_ok(w).numpy()),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.split_heads.hints[0]),
    (lambda *a: (lambda: 1), "returned a function, which a check cannot read"),
]


# (check, malformed prediction or wrong why, words its feedback must hold): test_checks_generic
PREDICTION_MISTAKES = [
    (check.flop_growth, None, "None"),
    (check.flop_growth, "8", "should be a number"),
    (check.flop_growth, float("nan"), "finite"),
    (check.flop_growth, -1.0, "outside"),
    (check.flop_growth, True, "should be a number"),
    (check.flop_why, "a", "not by their"),
    (check.flop_why, "b", "heads do not read each other"),
    (check.flop_why, "d", "the other way round"),
]

# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.split_heads, lambda x, h: multihead.split_heads(x, h)),
    (check.multi_head_attention, lambda x, w_q, w_k, w_v, w_o, h, mask=None:
        multihead.MultiHeadAttention(x.shape[-1], h, bias=False).double()(x, mask=mask)),
]


@pytest.mark.parametrize("wrong,words", [
    (lambda x, h: x.view(x.shape[0], x.shape[1], h, -1), "head axis must come before"),
    (lambda x, h: split_ok(x, h)[:, :1], "shape"),
    (lambda x, h: split_ok(x, h) * float("nan"), "NaN"),
    (lambda x, h: split_ok(x, h).flip(1), "feature"),
])
def test_wrong_split(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.split_heads(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda x: x.transpose(1, 2), "shape"),
    (lambda x: merge_ok(x.flip(1)), "differs"),
])
def test_wrong_merge(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.merge_heads(wrong)


def mha_no_mask(x, w_q, w_k, w_v, w_o, h, mask=None):
    return mha_ok(x, w_q, w_k, w_v, w_o, h, None)


@pytest.mark.parametrize("wrong,words", [
    (lambda *a: mha_ok(*a)[0], "should return a pair"),
    (mha_no_mask, "mask is False"),
    (lambda *a: (mha_ok(*a)[0], mha_ok(*a)[1].mean(1)), "shape"),
    (lambda *a: (mha_ok(*a)[0][:, :-1], mha_ok(*a)[1]), "out has shape"),
])
def test_wrong_multi_head_attention(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.multi_head_attention(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda w: prev_ok(w).mean(), "one number"),
    (lambda w: torch.diagonal(w, offset=1, dim1=-2, dim2=-1).mean(dim=(0, 2)), "differs"),
    (lambda w: np.full(w.shape[1], np.nan), "NaN"),
])
def test_wrong_previous_token_score(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.previous_token_score(wrong)


def test_flop_growth_is_committed_whatever_it_says(capsys):
    from course_lib.checks import _predict
    assert check.measured_flops(4) / check.measured_flops(1) == 8.0
    for guess in (8.0, torch.tensor(7.0), 4, 16.0):
        _predict.forget()
        check.flop_growth(guess)
        out = capsys.readouterr().out
        assert out.index("📌 Recorded") < out.index("8x")
    _predict.forget()
