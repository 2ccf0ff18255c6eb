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


def measured_ok(seed=0, scale=False, std=False):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for d in (16, 256):
        s = torch.randn(300, d, generator=g) @ torch.randn(300, d, generator=g).T
        s = s / math.sqrt(d) if scale else s
        out[d] = (s.std() if std else s.var()).item()
    return out


def entropy_ok(w):
    return -torch.xlogy(w, w).sum(-1)


def jacobian_ok(s):
    p = torch.softmax(s, -1)
    return torch.diag(p) - torch.outer(p, p)


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.predicted_variance, predicted_ok),
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


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_any_honest_variance_measurement_passes(seed, capsys):
    check.measured_variance(measured_ok(seed))
    assert "grows like d_k" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,words", [
    (None, "is None"),
    ({16: 16.0, 256: 256.0}, "not a measurement"),
    (measured_ok(std=True), "standard deviation"),
    (measured_ok(scale=True), "scaled scores"),
    ({16: 30.0, 256: 250.0}, "a correct run gives about 16"),
    ({16: 16.2}, "no entry for 256"),
    ("16", "should be a dict"),
])
def test_wrong_variance_measurements(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.measured_variance(wrong)


def test_entropy_prediction_and_its_run(capsys):
    run = check.entropy_experiment()
    assert 0 < run["unscaled"] < 0.3 < 1.2 < run["scaled"] < math.log(6)
    check.entropy_prediction({"unscaled": 0.0, "scaled": math.log(6) - 0.1})
    assert capsys.readouterr().out.startswith("✔")


@pytest.mark.parametrize("wrong,words", [
    (None, "is None"),
    ({"unscaled": 1.7, "scaled": 1.5}, "nearly one-hot"),
    ({"unscaled": 0.1, "scaled": 0.1}, "standard\\s+deviation 1|stay spread"),
    ({"unscaled": -1.0, "scaled": 1.5}, "impossible"),
    ({"unscaled": 0.1, "scaled": 5.0}, "impossible"),
    ({"unscaled": float("inf"), "scaled": 1.5}, "finite"),
])
def test_wrong_entropy_predictions_are_explained(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.entropy_prediction(wrong)
