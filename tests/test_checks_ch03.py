"""Chapter 03's checkers pass right answers and turn every kind of wrong answer into feedback."""

import math

import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib.checks import CheckFailure
from course_lib.checks import ch03 as check


def predicted_ok(d_k, sigma_q, sigma_k, scaled):
    return sigma_q ** 2 * sigma_k ** 2 * (1.0 if scaled else float(d_k))


def measure_ok(seed, scale=False):
    g = torch.Generator().manual_seed(seed)
    s = (2.0 * torch.randn(300, 64, generator=g)) @ (1.5 * torch.randn(300, 64, generator=g)).T
    s = s / 8 if scale else s
    return s.var().item()


def entropy_ok(w):
    return -torch.xlogy(w, w).sum(-1)


def jacobian_ok(s, t):
    p = torch.softmax(s / t, -1)
    return (torch.diag(p) - torch.outer(p, p)) / t


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.predicted_variance, predicted_ok),
    (check.entropy, entropy_ok),
    (check.softmax_jacobian, jacobian_ok),
    (check.entropy, lambda w: -np.where(w.numpy() > 0,
                                        w.numpy() * np.log(np.where(w.numpy() > 0, w.numpy(), 1)),
                                        0).sum(-1)),
    (check.predicted_variance, lambda d, a, b, s: np.float64((a * b) ** 2 * (1 if s else d))),
    (check.measured_variance, measure_ok),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.predicted_variance.hints[0]),
    (lambda *a: float("nan"), "not a finite number|shape"),
    (lambda *a: np.zeros((2, 3)), "one number|shape"),
]


# (check, malformed prediction or wrong why, words its feedback must hold): test_checks_generic
PREDICTION_MISTAKES = [
    (check.entropy_prediction, None, "is None"),
    (check.entropy_prediction, {"unscaled": -1.0, "scaled": 1.5}, "impossible"),
    (check.entropy_prediction, {"unscaled": 0.1, "scaled": 5.0}, "impossible"),
    (check.entropy_prediction, {"unscaled": float("inf"), "scaled": 1.5}, "finite"),
    (check.entropy_why, "a", "do not average far above zero"),
    (check.entropy_why, "c", "does not come from the number of keys"),
]

# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.softmax_jacobian,
     lambda s, t: torch.autograd.functional.jacobian(lambda x: torch.softmax(x / t, -1), s)),
]


@pytest.mark.parametrize("wrong,words", [
    (lambda d, a, b, s: 3.0 * d, "not the variance"),
])
def test_wrong_prediction(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.predicted_variance(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda w: -(w * w.log()).sum(-1), "0 · log 0"),
    (lambda w: -torch.xlogy(w, w).sum(), "shape"),
    (lambda w: -torch.xlogy(w, w).sum(-1) + 0.1, "differs"),
])
def test_wrong_entropy(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.entropy(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda s, t: jacobian_ok(s, t).diagonal(), "shape"),
    (lambda s, t: jacobian_ok(s, t).T * 2, "differs"),
])
def test_wrong_jacobian(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.softmax_jacobian(wrong)


@pytest.mark.parametrize("seed", [0, 12345])
def test_an_honest_measure_passes_on_hidden_seeds(seed):
    from course_lib.checks._kernel import run_cases
    cases = check.measured_variance.cases(seed, True)
    assert len(cases) == 5
    check.measured_variance.judge(cases, run_cases(check.measured_variance, (measure_ok,), cases))


@pytest.mark.parametrize("wrong,words", [
    (lambda seed: 570.0, "same number for different seeds"),
    (lambda seed: measure_ok(seed, scale=True), "too small"),
    (lambda seed: 2 * measure_ok(seed), "too large"),
])
def test_wrong_measurements_get_a_direction_never_the_number(wrong, words):
    with pytest.raises(CheckFailure, match=words) as info:
        check.measured_variance(wrong)
    assert "576" not in str(info.value).replace("576.0", "")


def test_entropy_prediction_is_committed_whatever_it_says(capsys):
    from course_lib.checks import _predict
    run = check.entropy_experiment()
    assert 0.3 < run["unscaled"] < 1.0 < 3.0 < run["scaled"] < math.log(64)
    for guess in ({"unscaled": 0.0, "scaled": math.log(64)}, {"unscaled": 4.0, "scaled": 0.1}):
        _predict.forget()
        check.entropy_prediction(guess)
        out = capsys.readouterr().out
        assert out.index("📌 Recorded") < out.index("The run:")
    _predict.forget()
