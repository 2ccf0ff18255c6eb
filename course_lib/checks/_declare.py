"""How a chapter declares its checks: once, on the judge, with the rest following from names.

    @function_check(1, args=("query", "keys"), grade="scores", cases=_scores_cases)
    def similarity_scores(cases, outcomes): ...   # -> a Check, ch01.similarity_scores

The id (f"{chapter}.{name}"), the grade id (f"{chapter}_{grade or name}_test"), the hint tiers
(the check's section of `hints/<chapter>.md`) and the last tier (the exercise in the chapter's
solution notebook) follow from the judge's name and module. Predictions and explanations are
declared the same way in `_predict` (`commit_check`, `choice_check`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from course_lib.checks._check import Check
from course_lib.checks._core import call
from course_lib.checks._hints import chapter_hints
from course_lib.checks._mistakes import Mistake

Judge = Callable[[list, list], str]


def chapter_of(module_name: str) -> str:
    """The chapter a checker module belongs to: 'course_lib.checks.ch05' -> 'ch05', and a
    module of chapter 08's package, 'course_lib.checks.ch08.kernels', -> 'ch08'."""
    m = re.match(r"course_lib\.checks\.(ch\d+)(?!\d)", module_name)
    if m is None:
        raise ValueError(f"{module_name} is not a chapter's checker module")
    return m.group(1)


def _declared(name: str, exercise: int, judge: Callable, grade: str | None,
              hints: tuple[str, ...] | None) -> dict:
    """What a chapter's check declares once, spelt out: its id, grade ids and hint tiers.

    The chapter is the judge's module's; the hints are the check's section of
    `hints/<chapter>.md` unless given, and the last tier points to the chapter's SOLUTION
    notebook (the chapter module's, or its package's).
    """
    chapter = chapter_of(judge.__module__)
    module = sys.modules[judge.__module__]
    solution = getattr(module, "SOLUTION", None) or sys.modules[
        f"course_lib.checks.{chapter}"].SOLUTION
    if hints is None:
        hints = chapter_hints(chapter).get(name)
        if not hints:
            raise ValueError(f"course_lib/checks/hints/{chapter}.md has no section ## {name}")
    return {"id": f"{chapter}.{name}", "grade_ids": (f"{chapter}_{grade or name}_test",),
            "hints": (*hints, f"The worked answer is exercise {exercise} of {solution}.")}


def function_check(exercise: int, *, cases: Callable[[int, bool], list],
                   args: tuple[str, ...] | None = None, run: Callable[..., Any] | None = None,
                   grade: str | None = None, forbid: tuple = (),
                   hints: tuple[str, ...] | None = None, memory_mb: float | None = None,
                   memory_note: str = "", reference: Callable[..., Any] | None = None,
                   mistakes: tuple[Mistake, ...] = ()) -> Callable[[Judge], Check]:
    """A build or debug check, declared on its judge: the learner writes the function the
    judge is named after, and the check calls it on every case.

    `run` defaults to calling the learner's function on the case's entries `args` in order
    (args=None: on the case itself). `memory_mb` / `memory_note`: see `Check` (grading measures
    the kernel's memory from outside). `reference` / `mistakes`: the right answer and the named
    wrong ones, as functions with the learner's signature (`_mistakes`; the judge calls
    `named_mistake` where they are judged).
    """
    def declare(judge: Judge) -> Check:
        name = judge.__name__
        runner = run
        if runner is None:
            def runner(fn, case):
                inputs = (case,) if args is None else tuple(case[a] for a in args)
                return call(fn, *inputs, name=name)
        return Check(cases=cases, run=runner, judge=judge, forbid=forbid, memory_mb=memory_mb,
                     memory_note=memory_note, reference=reference, mistakes=mistakes,
                     **_declared(name, exercise, judge, grade, hints))
    return declare


def _one_value(seed: int, hidden: bool) -> list:
    return [None]  # a committed value is judged once: there are no inputs to vary


def _the_value(*values_and_case: Any) -> Any:
    # the kernel's whole part: hand back what the learner committed (a tuple if several)
    values = values_and_case[:-1]
    return values[0] if len(values) == 1 else values


def value_check(exercise: int, *, grade: str | None = None, forbid: tuple = (),
                hints: tuple[str, ...] | None = None,
                reference: Callable[[], Any] | None = None,
                mistakes: tuple[Mistake, ...] = ()) -> Callable[[Judge], Check]:
    """A predict or experiment check: the learner commits a value (a prediction, a measured
    number; or several, `check.window_reach(reach, beyond)`, judged as one tuple) and the judge
    compares it with the grader's own run; nothing of the learner's is called. Declared on its
    judge like `function_check`; a `reference` or mistake `variant` here takes no argument and
    returns the value."""
    def declare(judge: Judge) -> Check:
        return Check(cases=_one_value, run=_the_value, judge=judge, forbid=forbid,
                     reference=reference, mistakes=mistakes, takes_value=True,
                     **_declared(judge.__name__, exercise, judge, grade, hints))
    return declare
