"""The checker protocol: one definition per exercise, two ways to run it.

A `Check` splits a checker into the parts that need the learner's code and the parts that must
not be in the learner's reach:

* `cases(seed, hidden)` makes the inputs (data only; never the expected answers);
* `run(*learner_objs, case)` applies the learner's function, class or value to ONE case and
  returns what it produced (the only part that runs in the learner's kernel when grading);
* `judge(cases, outcomes)` computes the reference from the cases, compares, and returns a success
  message or raises `CheckFailure` naming the mistake.

In a notebook, `check.similarity_scores(similarity_scores)` runs all three in-process
(`Check.__call__`). `course grade` runs `cases` and `judge` in the grader's own process and only
`run` in the kernel, through `course_lib.checks._probe.probe`; the two meet in a file of data
that executes nothing when read (`torch.load(weights_only=True)`, checked by `load_outcomes`).
"""

from __future__ import annotations

import builtins
import difflib
import functools
import importlib
import math
import pkgutil
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_lib.checks import _core
from course_lib.checks._core import CheckFailure, ReferenceCall, call

# The wire format (what may travel between grader and kernel, its limits, the outcome loader)
# lives in _data; it is re-exported here, where the grader and the probe import it.
from course_lib.checks._data import (  # noqa: F401 (re-exported)
    _ARRAY,
    MAX_DEPTH,
    MAX_ITEMS,
    MAX_NUMEL,
    MAX_OUTCOME_BYTES,
    MAX_TEXT,
    OutcomeError,
    _bad,
    _spend,
    _tensor,
    _Unreadable,
    _validate,
    decode,
    encode,
    load_data,
    load_outcomes,
    to_data,
)
from course_lib.checks._mistakes import Mistake, judging

_FAILED: set[str] = set()        # ids that already failed once in this process (tier-1 hint shown)
_CREATED: dict[str, Check] = {}  # every Check as its module created it (the probe trusts these)
_PARTS: dict[str, tuple] = {}      # ... and its parts, to tell when a cell swapped one

# What the kernel's comparison functions and builtins were when the set-up cell imported the
# checks (before any answer cell ran): the probe reports what an answer replaced since.
COMPARISONS = {
    "torch.allclose": torch.allclose, "torch.isclose": torch.isclose, "torch.equal": torch.equal,
    "torch.isfinite": torch.isfinite, "torch.testing.assert_close": torch.testing.assert_close,
    "torch.save": torch.save, "torch.load": torch.load,
    "numpy.allclose": np.allclose, "numpy.isclose": np.isclose, "numpy.array_equal": np.array_equal,
    "numpy.testing.assert_allclose": np.testing.assert_allclose,
    "math.isclose": math.isclose, "math.isfinite": math.isfinite,
    "sys.setprofile": sys.setprofile, "sys.getprofile": sys.getprofile,
    "threading.setprofile": threading.setprofile,
}
# IPython rebinds these itself around every cell (exit/quit/get_ipython; input for stdin).
_REBOUND_BY_IPYTHON = ("exit", "quit", "get_ipython", "display", "input", "help", "copyright",
                       "credits")
BUILTINS = {k: v for k, v in vars(builtins).items()
            if not k.startswith("_") and k not in _REBOUND_BY_IPYTHON}


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
    def takes_value(self) -> bool:
        """A value check: the learner commits a value, nothing of theirs is called."""
        return self.run is _the_value

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
        hint(self.id, tier)

    def __call__(self, *learner_objs: Any) -> None:
        """In-process: what a check cell runs. Prints '✔ ...' or raises CheckFailure."""
        cases = self.cases(0, False)
        outcomes = run_cases(self, learner_objs, decode(encode(cases)))  # the kernel's copy
        from course_lib.checks import _predict
        if self.id in _predict.COMMITTING:  # a prediction: its record line, before any reveal
            _predict.announce(self, outcomes)
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


@functools.cache
def chapter_hints(chapter: str) -> dict[str, tuple[str, ...]]:
    """The hint tiers of a chapter's checks, as `hints/<chapter>.md` writes them: a `## name`
    heading per check, a numbered item per tier, its continuation lines indented."""
    found: dict[str, list[str]] = {}
    tiers = None
    text = (Path(__file__).parent / "hints" / f"{chapter}.md").read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith("## "):
            tiers = found.setdefault(line[3:].strip(), [])
        elif tiers is not None and re.match(r"\d+\. ", line):
            tiers.append(line.split(". ", 1)[1].strip())
        elif tiers and line.startswith("   ") and line.strip():
            tiers[-1] += " " + line.strip()
    return {name: tuple(tiers) for name, tiers in found.items()}


