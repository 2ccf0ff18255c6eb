"""What every judge uses to read the learner's outcomes: `each` case with its output, `value`
of one outcome, and the guard that turns a judge's crash on a malformed outcome into feedback.
Named mistakes (`named_mistake`, `expected`) are `_mistakes`; comparing tensors is `_core`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from course_lib.checks._core import CheckFailure, text_of
from course_lib.checks._data import MAX_TEXT
from course_lib.checks._mistakes import judging
from course_lib.checks._trap import ReferenceCall


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


# One judge at a time in a process. The grader judges several submissions from threads of one
# process, and judges measure with torch's process-wide machinery (the profiler behind
# `peak_bytes`, FlopCounterMode, the current check that `named_mistake` reads): two at once
# crashed the grader (chapter 08, two submissions) and could count one's FLOPs in the other.
_ONE_JUDGE = threading.RLock()


def _reference_of(failure: CheckFailure) -> dict:
    return {"reference": failure.reference} if isinstance(failure, ReferenceCall) else {}


def _guarded(judge: Callable[[list, list], str], name: str,
             check: Any = None) -> Callable[[list, list], str]:
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
            with _ONE_JUDGE, judging(check):
                message = judge(cases, outcomes)
        except CheckFailure:
            raise
        except Exception as e:  # noqa: BLE001 - an unexpected answer must not crash the judge
            raise CheckFailure(f"{name}: your answer could not be checked "
                               f"({type(e).__name__}: {text_of(e, MAX_TEXT)}).") from None
        return str(message)

    guarded._guarded = True
    guarded.__wrapped__ = judge
    guarded.__name__ = getattr(judge, "__name__", "judge")
    return guarded
