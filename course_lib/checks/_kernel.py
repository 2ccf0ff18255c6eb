"""The kernel's side of a check: apply the learner's objects to every case and hand back data.

This is all of a check that runs where the learner's code runs (in a notebook, and in a grading
kernel through `_probe`): `Check.run` on each case, inside the `forbid` trap (`_trap`) when the
exercise rules out the course's own implementation, every error turned into an outcome the
judge reads as feedback, every output turned into data (`_data.to_data`).
"""

from __future__ import annotations

from typing import Any

from course_lib.checks._core import CheckFailure, text_of
from course_lib.checks._data import MAX_ITEMS, MAX_NUMEL, MAX_TEXT, _Unreadable, to_data
from course_lib.checks._trap import ReferenceCall, forbid


def run_cases(check: Any, learner_objs: tuple, cases: list) -> list[dict]:
    """Apply the learner's objects to every case: a list of {"ok": data} / {"error": text}."""
    budget = {"numel": MAX_NUMEL, "items": MAX_ITEMS}
    return [_run_one(check, learner_objs, case, budget) for case in cases]


def _run_one(check: Any, learner_objs: tuple, case: Any, budget: dict) -> dict:
    name = check.name
    try:
        if check.forbid:
            with forbid(*check.forbid, exercise=name):
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
    return text_of(e, MAX_TEXT)