def _declared(name: str, exercise: int, judge: Callable, grade: str | None,
              hints: tuple[str, ...] | None) -> dict:
    """What a chapter's check declares once, spelt out: its id, grade ids and hint tiers.

    The chapter is the judge's module (`course_lib.checks.ch05` -> "ch05"; `_ch08_kernels` ->
    "ch08"); the hints are the check's section of `hints/<chapter>.md` unless given, and the last
    tier points to that module's SOLUTION notebook.
    """
    module = sys.modules[judge.__module__]
    chapter = re.search(r"ch\d+", module.__name__.rsplit(".", 1)[-1]).group()
    if hints is None:
        hints = chapter_hints(chapter).get(name)
        if not hints:
            raise ValueError(f"course_lib/checks/hints/{chapter}.md has no section ## {name}")
    return {"id": f"{chapter}.{name}", "grade_ids": (f"{chapter}_{grade or name}_test",),
            "hints": (*hints, f"The worked answer is exercise {exercise} of {module.SOLUTION}.")}


Judge = Callable[[list, list], str]


def function_check(exercise: int, *, cases: Callable[[int, bool], list],
                   args: tuple[str, ...] | None = None, run: Callable[..., Any] | None = None,
                   grade: str | None = None, forbid: tuple = (),
                   hints: tuple[str, ...] | None = None, memory_mb: float | None = None,
                   memory_note: str = "", reference: Callable[..., Any] | None = None,
                   mistakes: tuple[Mistake, ...] = ()) -> Callable[[Judge], Check]:
    """A build or debug check, declared on its judge: the learner writes the function the
    judge is named after, and the check calls it on every case.

        @function_check(1, args=("query", "keys"), grade="scores", cases=_scores_cases)
        def similarity_scores(cases, outcomes): ...   # -> a Check, ch01.similarity_scores

    The id (f"{chapter}.{name}"), the grade id (f"{chapter}_{grade or name}_test"), the hint
    tiers (the check's section of `hints/<chapter>.md`, unless `hints=`) and the last tier
    (exercise `exercise` of the chapter's solution notebook) follow. `run` defaults to calling
    the learner's function on the case's entries `args` in order (args=None: on the case itself).
    `memory_mb` / `memory_note`: see `Check` (grading measures the kernel's memory from outside).
    `reference` / `mistakes`: the right answer and the named wrong ones, as functions with the
    learner's signature (`_mistakes`; the judge calls `named_mistake` where they are judged).
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
                     reference=reference, mistakes=mistakes,
                     **_declared(judge.__name__, exercise, judge, grade, hints))
    return declare


def _reference_of(failure: CheckFailure) -> dict:
    return {"reference": failure.reference} if isinstance(failure, ReferenceCall) else {}


# ----------------------------------------------------------------------------------- judging

def value(outcome: Any, what: str = "your answer") -> Any:
    """The learner's output in one outcome, or the failure its error describes (for judges)."""
    if not isinstance(outcome, dict):
        raise CheckFailure(f"{what}: the check received no result for this case.")
    if "error" in outcome:
        if outcome.get("reference_call"):
            raise ReferenceCall(str(outcome["error"]), reference=str(outcome["reference_call"]))
        raise CheckFailure(str(outcome["error"]))
    if "ok" not in outcome:
        raise CheckFailure(f"{what}: the check received no result for this case.")
    return outcome["ok"]


def each(cases: list, outcomes: list):
    """(case, the learner's output) for every case, raising the first error as feedback."""
    for case, outcome in zip(cases, outcomes):
        yield case, value(outcome)


def _guarded(judge: Callable[[list, list], str], name: str,
             check: Check | None = None) -> Callable[[list, list], str]:
    """A judge that never crashes on a malformed outcome: it fails the check instead. It runs
    as `check`'s judge (what `named_mistake` and `expected` read)."""
    if getattr(judge, "_guarded", False):
        return judge

    def guarded(cases: list, outcomes: list) -> str:
        if not isinstance(outcomes, list) or len(outcomes) != len(cases) or \
                not all(isinstance(o, dict) and ("ok" in o or "error" in o) for o in outcomes):
            raise CheckFailure(f"{name}: the answer's results are malformed "
                               f"({len(outcomes) if isinstance(outcomes, list) else '?'} results "
                               f"for {len(cases)} cases).")
        try:
            with judging(check):
                message = judge(cases, outcomes)
        except CheckFailure:
            raise
        except Exception as e:  # noqa: BLE001 - an unexpected answer must not crash the judge
            raise CheckFailure(f"{name}: your answer could not be checked "
                               f"({type(e).__name__}: {_text(e)}).") from None
        return str(message)

    guarded._guarded = True
    guarded.__wrapped__ = judge
    guarded.__name__ = getattr(judge, "__name__", "judge")
    return guarded


