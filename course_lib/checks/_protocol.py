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
import importlib
import math
import os
import pkgutil
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from course_lib.checks import _core
from course_lib.checks._core import CheckFailure, ReferenceCall

# Limits on what the kernel may hand back (checked when converting and again when loading).
MAX_OUTCOME_BYTES = 64 * 2**20   # the outcome file
MAX_NUMEL = 2**24                # tensor elements over all outcomes of one probe
MAX_DEPTH = 12                   # nesting of tuples/lists/dicts
MAX_ITEMS = 100_000              # container entries over all outcomes
MAX_TEXT = 20_000                # characters of one string (error messages are cut to it)

_ARRAY = "__ndarray__"           # how a NumPy array in a case travels: {"__ndarray__": tensor}
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

    def __post_init__(self):
        if not re.fullmatch(r"[a-z]\w*\.[A-Za-z_]\w*", self.id or ""):
            raise ValueError(f"id should read 'chNN.public_name', got {self.id!r}")
        object.__setattr__(self, "hints", tuple(self.hints))
        object.__setattr__(self, "grade_ids", tuple(self.grade_ids))
        object.__setattr__(self, "forbid", tuple(self.forbid))
        object.__setattr__(self, "judge", _guarded(self.judge, self.name))
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
        hint(self.id, tier)

    def __call__(self, *learner_objs: Any) -> None:
        """In-process: what a check cell runs. Prints '✔ ...' or raises CheckFailure."""
        cases = self.cases(0, False)
        outcomes = run_cases(self, learner_objs, decode(encode(cases)))  # the kernel's copy
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


def _guarded(judge: Callable[[list, list], str], name: str) -> Callable[[list, list], str]:
    """A judge that never crashes on a malformed outcome: it fails the check instead."""
    if getattr(judge, "_guarded", False):
        return judge

    def guarded(cases: list, outcomes: list) -> str:
        if not isinstance(outcomes, list) or len(outcomes) != len(cases) or \
                not all(isinstance(o, dict) and ("ok" in o or "error" in o) for o in outcomes):
            raise CheckFailure(f"{name}: the answer's results are malformed "
                               f"({len(outcomes) if isinstance(outcomes, list) else '?'} results "
                               f"for {len(cases)} cases).")
        try:
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


class _Unreadable(Exception):
    """The learner's output holds something that is not data."""


def to_data(x: Any, budget: dict | None = None, depth: int = 0) -> Any:
    """The learner's output as data only: plain CPU tensors (NumPy arrays become tensors),
    numbers, str, bool, None, and tuples/lists/dicts of those. Raises _Unreadable otherwise."""
    budget = {"numel": MAX_NUMEL, "items": MAX_ITEMS} if budget is None else budget
    if depth > MAX_DEPTH:
        raise _Unreadable(f"data nested more than {MAX_DEPTH} levels deep")
    if x is None or type(x) in (bool, int, float, complex):
        return x
    if type(x) is str:
        if len(x) > MAX_TEXT:
            raise _Unreadable(f"a string of {len(x)} characters")
        return x
    if isinstance(x, torch.Tensor):
        return _tensor(x, budget)
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biufc":
            raise _Unreadable(f"a NumPy array of {x.dtype}")
        return _tensor(torch.from_numpy(np.ascontiguousarray(x)), budget)
    if isinstance(x, np.generic):
        return to_data(x.item(), budget, depth + 1) if x.dtype.kind in "biufc" else _bad(x)
    for base in (bool, int, float, complex, str):  # subclasses: IntEnum, numpy-free float types
        if isinstance(x, base):
            return to_data(base(x), budget, depth + 1)
    if isinstance(x, (tuple, list)):
        _spend(budget, "items", len(x), "more than {} entries")
        items = [to_data(v, budget, depth + 1) for v in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        _spend(budget, "items", len(x), "more than {} entries")
        out = {}
        for k, v in x.items():
            if type(k) not in (str, int):
                raise _Unreadable(f"a dict with a {type(k).__name__} key")
            out[k] = to_data(v, budget, depth + 1)
        return out
    return _bad(x)


def _bad(x: Any):
    raise _Unreadable(f"a {type(x).__name__}")


def _spend(budget: dict, what: str, n: int, message: str) -> None:
    budget[what] -= n
    if budget[what] < 0:
        limit = MAX_NUMEL if what == "numel" else MAX_ITEMS
        raise _Unreadable(message.format(limit))


def _tensor(x: torch.Tensor, budget: dict) -> torch.Tensor:
    if x.is_nested or x.device.type == "meta":
        raise _Unreadable("a nested tensor" if x.is_nested else "a tensor without data (meta)")
    if x.is_quantized:
        x = x.dequantize()
    if x.layout != torch.strided:
        x = x.to_dense()
    _spend(budget, "numel", x.numel(), "tensors of more than {} elements in all")
    t = x.detach().to("cpu")
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)  # nn.Parameter, a learner's subclass
    return t.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)


