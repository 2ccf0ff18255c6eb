"""Wrong answers every chapter's checkers must survive: built here, listed in each
tests/test_checks_chNN.py, run by tests/test_checks_generic.py."""

import pytest

from course_lib.checks import CheckFailure


def explodes(*args):
    """A learner function that crashes with an unrelated error."""
    return {}["missing"]


def not_implemented(hint: str):
    """A learner function still holding the exercise's `raise NotImplementedError(hint)`."""
    def blank(*args):
        raise NotImplementedError(hint)
    return blank


def generic_wrong_answers(hint: str) -> list:
    """(answer, words the feedback must contain; alternatives separated by |)."""
    return [
        (None, "None"),
        (42, "should be a function"),
        (not_implemented(hint), f"not written yet. Hint: {hint}"),
        (explodes, "raised KeyError"),
        (lambda *a: None, "forget to `return`|should return a pair|None"),
        (lambda *a: "text",
         "should be a tensor|should return a pair|should return a triple|could not be read"),
        (lambda *a: object(), "returned a object, which a check cannot read"),
    ]


def assert_feedback(checker, wrong, words: str) -> None:
    """The checker rejects `wrong` with a CheckFailure whose message has one of `words`."""
    with pytest.raises(CheckFailure) as info:
        checker(wrong)
    assert any(w in str(info.value) for w in words.split("|")), str(info.value)
