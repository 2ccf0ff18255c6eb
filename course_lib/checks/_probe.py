"""The kernel side of grading: apply the learner's code to cases the grader wrote, hand back data.

`course grade` runs ONE generated cell per check call in the learner's kernel:

    __import__("course_lib.checks._probe", fromlist=["probe"]).probe(
        "ch01.similarity_scores", "<scratch>/in-x.pt", "<scratch>/out-x.pt", similarity_scores)

The probe loads the cases with `torch.load(weights_only=True)`, runs `Check.run` on each (inside
`forbid` when the check forbids the course's reference), and saves data-only outcomes with
`torch.save`, plus a side file (`tampered_path(outputs_path)`) listing, best effort, what an
answer replaced that a checker relies on. It judges nothing, holds no reference values and
prints nothing. The grader reads both files with `_protocol.load_outcomes` / `load_tampered`
and never trusts them for anything but comparison.
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
import types
from typing import Any

import torch

from course_lib.checks import _core, _protocol


def tampered_path(outputs_path: str | os.PathLike) -> str:
    """Where the probe writes its list of tampering findings, next to the outcomes."""
    return os.fspath(outputs_path) + ".tampered"


def probe(check_id: str, inputs_path: str, outputs_path: str, *learner_objs: Any) -> None:
    """Run check `check_id`'s kernel side on the cases in `inputs_path`; write `outputs_path`."""
    tampered: list[str] = []
    try:
        check = _protocol.original(check_id)
        tampered = tampering(check_id)
        cases = _protocol.decode(torch.load(inputs_path, map_location="cpu", weights_only=True))
        if not isinstance(cases, list):
            raise ValueError(f"the cases file holds a {type(cases).__name__}, not a list")
        outcomes = _protocol.run_cases(check, learner_objs, cases)
        tampered += [t for t in tampering(check_id) if t not in tampered]  # changed while running
    except Exception as e:  # noqa: BLE001 - the grader reads this as a failed check
        outcomes = [{"error": f"the checker could not run: {type(e).__name__}: "
                              f"{_protocol._text(e)}"}]
    _save(tampered, tampered_path(outputs_path))
    _save(outcomes, outputs_path)


def _save(obj: Any, path: str | os.PathLike) -> None:
    tmp = f"{os.fspath(path)}.part"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # the grader never sees half a file


def load_tampered(outputs_path: str | os.PathLike, *, max_bytes: int = 2**20) -> list[str] | None:
    """The probe's tampering findings (grader side); None when the side file is missing (the
    real probe always writes one, so a missing file means it did not run)."""
    path = tampered_path(outputs_path)
    if not os.path.exists(path):
        return None
    found = _protocol.load_data(path, max_bytes=max_bytes)
    if not isinstance(found, list) or not all(type(t) is str for t in found):
        raise _protocol.OutcomeError("the tampering report is not a list of strings")
    return found


def _learner_code(obj: Any) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and _core._file_kind(code.co_filename) == "learner"


def tampering(check_id: str) -> list[str]:
    """What an answer has replaced that a checker relies on (best effort; empty when nothing)."""
    found: list[str] = []
    check = _protocol._CREATED.get(check_id)
    parts = _protocol._PARTS.get(check_id, ())
    for part, original in zip(("cases", "run", "judge", "forbid"), parts):
        if getattr(check, part, None) is not original:
            found.append(f"{check_id}.{part} was replaced")
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("course_lib.checks"):
            continue
        file = getattr(module, "__file__", None)
        if not isinstance(module, types.ModuleType) or not file \
                or _core._file_kind(file) != "course":
            found.append(f"the module {module_name} was replaced")
            continue
        chapter = module_name.rpartition(".")[2]
        for attr, obj in list(vars(module).items()):
            created = _protocol._CREATED.get(f"{chapter}.{attr}")
            if created is not None and obj is not created:
                found.append(f"{module_name}.{attr} (a checker) was replaced")
            elif isinstance(obj, types.FunctionType) and _learner_code(obj):
                found.append(f"{module_name}.{attr} was replaced by code from the notebook")
    for name, original in _protocol.CLASS_MEMBERS.items():
        module_name, class_name, member = name.rsplit(".", 2)
        klass = getattr(sys.modules.get(module_name), class_name, None)
        if not isinstance(klass, type) or vars(klass).get(member) is not original:
            found.append(f"{name} was replaced")
    for name, original in _protocol.COMPARISONS.items():
        module_path, _, attr = name.rpartition(".")
        owner = _resolve(module_path)
        if owner is not None and getattr(owner, attr, None) is not original:
            found.append(f"{name} was replaced")
    for name, original in _protocol.BUILTINS.items():
        current = getattr(builtins, name, None)
        if current is not original or _learner_code(current):
            found.append(f"builtins.{name} was replaced")
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        run = getattr(type(thread), "run", None)
        if thread is not threading.current_thread() and \
                (_learner_code(target) or _learner_code(run)):
            found.append(f"a thread the notebook started ({thread.name}) is still running")
    return found


def _resolve(dotted: str) -> Any:
    top, *rest = dotted.split(".")
    obj = {"torch": torch, "numpy": sys.modules.get("numpy"), "math": sys.modules.get("math"),
           "sys": sys, "threading": threading}.get(top)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj
