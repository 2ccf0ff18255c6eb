"""Every chapter's checkers pass its right answers, turn every generic wrong answer (None, a
number, a blank exercise, a crash, no return, text) into feedback instead of crashing, and refuse
answers that call the course's own implementation.

The lists live beside each chapter's own cases, as CORRECT, GENERIC_WRONG and REFERENCE_CALLS in
tests/test_checks_chNN.py; this one module runs them all.
"""

import importlib

import pytest
from checker_cases import assert_feedback

from course_lib.checks import Check, CheckFailure
from course_lib.checks._data import decode, encode
from course_lib.checks._kernel import run_cases
from course_lib.checks._registry import all_checks, chapters

# every chapter the registry finds (course_lib/checks/chNN) defines these lists in its own
# tests/test_checks_chNN.py: a new chapter joins by writing that file, nothing here
CHAPTERS = {chapter: importlib.import_module(f"test_checks_{chapter}") for chapter in chapters()}

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
    from course_lib.checks._registry import all_checks

    choices = [(c.id, _predict.COMMITTING[c.id]) for c in all_checks()
               if _predict.COMMITTING.get(c.id, {}).get("kind") == "choice"]
    assert len(choices) >= 9
    for check_id, info in choices:
        texts, right = _predict.choice_texts(check_id, info["letters"])
        assert right in texts and all(texts.values()), check_id


# ---------------------------------------------------------------- named mistakes, as data

MISTAKES = [
    pytest.param(check, i, id=f"{check.id}-{i}")
    for check in all_checks() for i in range(len(check.mistakes))
]


def _as_answer(check, fn):
    """What a learner hands the check: the function itself, or for a value check its value."""
    return fn() if check.takes_value else fn


@pytest.mark.parametrize("check, i", MISTAKES)
def test_every_declared_mistake_is_named_when_its_wrong_answer_is_handed_in(check, i):
    """Each named mistake is declared once, as its wrong answer (course_lib/checks/_mistakes):
    handed in, that answer fails and its own message comes out, so no recogniser is dead."""
    mistake = check.mistakes[i]
    with pytest.raises(CheckFailure) as info:
        check(_as_answer(check, mistake.variant))
    assert mistake.words().search(str(info.value)), (
        f"{check.id}'s mistake {i} did not name itself; the feedback was:\n{info.value}")


@pytest.mark.parametrize("check", [c for c in all_checks() if c.mistakes], ids=lambda c: c.id)
def test_the_reference_the_mistakes_are_judged_against_passes(check, capsys):
    check(_as_answer(check, check.reference))
    assert capsys.readouterr().out.startswith("✔")


def test_the_chapters_declare_their_named_mistakes():
    assert len(MISTAKES) >= 8


@pytest.mark.parametrize("check, i", [p for p in MISTAKES if not p.values[0].takes_value])
def test_every_declared_mistake_is_named_on_the_graders_hidden_cases(check, i):
    """What `course grade` does with the same wrong answer: a fresh seed, hidden cases, the
    judge in the grader's process."""
    cases = check.cases(5, True)
    outcomes = run_cases(check, (check.mistakes[i].variant,), decode(encode(cases)))
    with pytest.raises(CheckFailure) as info:
        check.judge(cases, outcomes)
    assert check.mistakes[i].words().search(str(info.value)), str(info.value)
