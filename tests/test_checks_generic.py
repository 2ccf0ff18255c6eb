"""Every chapter's checkers pass its right answers, turn every generic wrong answer (None, a
number, a blank exercise, a crash, no return, text) into feedback instead of crashing, and refuse
answers that call the course's own implementation.

The lists live beside each chapter's own cases, as CORRECT, GENERIC_WRONG and REFERENCE_CALLS in
tests/test_checks_chNN.py; this one module runs them all.
"""

import importlib

import pytest
from checker_cases import assert_feedback

from course_lib.checks import Check
from course_lib.checks._protocol import decode, encode, run_cases

# a new chapter joins by defining the lists in its tests/test_checks_chNN.py and adding it here
CHAPTERS = {chapter: importlib.import_module(f"test_checks_{chapter}")
            for chapter in ("ch01", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08",
                            "ch09", "ch10")}

RIGHT = [
    pytest.param(checker, answer, id=f"{chapter}-{checker.__name__}-{i}")
    for chapter, cases in CHAPTERS.items()
    for i, (checker, answer) in enumerate(cases.CORRECT)
]

WRONG = [
    pytest.param(checker, wrong, words, id=f"{chapter}-{checker.__name__}-{words}")
    for chapter, cases in CHAPTERS.items()
    for checker in dict.fromkeys(checker for checker, _ in cases.CORRECT)
    for wrong, words in cases.GENERIC_WRONG
]

PREDICTIONS = [
    pytest.param(checker, wrong, words, id=f"{chapter}-{checker.__name__}-{words}")
    for chapter, cases in CHAPTERS.items()
    for checker, wrong, words in getattr(cases, "PREDICTION_MISTAKES", [])
]

CHEATS = [
    pytest.param(checker, answer, id=f"{chapter}-{checker.__name__}-{i}")
    for chapter, cases in CHAPTERS.items()
    for i, (checker, answer) in enumerate(cases.REFERENCE_CALLS)
]


@pytest.mark.parametrize("checker, answer", RIGHT)
def test_right_answers_pass(checker, answer, capsys):
    checker(answer)
    assert capsys.readouterr().out.startswith("✔")


@pytest.mark.parametrize("checker, wrong, words", WRONG)
def test_generic_wrong_answers_give_feedback(checker, wrong, words):
    assert_feedback(checker, wrong, words)


@pytest.mark.parametrize("checker, wrong, words", PREDICTIONS)
def test_malformed_predictions_and_wrong_whys_are_named_and_the_first_answer_stands(
        checker, wrong, words):
    """A malformed prediction (or why) is no commit; a wrong letter names its misconception,
    and stays the answer: the right letter after it changes nothing."""
    from course_lib.checks import _predict

    _predict.forget()
    try:
        assert_feedback(checker, wrong, words)
        info = _predict.COMMITTING[checker.id]
        if checker.id in _predict._RECORDS:  # a well-formed letter, recorded, then judged
            assert info["kind"] == "choice"
            _, right = _predict.choice_texts(checker.id, info["letters"])
            assert_feedback(checker, right, words)
    finally:
        _predict.forget()


@pytest.mark.parametrize("checker, answer", CHEATS)
def test_calling_the_course_reference_earns_nothing(checker, answer):
    assert_feedback(checker, answer, "which this exercise rules out")


@pytest.mark.parametrize("seed", [1, 2**40 + 3])
@pytest.mark.parametrize("checker, answer", [p for p in RIGHT if isinstance(p.values[0], Check)])
def test_right_answers_pass_the_graders_hidden_cases_for_any_seed(checker, answer, seed):
    """What `course grade` does, in one process: fresh seed, hidden cases, judge at home."""
    cases = checker.cases(seed, True)
    assert len(cases) >= len(checker.cases(0, False))
    outcomes = run_cases(checker, (answer,), decode(encode(cases)))
    message = checker.judge(cases, outcomes)  # raises CheckFailure when the answer is judged wrong
    assert isinstance(message, str) and message


def test_every_choice_check_finds_its_letters_and_one_right_one_in_its_hints():
    """A why-choice's texts live in hints/chNN.md, read when judging: every chapter's parse."""
    from course_lib.checks import _predict
    from course_lib.checks._protocol import all_checks

    choices = [(c.id, _predict.COMMITTING[c.id]) for c in all_checks()
               if _predict.COMMITTING.get(c.id, {}).get("kind") == "choice"]
    assert len(choices) >= 9
    for check_id, info in choices:
        texts, right = _predict.choice_texts(check_id, info["letters"])
        assert right in texts and all(texts.values()), check_id