# --------------------------------------------------------------------------------- kernel side

def run_cases(check: Check, learner_objs: tuple, cases: list) -> list[dict]:
    """Apply the learner's objects to every case: a list of {"ok": data} / {"error": text}."""
    budget = {"numel": MAX_NUMEL, "items": MAX_ITEMS}
    return [_run_one(check, learner_objs, case, budget) for case in cases]


def _run_one(check: Check, learner_objs: tuple, case: Any, budget: dict) -> dict:
    name = check.name
    try:
        if check.forbid:
            with _core.forbid(*check.forbid, exercise=name):
                out = check.run(*learner_objs, case)
        else:
            out = check.run(*learner_objs, case)
    except ReferenceCall as e:
        return {"error": _text(e), "reference_call": e.reference or "the course's reference"}
    except CheckFailure as e:
        return {"error": _text(e)}
    except NotImplementedError as e:
        hint_text = _text(e).strip()
        return {"error": f"`{name}` (or a function it calls) is not written yet"
                         + (f". Hint: {hint_text}" if hint_text else ".")}
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any learner error becomes feedback
        return {"error": f"`{name}` raised {type(e).__name__}: {_text(e)}"}
    try:
        return {"ok": to_data(out, budget)}
    except _Unreadable as e:
        return {"error": f"`{name}` returned {e}, which a check cannot read: return tensors, "
                         "arrays, numbers or tuples of them."}


def _text(e: BaseException) -> str:
    return _core.text_of(e, MAX_TEXT)


# ------------------------------------------------------------------------- registry and hints

def _chapter_modules() -> list[str]:
    import course_lib.checks as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                  if re.fullmatch(r"ch\d+", m.name))


def all_checks() -> list[Check]:
    """Every Check of every chapter module, in chapter and definition order."""
    found: dict[str, Check] = {}
    for module_name in _chapter_modules():
        module = importlib.import_module(f"course_lib.checks.{module_name}")
        for obj in vars(module).values():
            if isinstance(obj, Check) and obj.id.startswith(module_name + "."):
                found.setdefault(obj.id, obj)
    return list(found.values())


def get(exercise: str) -> Check:
    """The Check with this id (`"ch01.similarity_scores"`) or grade_id (`"ch01_scores_test"`,
    `"ch01_scores"`). Chapter modules are imported on first use."""
    if not isinstance(exercise, str) or not exercise:
        raise ValueError(f"exercise should be a check id such as 'ch01.similarity_scores', "
                         f"got {exercise!r}")
    module_name, _, name = exercise.partition(".")
    if name and re.fullmatch(r"ch\d+", module_name):
        try:
            module = importlib.import_module(f"course_lib.checks.{module_name}")
        except ModuleNotFoundError:
            module = None
        obj = getattr(module, name, None)
        if isinstance(obj, Check) and obj.id == exercise:
            return obj
    if exercise in _CREATED:
        return _CREATED[exercise]
    checks = all_checks()
    ids = {c.id for c in checks}
    checks += [c for c in _CREATED.values() if c.id not in ids]  # e.g. a test's own Check
    for check in checks:
        if exercise in check.keys():
            return check
    known = sorted({k for c in checks for k in c.keys()})
    close = difflib.get_close_matches(exercise, known, n=3)
    raise ValueError(f"exercise {exercise!r} names no checker"
                     + (f"; did you mean {', '.join(map(repr, close))}?" if close else "."))


def original(check_id: str) -> Check:
    """The Check as its module created it (what the probe runs, whatever a cell rebound since)."""
    if check_id not in _CREATED:
        get(check_id)
    try:
        return _CREATED[check_id]
    except KeyError:
        raise ValueError(f"check_id {check_id!r} names no checker") from None


def hint(exercise: str, tier: int = 1) -> None:
    """Print hint number `tier` for an exercise (its grade_id or check id) and say how many
    tiers there are. Tier 1 names the idea; later tiers get more specific; the last points to
    the solution notebook."""
    check = get(exercise)
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


def _class_members(*modules) -> dict[str, Any]:
    return {f"{m.__name__}.{class_name}.{name}": member
            for m in modules for class_name, klass in vars(m).items()
            if isinstance(klass, type) and klass.__module__ == m.__name__
            for name, member in vars(klass).items()}


# The methods of the protocol's own classes (Check, the forbid block, ...), as defined: the
# probe reports a cell that rebinds one (`_core._Forbid.__exit__ = ...` would disarm `forbid`).
CLASS_MEMBERS = _class_members(_core, sys.modules[__name__])
