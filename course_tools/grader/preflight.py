"""Stage 4a, preflight: the course's own first cell in every kernel, and what its failure means.

Before any cell of the submission, the kernel runs one cell of the grader's: it imports
`course_lib` and the checker modules the source's set-up cells import, and checks that its
`course_lib` is the one the grader handed it (the grader's own, bound read-only in the sandbox,
or the private copy made for the run without it). Like the source's set-up cells, it runs under
the course's own limit (`limits.setup_limit`), not the learner's.

When this cell fails, or a set-up cell of the source fails before any of the submission's code
has run, or the kernel does not start at all, the problem lies with the grading environment, not
the learner: `environment_problem` says what it is, and `course grade` / `course check` stop with
that message (`GradingEnvironmentError`) instead of handing out zeros.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_tools.grader.limits import COURSE_ROLES, cell_limit

_CELL = '''\
def _course_preflight(expected, modules):
    import importlib, os
    import course_lib
    found = os.path.dirname(os.path.realpath(getattr(course_lib, "__file__", None) or "?"))
    if os.path.normcase(found) != os.path.normcase(os.path.realpath(expected)):
        raise ImportError(f"the kernel imported course_lib from {{found}}, not from {{expected}}")
    for name in modules:
        importlib.import_module(name)
_course_preflight({expected!r}, {modules!r})
del _course_preflight
'''
_MISSING = re.compile(r"No module named '([^']+)'")


class GradingEnvironmentError(RuntimeError):
    """Grading cannot go on: the grading kernel, not a submission, is broken (the message says
    what is wrong and what to do). Raised by `grade()`; `course grade`/`check` exit with 2."""


def source(modules: Sequence[str], course_lib: str | Path) -> str:
    """The preflight cell: import course_lib (it must be `course_lib`, the folder the grader
    handed the kernel) and then each of `modules`."""
    return _CELL.format(expected=str(course_lib), modules=tuple(modules))


def _which(cell: Any) -> str:
    if cell.role == "preflight":
        return "the grader's first cell (importing course_lib and the checkers)"
    if cell.grade_id:
        return f"the course's set-up cell `{cell.grade_id}`"
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    return f"the course's set-up cell `{first.strip()[:60]}`"


def _explain(cell: Any, st: dict, *, limit: float, memory_mb: int, grader_lib: Path,
             python_path: Sequence[str]) -> str:
    status, ename, evalue = st.get("status"), st.get("ename") or "", st.get("evalue") or ""
    which = _which(cell)
    if status == "error":
        missing = _MISSING.search(evalue) if ename == "ModuleNotFoundError" else None
        module = missing.group(1) if missing else None
        if module and module.split(".")[0] == "course_lib":
            return (f"the grading kernel cannot import {module} ({ename}: {evalue}), although "
                    f"the grader imported course_lib from {grader_lib}; the kernel runs "
                    f"{sys.executable}: install the course there (`pip install -e .` in the "
                    "course's folder) or report this as a grader bug")
        if module:
            where = ", ".join(python_path) or "none given"
            return (f"the grading kernel cannot import `{module}`, which {which} imports "
                    f"({ename}: {evalue}): install it into {sys.executable}, or give the folder "
                    f"that holds it with --python-path DIR (folders given: {where})")
        return f"{which} failed: {ename}: {evalue}".rstrip(": ")
    if status in ("timeout", "stuck"):
        return (f"{which} took longer than {limit:g} s, the limit of the course's own cells: "
                "the machine is too busy or too slow; grade with fewer --jobs, or later")
    if status == "died":
        return (f"the kernel died in {which} (memory beyond the {memory_mb} MB cap? give "
                "--memory-mb more)")
    return f"{which} did not run ({status})"


def environment_problem(plan: Any, run: Any, *, timeout: float, memory_mb: int,
                        grader_lib: Path, python_path: Sequence[str]) -> str | None:
    """Why this run says nothing about the submission, or None. Only the course's own cells
    that ran before any of the submission's code count: after that, a failure may be the
    submission's doing (it could have broken what a later set-up cell needs)."""
    if not getattr(run, "started", True):
        return f"{run.error} (before any submitted code ran)"
    for cell, st in zip(plan.cells, run.statuses):
        if cell.role not in COURSE_ROLES or st.get("status") == "skipped":
            return None  # skipped: the worker stopped (it may have been killed), nothing ran
        if st.get("status") != "ok":
            why = _explain(cell, st, limit=cell_limit(cell.role, timeout), memory_mb=memory_mb,
                           grader_lib=grader_lib, python_path=python_path)
            return f"{why} (before any submitted code ran)"
    return None
