"""Chapter 04's checkers pass right answers and turn every kind of wrong answer into feedback."""

import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib import attention, masks
from course_lib.checks import CheckFailure
from course_lib.checks import ch04 as check


def causal_ok(n):
    return torch.ones(n, n).tril().bool()


def padding_ok(lengths, n_keys):
    return (torch.arange(n_keys)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]


def additive_ok(mask):
    return torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))


def masked_softmax_ok(scores, mask):
    s = scores.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.causal_attention, lambda q, k, v: causal_attention_ok(q, k, v)),
    (check.causal_mask, causal_ok),
    (check.padding_mask, padding_ok),
    (check.to_additive, additive_ok),
    (check.masked_softmax, masked_softmax_ok),
    (check.causal_mask, lambda n: np.tril(np.ones((n, n), dtype=bool))),
    (check.masked_softmax, lambda s, m: masked_softmax_ok(s, m).numpy()),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.causal_mask.hints[0]),
    (lambda *a: torch.full((1, 2, 3), float("nan")), "dtype|shape"),
]


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.causal_attention, lambda q, k, v: attention.scaled_dot_product_attention(
        q, k, v, mask=masks.causal_mask(q.shape[-2]))),
    (check.causal_mask, lambda n: masks.causal_mask(n)),
    (check.padding_mask, lambda lengths, n: masks.padding_mask(lengths, n)),
    (check.masked_softmax, lambda s, m: attention.softmax(s.masked_fill(~m, float("-inf")))),
    # torch's softmax with nan_to_num gives the right numbers without the exercise
    (check.masked_softmax, lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), -1)
     .nan_to_num(0.0)),
]


@pytest.mark.parametrize("wrong,words", [
    (lambda n: torch.ones(n, n).tril(), "return a boolean tensor"),
    (lambda n: torch.ones(n, n + 1).tril().bool(), "shape"),
    (lambda n: torch.eye(n).bool() | torch.ones(n, n).tril(-2).bool(), "not lower-triangular"),
])
def test_wrong_causal(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.causal_mask(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda lengths, n: padding_ok(lengths, n)[:, 0, :], "add a middle axis"),
    (lambda lengths, n: padding_ok(lengths, n).float(), "return a boolean tensor"),
    (lambda lengths, n: (torch.arange(n)[None, :] <= torch.tensor(lengths)[:, None])[:, None, :],
     "wrong keys"),
])
def test_wrong_padding(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.padding_mask(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda m: (~m).float() * float("-inf"), "NaN"),
    (lambda m: torch.zeros(m.shape).masked_fill(m, float("-inf")),
     "0 where the boolean mask is False"),
    (lambda m: torch.zeros(m.shape).masked_fill(~m, -1e9), "not -inf"),
    (lambda m: m.long(), "dtype"),
    (lambda m: additive_ok(m)[..., :-1], "shape"),
])
def test_wrong_additive(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.to_additive(wrong)


def exp_softmax(s):
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("wrong,words", [
    (lambda s, m: exp_softmax(s.masked_fill(~m, float("-inf"))), "fully masked row"),
    (lambda s, m: exp_softmax(s) * m, "differs"),
    (lambda s, m: exp_softmax(s.masked_fill(~m, -1e9)), "all-zero weights"),
    (lambda s, m: exp_softmax(s), "non-zero weight"),
    (lambda s, m: masked_softmax_ok(s, m)[..., 0], "shape"),
])
def test_wrong_masked_softmax(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.masked_softmax(wrong)


def causal_attention_ok(q, k, v):
    n = q.shape[-2]
    blocked = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(blocked, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ v, w


def causal_attention_diagonal(diagonal):
    def attend(q, k, v):
        n = q.shape[-2]
        blocked = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=diagonal)
        s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(blocked, float("-inf"))
        w = torch.softmax(s, -1)
        return w @ v, w
    return attend


def test_causal_attention_passes_and_is_in_the_generic_lists(capsys):
    check.causal_attention(causal_attention_ok)
    check.causal_attention(lambda q, k, v: causal_attention_ok(q.float(), k.float(), v.float()))
    assert capsys.readouterr().out.count("✔") == 2


@pytest.mark.parametrize("wrong,words", [
    (causal_attention_diagonal(0), "hides each token from itself"),
    (lambda q, k, v: causal_attention_ok(q, k, v)[1], "should return a pair"),
    (lambda q, k, v: (causal_attention_ok(q, k, v)[0],
                      causal_attention_ok(q, k, v)[1].transpose(-2, -1)), "wrong way round"),
    (lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(q @ k.transpose(-2, -1), -1)),
     "differs"),
])
def test_wrong_causal_attention(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.causal_attention(wrong)


def _leaks(replace=False, dtype=torch.float64):
    s = check.soft_mask_scores().to(dtype)
    blocked = torch.triu(torch.ones(8, 8, dtype=torch.bool), diagonal=1)
    out = {}
    for m in (5, 10, 30):
        w = torch.softmax(s.masked_fill(blocked, -m) if replace else s - m * blocked, -1)
        rows = (w * blocked).sum(-1)
        out[m] = rows.mean().item()
    return out


def test_soft_mask_measurement(capsys):
    check.soft_mask_experiment(_leaks())
    check.soft_mask_experiment(_leaks(dtype=torch.float32))
    assert capsys.readouterr().out.count("dwarfs the spread") == 2


@pytest.mark.parametrize("wrong,words", [
    (None, "is None"),
    ({5: 0.0, 10: 0.0, 30: 0.0}, "did you mask with -inf"),
    (_leaks(replace=True), "subtract 5 from"),
    ({5: 0.5, 10: 0.2, 30: 0.1}, "too large"),
    ({5: 0.2, 10: 0.01}, "no entry for 30"),
])
def test_wrong_soft_mask_measurements(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.soft_mask_experiment(wrong)
