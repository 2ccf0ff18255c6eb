"""The `Check`: one exercise's checker, declared once, run two ways.

A `Check` splits a checker into the parts that need the learner's code and the parts that must
not be in the learner's reach:

* `cases(seed, hidden)` makes the inputs (data only; never the expected answers);
* `run(*learner_objs, case)` applies the learner's function, class or value to ONE case and
  returns what it produced (the only part that runs in the learner's kernel when grading;
  `_kernel`);
* `judge(cases, outcomes)` computes the reference from the cases, compares, and returns a success
  message or raises `CheckFailure` naming the mistake (`_judging`, `_mistakes`).

In a notebook, `check.similarity_scores(similarity_scores)` runs all three in-process
(`Check.__call__`). `course grade` runs `cases` and `judge` in the grader's own process and only
`run` in the kernel, through `course_lib.checks._probe.probe`; the two meet in a file of data
that executes nothing when read (`_data`). How a chapter declares its checks is `_declare`;
finding one by name is `_registry`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course_lib.checks import _core
from course_lib.checks._core import CheckFailure
from course_lib.checks._data import decode, encode
from course_lib.checks._judging import _guarded, _reference_of
from course_lib.checks._kernel import run_cases
from course_lib.checks._mistakes import Mistake

_FAILED: set[str] = set()        # ids that already failed once in this process (tier-1 hint shown)
_CREATED: dict[str, Check] = {}  # every Check as its module created it (the probe trusts these)
_PARTS: dict[str, tuple] = {}      # ... and its parts, to tell when a cell swapped one


@dataclass(frozen=True)
class Check:
    """One exercise's checker. See the module docstring and docs/contributing.md."""

    id: str
    cases: Callable[[int, bool], list]
    run: Callable[..., Any]
    judge: Callable[[list, list], str]
    forbid: tuple = ()
    hints: tuple[str, ...] = ()
    grade_ids: tuple[str, ...] = ()
    # grading only: the kernel's memory must grow by less than `memory_mb` while the probe runs
    # (measured from outside the kernel: course_tools/grader/memory.py); `memory_note` is the
    # feedback when it does not (a full score grid where the exercise is to tile it)
    memory_mb: float | None = None
    memory_note: str = ""
    # judging only (the grading kernel's copy has neither; see _mistakes): the right answer and
    # the named wrong ones, each with the learner's signature
    reference: Callable[..., Any] | None = None
    mistakes: tuple[Mistake, ...] = ()
    # a value check: the learner commits a value (its reference and variants take no argument)
    takes_value: bool = False
    # what a check cell prints before its judgement (a prediction's record line: `_predict`)
    announce: Callable[[Check, list], None] | None = None

    def __post_init__(self):
        if not re.fullmatch(r"[a-z]\w*\.[A-Za-z_]\w*", self.id or ""):
            raise ValueError(f"id should read 'chNN.public_name', got {self.id!r}")
        object.__setattr__(self, "hints", tuple(self.hints))
        object.__setattr__(self, "grade_ids", tuple(self.grade_ids))
        object.__setattr__(self, "forbid", tuple(self.forbid))
        object.__setattr__(self, "mistakes", tuple(self.mistakes))
        if self.mistakes and self.reference is None:
            raise ValueError(f"{self.id}: named mistakes are judged against a reference=")
        if not all(isinstance(m, Mistake) for m in self.mistakes):
            raise ValueError(f"{self.id}: mistakes= takes Mistake(message, variant) entries")
        object.__setattr__(self, "judge", _guarded(self.judge, self.name, self))
        _CREATED[self.id] = self
        _PARTS[self.id] = (self.cases, self.run, self.judge, self.forbid)

    @property
    def name(self) -> str:
        """The public name (`similarity_scores`), used in feedback."""
        return self.id.split(".", 1)[1]

    @property
    def __name__(self) -> str:  # so a Check reads like the checker function it replaced
        return self.name

    @property
    def hint_key(self) -> str:
        """What a learner passes to `check.hint`: the answer cell's grade_id, else the id."""
        return self.grade_ids[0].removesuffix("_test") if self.grade_ids else self.id

    def keys(self) -> set[str]:
        """Every name `get` and `hint` accept for this check."""
        return {self.id, self.hint_key, *self.grade_ids,
                *(g.removesuffix("_test") for g in self.grade_ids)}

    def hint(self, tier: int = 1) -> None:
        show_hint(self, tier)

    def __call__(self, *learner_objs: Any) -> None:
        """In-process: what a check cell runs. Prints '✔ ...' or raises CheckFailure."""
        cases = self.cases(0, False)
        outcomes = run_cases(self, learner_objs, decode(encode(cases)))  # the kernel's copy
        if self.announce is not None:  # a prediction: its record line, before any reveal
            self.announce(self, outcomes)
        try:
            message = self.judge(cases, outcomes)
        except CheckFailure as failure:
            raise type(failure)(self._with_hint(str(failure)),
                                **_reference_of(failure)) from None
        _core.passed(message)

    def _with_hint(self, message: str) -> str:
        if self.id in _FAILED or not self.hints:
            return message
        _FAILED.add(self.id)
        more = (f' More: check.hint("{self.hint_key}", 2) (of {len(self.hints)}).'
                if len(self.hints) > 1 else "")
        if self.hints[0] in message:
            return message + ("\n" + more.strip() if more else "")
        return f"{message}\nHint: {self.hints[0]}{more}"

    def __repr__(self) -> str:
        return f"Check({self.id!r})"


def show_hint(check: Check, tier: int = 1) -> None:
    """Print hint number `tier` of `check` and say how many tiers there are."""
    n = len(check.hints)
    if n == 0:
        print(f"{check.hint_key} has no hints.")
        return
    if isinstance(tier, bool) or not isinstance(tier, int) or not 1 <= tier <= n:
        raise ValueError(f"tier should be a whole number from 1 to {n} for {check.hint_key} "
                         f"(it has {n} hint tiers), got {tier!r}")
    print(f"Hint {tier} of {n} for {check.hint_key}: {check.hints[tier - 1]}")
    if tier < n:
        print(f'Next: check.hint("{check.hint_key}", {tier + 1})')
