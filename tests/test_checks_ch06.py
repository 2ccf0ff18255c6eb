"""Chapter 06's checkers pass right answers and turn every kind of wrong answer into feedback."""

import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib import recurrent
from course_lib.checks import CheckFailure
from course_lib.checks import ch06 as check
from course_lib.checks._predict import forget


def step_ok(x_t, h, W_xh, W_hh, b, alive=None):
    new = torch.tanh(x_t @ W_xh.T + h @ W_hh.T + b)
    return new if alive is None else torch.where(alive[:, None], new, h)


run_ok = check.run_rnn.reference


def grad_ok(f, x):
    J = torch.autograd.functional.jacobian(lambda t: f(t)[0, -1], x)
    return J.pow(2).sum(dim=(0, 1, 3)).sqrt()


def memory_ok(n, d, layers):
    return d * layers, 2 * n * d * layers


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.rnn_step, step_ok),
    (check.run_rnn, run_ok),
    (check.gradient_vs_distance, grad_ok),
    (check.memory_numbers, memory_ok),
    (check.rnn_step, lambda *a: step_ok(*a).numpy()),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.rnn_step.hints[0]),
]


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.rnn_step, lambda x_t, h, W_xh, W_hh, b, alive=None: recurrent.rnn_step(x_t, h, W_xh,
                                                                                  W_hh, b)),
    (check.run_rnn, lambda x, W_xh, W_hh, b: _torch_rnn(x, W_hh.shape[0])),
    (check.gradient_vs_distance, lambda f, x: recurrent.gradient_vs_distance(f, x)),
]


def _torch_rnn(x, d_hidden):
    rnn = torch.nn.RNN(x.shape[-1], d_hidden, batch_first=True).double()
    outputs, h_last = rnn(x)
    return outputs, h_last[0]


@pytest.mark.parametrize("wrong,words", [
    (lambda x, h, Wx, Wh, b: torch.tanh(x @ Wx.T + h @ Wh + b), "differs|untransposed"),
    (lambda x, h, Wx, Wh, b: step_ok(x, h, Wx, Wh, b)[0], "shape"),
    (lambda x, h, Wx, Wh, b: step_ok(x, h, Wx, Wh, b) * float("nan"), "NaN"),
    (lambda x, h, Wx, Wh, b: step_ok(x, h, Wx, Wh, b), "raised TypeError"),  # no alive argument
])
def test_wrong_rnn_step(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.rnn_step(wrong)


def run_time_major(x, W_xh, W_hh, b):
    out, h = run_ok(x, W_xh, W_hh, b)
    return out.transpose(0, 1), h


@pytest.mark.parametrize("wrong,words", [
    (lambda *a: run_ok(*a)[0], "should return a pair"),
    (run_time_major, "dim=1|shape"),
    (lambda *a: (run_ok(*a)[0], run_ok(*a)[0][:, 0]), "h_last"),
])
def test_wrong_run_rnn(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.run_rnn(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda f, x: grad_ok(f, x)[:-1], "shape"),
    (lambda f, x: grad_ok(f, x) ** 2, "differs"),
    (lambda f, x: np.zeros(x.shape[1]), "differs"),
])
def test_wrong_gradient_vs_distance(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.gradient_vs_distance(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda n, d, L: (n * d, 2 * n * d * L), "does not depend on n"),
    (lambda n, d, L: (d * L, 2 * n * d), "attention keeps"),
    (lambda n, d, L: ("a", "b"), "two whole numbers"),
    (lambda n, d, L: 2 * n * d * L, "should return a pair"),
])
def test_wrong_memory_numbers(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.memory_numbers(wrong)


def test_memory_ratio_prediction_and_far_gradient_measurement(capsys):
    assert check.book_ratio() == 2048
    forget()
    check.predicted_ratio(200_000)  # the lecture's answer: committed, and the gap is shown
    out = capsys.readouterr().out
    assert "Recorded" in out and "97.7 times too high" in out
    check.predicted_ratio(2048)     # a later edit changes nothing: the first commit counts
    assert "you predicted 200,000x" in capsys.readouterr().out
    forget()
    check.predicted_ratio(2048)
    check.ratio_why("a")
    check.far_prediction("none")
    far = check.measured_far()
    assert 0.1 < far < 10 and check.measured_far(1.0) < 1e-6  # no longer fading
    check.rnn_far(far * 1.01)
    check.rnn_far(torch.tensor(far))
    assert capsys.readouterr().out.count("✔") == 5
    forget()


@pytest.mark.parametrize("checker, got, words", [
    (check.ratio_why, "b", "the width cancels"),
    (check.ratio_why, "c", "ONE layer"),
    (check.ratio_why, "z", "should be one of"),
    (check.far_prediction, "maybe", "should be one of"),
    (check.far_prediction, None, "None"),
    (check.predicted_ratio, None, "None"),
    (check.predicted_ratio, "2n", "should be a number"),
    (check.rnn_far, 1e-3, "smaller than the check's measurement"),
    (check.rnn_far, 5.0, "larger than the check's measurement"),
    (check.rnn_far, float("nan"), "finite"),
    (check.rnn_far, None, "None"),
])
def test_ch06_wrong_values_are_explained(checker, got, words):
    forget()
    with pytest.raises(CheckFailure, match=words) as info:
        checker(got)
    if checker is check.rnn_far:  # direction only, never the measured value
        assert f"{check.measured_far():.2g}" not in str(info.value)
