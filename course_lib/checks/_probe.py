"""The kernel side of grading: apply the learner's code to cases the grader wrote, hand back data.

`course grade` runs ONE generated cell per check call in the learner's kernel:

    __import__("course_lib.checks._probe", fromlist=["probe"]).probe(
        "ch01.similarity_scores", "<scratch>/in-x.pt", "<scratch>/out-x.pt", similarity_scores)

The probe loads the cases with `torch.load(weights_only=True)`, runs `Check.run` on each (inside
`forbid` when the check forbids the course's reference), and saves data-only outcomes with
`torch.save`, plus a side file (`tampered_path(outputs_path)`) listing, best effort, what an
answer replaced that a checker relies on. It judges nothing, holds no reference values and
prints nothing. The grader reads both files with `_data.load_outcomes` / `load_tampered`
and never trusts them for anything but comparison.

The baselines the tampering report compares with (the kernel's comparison functions, its
builtins, the protocol's own classes) are taken here, when the set-up cell imports the checks,
before any answer cell has run.
"""

from __future__ import annotations

import builtins
import math
import os
import re
import sys
import threading
import types
from typing import Any

import numpy as np
import torch

from course_lib.checks import _check, _core, _data, _kernel, _mistakes, _registry, _trap

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


def _class_members(*modules) -> dict[str, Any]:
    return {f"{m.__name__}.{class_name}.{name}": member
            for m in modules for class_name, klass in vars(m).items()
            if isinstance(klass, type) and klass.__module__ == m.__name__
            for name, member in vars(klass).items()}


# The methods of the protocol's own classes (Check, the forbid block, ...), as defined: the
# probe reports a cell that rebinds one (`_trap._Forbid.__exit__ = ...` would disarm `forbid`).
CLASS_MEMBERS = _class_members(_core, _trap, _check, _mistakes)


def tampered_path(outputs_path: str | os.PathLike) -> str:
    """Where the probe writes its list of tampering findings, next to the outcomes."""
    return os.fspath(outputs_path) + ".tampered"


def probe(check_id: str, inputs_path: str, outputs_path: str, *learner_objs: Any) -> None:
    """Run check `check_id`'s kernel side on the cases in `inputs_path`; write `outputs_path`."""
    tampered: list[str] = []
    try:
        check = _registry.original(check_id)
        tampered = tampering(check_id)
        cases = _data.decode(torch.load(inputs_path, map_location="cpu", weights_only=True))
        if not isinstance(cases, list):
            raise ValueError(f"the cases file holds a {type(cases).__name__}, not a list")
        outcomes = _kernel.run_cases(check, learner_objs, cases)
        tampered += [t for t in tampering(check_id) if t not in tampered]  # changed while running
    except Exception as e:  # noqa: BLE001 - the grader reads this as a failed check
        outcomes = [{"error": f"the checker could not run: {type(e).__name__}: "
                              f"{_kernel._text(e)}"}]
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
    found = _data.load_data(path, max_bytes=max_bytes)
    if not isinstance(found, list) or not all(type(t) is str for t in found):
        raise _data.OutcomeError("the tampering report is not a list of strings")
    return found


def _learner_code(obj: Any) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and _trap._file_kind(code.co_filename) == "learner"


def tampering(check_id: str) -> list[str]:
    """What an answer has replaced that a checker relies on (best effort; empty when nothing)."""
    found: list[str] = []
    check = _check._CREATED.get(check_id)
    parts = _check._PARTS.get(check_id, ())
    for part, original in zip(("cases", "run", "judge", "forbid"), parts):
        if getattr(check, part, None) is not original:
            found.append(f"{check_id}.{part} was replaced")
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("course_lib.checks"):
            continue
        file = getattr(module, "__file__", None)
        if not isinstance(module, types.ModuleType) or not file \
                or _trap._file_kind(file) != "course":
            found.append(f"the module {module_name} was replaced")
            continue
        chapter = re.match(r"course_lib\.checks\.(ch\d+)|", module_name).group(1)
        for attr, obj in list(vars(module).items()):
            created = _check._CREATED.get(f"{chapter}.{attr}") if chapter else None
            if created is not None and obj is not created:
                found.append(f"{module_name}.{attr} (a checker) was replaced")
            elif isinstance(obj, types.FunctionType) and _learner_code(obj):
                found.append(f"{module_name}.{attr} was replaced by code from the notebook")
    for name, original in CLASS_MEMBERS.items():
        module_name, class_name, member = name.rsplit(".", 2)
        klass = getattr(sys.modules.get(module_name), class_name, None)
        if not isinstance(klass, type) or vars(klass).get(member) is not original:
            found.append(f"{name} was replaced")
    for name, original in COMPARISONS.items():
        module_path, _, attr = name.rpartition(".")
        owner = _resolve(module_path)
        if owner is not None and getattr(owner, attr, None) is not original:
            found.append(f"{name} was replaced")
    for name, original in BUILTINS.items():
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
