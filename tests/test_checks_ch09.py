"""Chapter 09's checkers pass right answers, name the planted and the usual mistakes, and turn
every generic wrong answer into feedback."""

import math

import nbformat
import pytest
import torch
from checker_cases import assert_feedback, generic_wrong_answers

from course_lib.attention import grouped_query_attention as course_gqa
from course_lib.checks import CheckFailure
from course_lib.checks import ch09 as check
from course_lib.checks._predict import forget
from course_lib.linear_attention import feature_map, linear_attention_recurrent
from course_tools.exercises import hints as notebook_hints


def _softmax_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1) @ v


def gqa_ok(q, k, v):
    r = q.shape[1] // k.shape[1]
    return _softmax_attention(q, k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1))


def gqa_kv_heads_out(q, k, v):           # returns one output per KV head
    return _softmax_attention(q[:, :k.shape[1]], k, v)


def _recurrence(q, k, v, read_first=False):
    fq, fk = feature_map(q), feature_map(k)
    state = torch.zeros(q.shape[1], v.shape[1], dtype=q.dtype)
    z = torch.zeros(q.shape[1], dtype=q.dtype)
    outs = []
    for i in range(q.shape[0]):
        if read_first:
            outs.append((fq[i] @ state) / (fq[i] @ z))
        state = state + torch.outer(fk[i], v[i])
        z = z + fk[i]
        if not read_first:
            outs.append((fq[i] @ state) / (fq[i] @ z))
    return torch.stack(outs)


def recurrence_ok(q, k, v):
    return _recurrence(q, k, v)


# CORRECT, GENERIC_WRONG and REFERENCE_CALLS are run by tests/test_checks_generic.py
CORRECT = [
    (check.grouped_query_attention, gqa_ok),
    (check.grouped_query_attention, lambda q, k, v: (gqa_ok(q, k, v), None)),
    (check.linear_recurrence, recurrence_ok),
    (check.linear_recurrence, lambda q, k, v: recurrence_ok(q, k, v).numpy()),
]
GENERIC_WRONG = generic_wrong_answers("think about it")
# (check, malformed prediction or wrong why, words its feedback must hold): test_checks_generic
PREDICTION_MISTAKES = [
    *((check.predicted_crossover, wrong, words) for wrong, words in [
        (None, "None"), ("6144", "positive number"), (-5, "positive number"),
        (math.nan, "positive number"), (True, "positive number")]),
    (check.crossover_why, "a", "once, not squared"),
    (check.crossover_why, "c", "head count cancels"),
]
REFERENCE_CALLS = [
    (check.grouped_query_attention, lambda q, k, v: course_gqa(q, k, v)[0]),
    (check.linear_recurrence, lambda q, k, v: linear_attention_recurrent(q, k, v)),
]


@pytest.mark.parametrize("wrong, words", [
    (gqa_kv_heads_out, "one output per QUERY head"),
    (lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True),
     "which this exercise rules out"),
])
def test_gqa_mistakes_are_named(wrong, words):
    assert_feedback(check.grouped_query_attention, wrong, words)


@pytest.mark.parametrize("wrong, words", [
    (lambda q, k, v: _recurrence(q, k, v, read_first=True), "first output row is NaN"),
    (lambda q, k, v: recurrence_ok(q, k, v)[:-1], "has shape"),
])
def test_recurrence_mistakes_are_named(wrong, words):
    assert_feedback(check.linear_recurrence, wrong, words)


def test_the_lecture_buggy_recurrence_is_caught():
    source = nbformat.read("solutions/09_paying_less.ipynb", as_version=4)
    given = next(c.source for c in source.cells if c.get("id") == "sol09-06")
    namespace = {"torch": torch, "feature_map": feature_map,
                 "linear_attention": lambda *a, **k: torch.zeros(3, 1)}
    exec(given.split("\n\ng = ")[0], namespace)
    assert_feedback(check.linear_recurrence, namespace["buggy_recurrence"], "NaN")


@pytest.mark.parametrize("prediction, words", [
    (6144, "within 10%"), (6000.0, "within 10%"), (4096, "1.5 times too low"),
    (1e6, "too high"),
])
def test_any_prediction_is_committed_then_the_count_shown(prediction, words, capsys):
    forget()
    check.predicted_crossover(prediction)
    out = capsys.readouterr().out
    assert "Recorded" in out and "n = 6144 tokens" in out and words in out
    forget()


def test_measured_reach_passes_and_another_curve_or_reach_does_not(capsys):
    curve = check.measured_curve()
    check.window_reach(4, dict(curve))
    assert capsys.readouterr().out.startswith("✔ window_reach")
    shifted = {k: (a + 0.1 if k == 7 else a) for k, a in curve.items()}
    assert_feedback(lambda v: check.window_reach(*v), (4, shifted), "at k = 7 your accuracy is "
                    "higher than the check's run")
    assert_feedback(lambda v: check.window_reach(*v), (5, dict(curve)),
                    "does not follow from your own curve")


@pytest.mark.parametrize("reach, acc, words", [
    (None, {}, "None"), (4.5, {}, "whole number"), ("4", {}, "whole number"),
    (4, 0.12, "should be the dict"), (4, {1: 1.0}, "every k from 1 to 24"),
])
def test_wrong_reach_is_explained(reach, acc, words):
    assert_feedback(lambda value: check.window_reach(*value), (reach, acc), words)


def test_hints_tier_one_names_the_idea_and_matches_the_notebook():
    source = nbformat.read("solutions/09_paying_less.ipynb", as_version=4)
    in_notebook = notebook_hints(source)
    for c in (check.grouped_query_attention, check.linear_recurrence, check.predicted_crossover,
              check.crossover_why, check.window_reach):
        assert len(c.hints) >= 3 and "solutions/09" in c.hints[-1]
        assert c.hints[0] in in_notebook
        code_like = ("(", "=", "@", "torch", "repeat")
        assert not any(token in c.hints[0] for token in code_like), c.hints[0]


def test_first_failure_appends_the_first_hint():
    from course_lib.checks import _check

    _check._FAILED.discard(check.window_reach.id)
    with pytest.raises(CheckFailure) as info:
        check.window_reach(4, None)
    assert check.window_reach.hints[0] in str(info.value)


@pytest.mark.parametrize("seed", [1, 7, 123])
def test_hidden_cases_pass_right_answers_for_any_seed(seed):
    pairs = ((check.grouped_query_attention, gqa_ok), (check.linear_recurrence, recurrence_ok))
    for c, fn in pairs:
        cases = c.cases(seed, True)
        outcomes = [{"ok": c.run(fn, case)} for case in cases]
        assert "equal" in c.judge(cases, outcomes)
