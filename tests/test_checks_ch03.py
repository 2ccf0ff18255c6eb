"""Chapter 03's checkers pass right answers and turn every kind of wrong answer into feedback."""

import math

import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib.checks import CheckFailure
from course_lib.checks import ch03 as check


def predicted_ok(d_k, scaled):
    return 1.0 if scaled else float(d_k)


def variance_ok(d_k, scaled=False, n_samples=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_samples, d_k, generator=g)
    k = torch.randn(n_samples, d_k, generator=g)
    s = (q * k).sum(-1)
    if scaled:
        s = s / math.sqrt(d_k)
    return s.var().item()


def entropy_ok(w):
    return -torch.xlogy(w, w).sum(-1)


def jacobian_ok(s):
    p = torch.softmax(s, -1)
    return torch.diag(p) - torch.outer(p, p)


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.predicted_variance, predicted_ok),
    (check.score_variance, variance_ok),
    (check.entropy, entropy_ok),
    (check.softmax_jacobian, jacobian_ok),
    (check.entropy, lambda w: -np.where(w.numpy() > 0,
                                        w.numpy() * np.log(np.where(w.numpy() > 0, w.numpy(), 1)),
                                        0).sum(-1)),
    (check.predicted_variance, lambda d, s: np.float32(1 if s else d)),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.predicted_variance.hints[0]),
    (lambda *a: float("nan"), "not a finite number|shape"),
    (lambda *a: np.zeros((2, 3)), "one number|shape"),
]


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "calls the course's own" feedback, not a pass.
REFERENCE_CALLS = [
    (check.softmax_jacobian,
     lambda s: torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s)),
]


@pytest.mark.parametrize("wrong,words", [
    (lambda d, s: math.sqrt(d), "standard deviation"),
    (lambda d, s: float(d), "still predict"),
    (lambda d, s: 2.0 * d, "expected"),
])
def test_wrong_prediction(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.predicted_variance(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda d, scaled=False, n=20000, seed=0: predicted_ok(d, scaled),
     "same number for two different seeds"),
    (lambda d, scaled=False, n=20000, seed=0: math.sqrt(variance_ok(d, scaled, n, seed)),
     "standard deviation"),
    (lambda d, scaled=False, n=20000, seed=0: variance_ok(d, False, n, seed),
     "with scaled=True divide"),
    (lambda d, scaled=False, n=20000, seed=0: variance_ok(d, True, n, seed),
     "with scaled=False do not"),
    (lambda d, scaled=False, n=20000, seed=0: 3 * variance_ok(d, scaled, n, seed), "within 12%"),
])
def test_wrong_measurement(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.score_variance(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda w: -(w * w.log()).sum(-1), "0 · log 0"),
    (lambda w: torch.xlogy(w, w).sum(-1), "negative"),
    (lambda w: -torch.xlogy(w, w).sum(-1) / math.log(2), "bits"),
    (lambda w: -torch.xlogy(w, w).sum(), "shape"),
    (lambda w: -torch.xlogy(w, w).sum(-1) + 0.1, "differs"),
])
def test_wrong_entropy(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.entropy(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda s: -torch.outer(torch.softmax(s, -1), torch.softmax(s, -1)), "only the -p_i p_j"),
    (lambda s: torch.diag(torch.softmax(s, -1)), "only the diagonal"),
    (lambda s: jacobian_ok(s).diagonal(), "shape"),
    (lambda s: jacobian_ok(s).T * 2, "differs"),
])
def test_wrong_jacobian(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.softmax_jacobian(wrong)