def encode(cases: Any) -> Any:
    """Cases as data `torch.load(weights_only=True)` accepts: NumPy arrays become
    {"__ndarray__": tensor}, NumPy scalars Python numbers; everything is a fresh copy."""
    if isinstance(cases, np.ndarray):
        return {_ARRAY: torch.from_numpy(np.ascontiguousarray(cases)).clone()}
    if isinstance(cases, np.generic):
        return cases.item()
    if isinstance(cases, torch.Tensor):
        return cases.detach().cpu().clone()
    if isinstance(cases, (tuple, list)):
        items = [encode(v) for v in cases]
        return items if isinstance(cases, list) else tuple(items)
    if isinstance(cases, dict):
        return {k: encode(v) for k, v in cases.items()}
    if cases is None or isinstance(cases, (bool, int, float, complex, str)):
        return cases
    raise ValueError(f"a case may hold only data (tensors, arrays, numbers, str, containers), "
                     f"not a {type(cases).__name__}")


def decode(cases: Any) -> Any:
    """The inverse of `encode` (in the kernel): {"__ndarray__": tensor} becomes a NumPy array."""
    if isinstance(cases, dict):
        if set(cases) == {_ARRAY} and isinstance(cases[_ARRAY], torch.Tensor):
            return cases[_ARRAY].numpy().copy()
        return {k: decode(v) for k, v in cases.items()}
    if isinstance(cases, (tuple, list)):
        items = [decode(v) for v in cases]
        return items if isinstance(cases, list) else tuple(items)
    return cases


# ------------------------------------------------------------------------ grader side: loading

class OutcomeError(ValueError):
    """An outcome file the grader refuses: too large, not data, or not shaped like outcomes."""


def load_data(path: str | os.PathLike, *, max_bytes: int = MAX_OUTCOME_BYTES) -> Any:
    """Read a file the kernel wrote, refusing anything but plain data (no pickle payloads)."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise OutcomeError(f"no result file at {path}: {e}") from None
    if size > max_bytes:
        raise OutcomeError(f"the result file has {size} bytes, more than the limit of {max_bytes}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - UnpicklingError, a truncated zip, anything
        raise OutcomeError(f"the result file is not plain data ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None


def load_outcomes(path: str | os.PathLike, *, max_bytes: int = MAX_OUTCOME_BYTES,
                  n_cases: int | None = None) -> list[dict]:
    """The outcomes the probe saved, validated: a list of {"ok": data} or {"error": str}
    (+ "reference_call": str), tensors plain, finite in size and nesting. Raises OutcomeError."""
    outcomes = load_data(path, max_bytes=max_bytes)
    if not isinstance(outcomes, list):
        raise OutcomeError(f"the result file holds a {type(outcomes).__name__}, not a list")
    if n_cases is not None and len(outcomes) != n_cases:
        raise OutcomeError(f"the result file has {len(outcomes)} results for {n_cases} cases")
    budget = {"numel": MAX_NUMEL, "items": MAX_ITEMS}
    for o in outcomes:
        if not isinstance(o, dict) or not o or not set(o) <= {"ok", "error", "reference_call"} \
                or ("ok" in o) == ("error" in o):
            raise OutcomeError("a result is not {'ok': ...} or {'error': ...}")
        for key in ("error", "reference_call"):
            if key in o and (type(o[key]) is not str or len(o[key]) > MAX_TEXT + 10):
                raise OutcomeError(f"a result's {key!r} is not a short string")
        if "ok" in o:
            _validate(o["ok"], budget, 0)
    return outcomes


def _validate(x: Any, budget: dict, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise OutcomeError(f"a result is nested more than {MAX_DEPTH} levels deep")
    if x is None or type(x) in (bool, int, float, complex):
        return
    if type(x) is str:
        if len(x) > MAX_TEXT:
            raise OutcomeError("a result holds an over-long string")
        return
    if type(x) is torch.Tensor:
        budget["numel"] -= x.numel()
        if budget["numel"] < 0:
            raise OutcomeError(f"the results hold more than {MAX_NUMEL} tensor elements")
        if x.layout != torch.strided or x.requires_grad or x.device.type != "cpu":
            raise OutcomeError("a result holds a tensor that is not a plain CPU tensor")
        needed = x.numel() * x.element_size()
        if x.numel() and (not x.is_contiguous() or x.untyped_storage().nbytes() < needed):
            raise OutcomeError("a result holds a tensor whose shape does not match its data")
        return
    if type(x) in (tuple, list, dict):
        budget["items"] -= len(x)
        if budget["items"] < 0:
            raise OutcomeError(f"the results hold more than {MAX_ITEMS} entries")
        if type(x) is dict:
            if not all(type(k) in (str, int) for k in x):
                raise OutcomeError("a result holds a dict whose keys are not str or int")
            x = x.values()
        for v in x:
            _validate(v, budget, depth + 1)
        return
    raise OutcomeError(f"a result holds a {type(x).__name__}")


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
