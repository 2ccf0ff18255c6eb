"""Chapter 01's checkers pass right answers and turn every kind of wrong answer into feedback."""

import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib import lookup
from course_lib.checks import CheckFailure
from course_lib.checks import ch01 as check


def scores_ok(query, keys):
    return -((keys - query) ** 2).sum(-1)


def log_softmax_ok(scores, temperature=1.0):
    z = scores / temperature
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def softmax_ok(scores, temperature=1.0):
    return np.exp(log_softmax_ok(scores, temperature))


def lookup_ok(query, keys, values, temperature=1.0):
    w = softmax_ok(scores_ok(query, keys), temperature)
    return w @ values, w


def gradient_ok(query, keys, values, temperature=1.0):
    q = torch.tensor(query, requires_grad=True)
    value = torch.softmax(torch.tensor(keys) @ q / temperature, 0) @ torch.tensor(values)
    value.backward()
    return q.grad


def many_ok(queries, keys, values, temperature=1.0):
    scores = queries @ keys.T / temperature
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    w = e / e.sum(axis=1, keepdims=True)
    return w @ values, w


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.lookup_many, many_ok),
    (check.lookup_many, lambda qs, k, v, t=1.0: (
        torch.softmax(torch.tensor(qs @ k.T / t), -1) @ torch.tensor(v),
        torch.softmax(torch.tensor(qs @ k.T / t), -1))),
    (check.similarity_scores, scores_ok),
    (check.log_softmax_weights, log_softmax_ok),
    (check.soft_lookup, lookup_ok),
    (check.query_gradient, gradient_ok),
    (check.similarity_scores, lambda q, k: -torch.cdist(torch.tensor(k), torch.tensor(q)[None])
     .squeeze(1) ** 2),
    (check.log_softmax_weights, lambda s, t=1.0: (  # in torch, by hand
        lambda x: x - x.max() - torch.log(torch.exp(x - x.max()).sum()))(torch.tensor(s) / t)),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.similarity_scores.hints[0]),
]


# (check, malformed prediction or wrong why, words its feedback must hold): test_checks_generic
PREDICTION_MISTAKES = [
    (check.temperature_prediction, 42, "should be a dict"),
    (check.temperature_prediction, {"cold": 10.0}, "no entry for 'hot'"),
    (check.temperature_prediction, {"cold": 10.0, "hot": float("nan")}, "one finite number"),
    (check.temperature_prediction, {"cold": 10.0, "hot": "25"}, "should be a number, got a str"),
    (check.temperature_why, "a", "drops no key"),
    (check.temperature_why, "b", "nothing overflows"),
    (check.temperature_why, "z", "should be one of"),
    (check.temperature_why, None, "is None"),
]

# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.lookup_many, lambda qs, k, v, t=1.0: tuple(map(np.stack, zip(
        *(lookup.soft_lookup(q, k, v, t) for q in qs))))),
    (check.soft_lookup, lambda q, k, v, t=1.0: lookup.soft_lookup(q, k, v, t)),
]


@pytest.mark.parametrize("wrong,words", [
    (lambda q, k: np.outer(k @ q, k @ q), "expected one score per key"),
    (lambda q, k: np.full(k.shape[0], np.nan), "NaN"),
    (lambda q, k: k.T @ k, "shape"),
])
def test_wrong_scores(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.similarity_scores(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda s, t=1.0: np.log(np.exp(s / t) / np.exp(s / t).sum()), "NaN/inf|-inf"),
    (lambda s, t=1.0: np.log(softmax_ok(s, t)) if False else np.log(np.exp(
        s / t - (s / t).max()) / np.exp(s / t - (s / t).max()).sum()), "gives -inf"),
    (lambda s, t=1.0: s / t - (s / t).max(), "not 1"),
    (lambda s, t=1.0: log_softmax_ok(s, 1.0), "temperature"),
    (lambda s, t=1.0: log_softmax_ok(s, t)[:-1], "shape"),
    (lambda s, t=1.0: torch.log_softmax(torch.tensor(s) / t, 0), "which this exercise rules out"),
    (lambda s, t=1.0: (lambda x: x - torch.logsumexp(x, 0))(torch.tensor(s) / t),
     "which this exercise rules out"),
])
def test_wrong_log_softmax(wrong, words):
    with np.errstate(all="ignore"), pytest.raises(CheckFailure, match=words):
        check.log_softmax_weights(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda q, k, v, t=1.0: softmax_ok(scores_ok(q, k), t) @ v, "should return a pair"),
    (lambda q, k, v, t=1.0: (v.mean(0), softmax_ok(scores_ok(q, k), t)), "blended value"),
    (lambda q, k, v, t=1.0: (v[0], log_softmax_ok(scores_ok(q, k), t)), "log-weights"),
    (lambda q, k, v, t=1.0: (1, 2, 3), "length 3"),
])
def test_wrong_lookup(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.soft_lookup(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda q, k, v, t=1.0: torch.zeros(len(q)), "all zeros"),
    (lambda q, k, v, t=1.0: torch.tensor(1.0), "single number"),
    (lambda q, k, v, t=1.0: -gradient_ok(q, k, v, t), "differs"),
])
def test_wrong_gradient(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.query_gradient(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda qs, k, v, t=1.0: (lambda e: (e / e.sum(axis=1) @ v, e / e.sum(axis=1)))(
        np.exp(qs @ k.T / t)), "wrong axis|broadcast"),
    (lambda qs, k, v, t=1.0: (lambda e: (e @ v, e))(np.exp(qs @ k.T / t)), "not 1"),
    (lambda qs, k, v, t=1.0: many_ok(qs, k, v, t)[1], "should return a pair"),
    (lambda qs, k, v, t=1.0: (many_ok(qs, k, v, t)[0], many_ok(qs, k, v, t)[1].T), "shape"),
])
def test_wrong_lookup_many(wrong, words):
    with pytest.raises(CheckFailure) as info:
        check.lookup_many(wrong)
    assert any(w in str(info.value) for w in words.split("|")), str(info.value)


def test_a_global_max_fails_on_rows_of_different_scale():
    def global_max(qs, k, v, t=1.0):  # the axis fixed, the shift not
        scores = qs @ k.T / t
        e = np.exp(scores - scores.max())
        w = e / e.sum(axis=1, keepdims=True)
        return w @ v, w
    with np.errstate(all="ignore"), pytest.raises(CheckFailure, match="its own largest score"):
        check.lookup_many(global_max)


def test_a_prediction_is_committed_once_and_then_revealed(capsys):
    from course_lib.checks import _predict
    _predict.forget()
    with pytest.raises(CheckFailure, match="is None: write your numbers"):
        check.temperature_prediction(None)            # not a commit: nothing recorded
    assert "Recorded" not in capsys.readouterr().out
    check.temperature_prediction({"cold": 40.0, "hot": 10.0})  # wrong, but committed: passes
    out = capsys.readouterr().out
    assert out.index("📌 Recorded") < out.index("The run:") and "24.85" in out
    check.temperature_prediction({"cold": 10.0, "hot": 25.0})  # an edit after the reveal
    assert "{'cold': 40.0, 'hot': 10.0}" in capsys.readouterr().out
    _predict.forget()
