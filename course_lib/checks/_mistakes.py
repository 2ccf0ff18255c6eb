"""Named mistakes as data: each wrong answer a learner is likely to write, declared once, beside
its check, as that wrong answer itself.

    @function_check(1, grade="causal", cases=_causal_cases, reference=_causal_ok, mistakes=(
        Mistake("your mask is upper-triangular: ...", lambda n: torch.ones(n, n).triu().bool()),
        ...))
    def causal_mask(cases, outcomes):
        for n, got in each(cases, outcomes):
            got = _bool_result(got, ...)       # the judge's own checks of form come first
            named_mistake(n, got)              # then: is this answer one of the declared ones?
            ...

A mistake's `variant` has the learner's own signature (a value check's takes no argument and
returns the wrong value) and runs through the check's own `run`, as the learner's answer does.
`named_mistake` (the one judge of them all) fails with a mistake's message on a case where the
learner's output equals that variant's output AND the variant's output differs from the
`reference`'s: a mistake is only named where it shows. tests/test_checks_generic.py runs every
declared variant through its check and fails when its message does not come out, so a
recogniser that never fires is a failing test, not a silent one.

Two things to know when writing one. A reference or variant is handed in as an answer by that
test, so it runs under the check's `forbid`: write it from plain torch operations, not with the
course function the exercise rules out. And `expected` and the outputs compared are the data
the kernel hands back (`_data.to_data`): a NumPy scalar comes back as a Python float (read it
with `torch.as_tensor(x, dtype=torch.float64)`). Each runs once per case and judgement.

The variants and references never reach a grading kernel: the strip (course_tools/grader/
strip.py) drops the `reference=` and `mistakes=` arguments of every check declaration, and the
judges that use them run only in the grader's process.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from course_lib.checks._core import fail


@dataclass(frozen=True)
class Mistake:
    """One wrong answer and the feedback that names it.

    `message` is what the learner reads; it may hold `{field}`s, filled from
    `detail(case, got)` (a dict) on the case where the mistake showed. `variant` is the wrong
    answer, with the learner's signature. Outputs are compared as float64 values to within
    `atol + rtol·|x|` (NaN equal to NaN); `on`, when given, picks the part of an output that is
    compared (`on=lambda out: out[1]`: the weights of an (out, weights) pair); `when`, when
    given, says on which cases the mistake may be named (`when=lambda case: case["h"] > 1`:
    where another mistake gives the same output on some case, and the old feedback named that
    one there)."""

    message: str
    variant: Callable[..., Any]
    atol: float = 1e-7
    rtol: float = 1e-6
    on: Callable[[Any], Any] | None = None
    detail: Callable[[Any, Any], dict] | None = None
    when: Callable[[Any], bool] | None = None

    def __post_init__(self):
        if not isinstance(self.message, str) or not self.message:
            raise ValueError("a Mistake needs its message (the feedback that names it)")
        if not callable(self.variant):
            raise ValueError(f"the Mistake {self.message[:40]!r}... needs its wrong answer as "
                             f"a function, got {type(self.variant).__name__}")

    def words(self) -> re.Pattern:
        """What the rendered message always holds: its text, a field standing for anything."""
        parts = re.split(r"\{[^{}]*\}", self.message)
        return re.compile(".*?".join(re.escape(p) for p in parts), re.S)

    def render(self, case: Any, got: Any) -> str:
        return self.message.format(**self.detail(case, got)) if self.detail else self.message


class _NoOutput(Exception):
    """A variant or the reference raised on a case (the mistake is not named there)."""


def same(a: Any, b: Any, atol: float = 1e-7, rtol: float = 1e-6) -> bool:
    """Whether two outputs (tensors, arrays, numbers, bools, tuples, lists, dicts of them) hold
    the same values: same structure and shapes, values within atol + rtol·|b|, NaN = NaN."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(same(a[k], b[k], atol, rtol) for k in a))
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))
                and len(a) == len(b) and all(same(x, y, atol, rtol) for x, y in zip(a, b)))
    if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
        return a == b
    try:
        x, y = _float64(a), _float64(b)
    except (TypeError, ValueError, RuntimeError):
        return False
    return x.shape == y.shape and bool(torch.allclose(x, y, atol=atol, rtol=rtol,
                                                      equal_nan=True))


def _float64(v: Any) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.detach().to("cpu", torch.float64)
    return torch.as_tensor(np.asarray(v, dtype=np.float64))


# The check whose judge is running (set by `Check` around its judge), and the outputs its
# reference and variants gave on each case so far: named_mistake and expected read both, so a
# judge names none of them itself and each runs once per case and judgement.
_JUDGING: contextvars.ContextVar = contextvars.ContextVar("judging", default=(None, None))


@contextlib.contextmanager
def judging(check: Any) -> Iterator[None]:
    token = _JUDGING.set((check, {}))
    try:
        yield
    finally:
        _JUDGING.reset(token)


def output(check: Any, answer: Callable[..., Any], case: Any, memo: dict | None = None) -> Any:
    """What `answer` (the reference or a variant, with the learner's signature) gives on `case`,
    run as the check runs a learner's answer, as the same data the learner's output became.
    Raises _NoOutput when the answer does not run on this case."""
    from course_lib.checks._data import to_data

    key = (id(answer), id(case))
    if memo is not None and key in memo:
        found = memo[key]
    else:
        try:
            found = to_data(answer() if check.takes_value else check.run(answer, case))
        except Exception as e:  # noqa: BLE001 - a variant that does not apply to this case
            found = _NoOutput(str(e))
        if memo is not None:
            memo[key] = found
    if isinstance(found, _NoOutput):
        raise found
    return found


def expected(case: Any) -> Any:
    """The reference's output on `case`, for the judge that is running (its `reference=`)."""
    check, memo = _JUDGING.get()
    if check is None or check.reference is None:
        raise RuntimeError("expected() is for the judge of a check declared with reference=")
    return output(check, check.reference, case, memo)


def named_mistake(case: Any, got: Any) -> None:
    """Fail with the first declared mistake that `got` is on this case: equal to its variant's
    output where that output differs from the reference's. Nothing when none is."""
    check, memo = _JUDGING.get()
    if check is None or not check.mistakes:
        return
    try:
        want = output(check, check.reference, case, memo)
    except _NoOutput:
        return
    try:  # the right answer (to the tightest tolerance declared) is no mistake: run no variant
        if same(got, want, min(m.atol for m in check.mistakes),
                min(m.rtol for m in check.mistakes)):
            return
    except (TypeError, ValueError):
        pass
    for mistake in check.mistakes:
        if mistake.when is not None and not mistake.when(case):
            continue
        try:
            wrong = output(check, mistake.variant, case, memo)
        except _NoOutput:
            continue
        pick = mistake.on or (lambda out: out)
        try:
            differs = not same(pick(wrong), pick(want), mistake.atol, mistake.rtol)
            shows = differs and same(pick(got), pick(wrong), mistake.atol, mistake.rtol)
        except (TypeError, IndexError, KeyError, AttributeError):
            continue  # the learner's output has another form: the judge's own checks name it
        if shows:
            fail(mistake.render(case, got))
