"""A small course for the grader tests: one source notebook in nbgrader format whose test cells
call `Check`s of a checker module of its own (`fx_checks`, importable by the grader and, read-only,
by the kernel), and helpers to make submissions of it."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import nbformat

from course_tools.exercises import student_version

FX_CHECKS = '''
"""Checks of the fixture course: double, square, inc."""
from course_lib.checks._core import call, fail
from course_lib.checks._check import Check
from course_lib.checks._judging import value


def _make(name, want, visible, hints):
    def cases(seed, hidden):
        return list(visible) + ([-1, 10 + seed % 7] if hidden else [])

    def run(fn, x):
        return call(fn, x, name=name)

    def judge(cases, outcomes):
        for x, outcome in zip(cases, outcomes):
            got = value(outcome)
            if got != want(x):
                fail(f"{name}({x}) should be {want(x)}, got {got!r}")
        return f"{name} is right"

    return Check(id=f"fx90.{name}", cases=cases, run=run, judge=judge, hints=hints,
                 grade_ids=(f"fx_{name}_test",))


double = _make("double", lambda x: 2 * x, [3], ("multiply by FACTOR", "FACTOR * x"))
square = _make("square", lambda x: x * x, [4], ("x times x", "x * x"))
inc = _make("inc", lambda x: x + 1, [1], ("add one", "x + 1"))
'''


def _meta(grade_id, *, grade=False, solution=False, locked=True, points=None):
    m = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
         "solution": solution}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def _answer(gid, body):
    return nbformat.v4.new_code_cell(body, metadata=_meta(gid, solution=True, locked=False))


def _test(gid, body, points):
    return nbformat.v4.new_code_cell(body, metadata=_meta(gid, grade=True, points=points))


def source_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Fixture exercises"),
        nbformat.v4.new_code_cell("import os\nimport fx_checks as check\nFACTOR = 2",
                                  metadata=_meta("fx_setup")),
        _answer("fx_double", "def double(x):\n    # HINT: multiply by FACTOR\n"
                             "    ### BEGIN SOLUTION\n    return FACTOR * x\n    ### END SOLUTION"),
        _test("fx_double_test", "check.double(double)", 2),
        _answer("fx_square", "def square(x):\n    # HINT: x times x\n    ### BEGIN SOLUTION\n"
                             "    return x * x\n    ### END SOLUTION"),
        _test("fx_square_test", "check.square(square)", 3),
        _answer("fx_inc", "def inc(x):\n    # HINT: add one\n    ### BEGIN SOLUTION\n"
                          "    return x + 1\n    ### END SOLUTION"),
        _test("fx_inc_test", "check.inc(inc)", 1),
    ]
    return nb


SOLVED = {"fx_double": "def double(x):\n    return FACTOR * x",
          "fx_square": "def square(x):\n    return x * x",
          "fx_inc": "def inc(x):\n    return x + 1"}
POINTS = {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}


def submission(**answers):
    """The exercise notebook with some answer cells filled in (the rest stay blank)."""
    nb = student_version(source_notebook(), "90_fixture.ipynb")
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def solved(**answers):
    return submission(**dict(SOLVED, **answers))


def with_cells(nb, edit):
    nb = copy.deepcopy(nb)
    edit(nb.cells)
    return nb


def gid_of(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def drop(*gids):
    return lambda cells: cells.__setitem__(slice(None), [c for c in cells if gid_of(c) not in gids])


def set_source(gid, text):
    def edit(cells):
        for c in cells:
            if gid_of(c) == gid:
                c.source = text
    return edit


def write(folder: Path, name: str, content) -> Path:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(nbformat.writes(nbformat.from_dict(content)), encoding="utf-8")
    return path


def make_course(root: Path) -> tuple[Path, Path]:
    """solutions/90_fixture.ipynb and pylib/fx_checks.py under root; pylib goes on sys.path
    (the grader imports the checks) and is handed to the kernel with `python_path`."""
    solutions, pylib = root / "solutions", root / "pylib"
    solutions.mkdir()
    pylib.mkdir()
    nbformat.write(source_notebook(), solutions / "90_fixture.ipynb")
    (pylib / "fx_checks.py").write_text(FX_CHECKS, encoding="utf-8")
    if str(pylib) not in sys.path:
        sys.path.insert(0, str(pylib))
    return solutions, pylib


def course_with(root: Path, submissions: dict) -> tuple[Path, Path, Path]:
    """make_course, plus a submissions/ folder holding each `name -> notebook (or bytes)`:
    returns (solutions, pylib, submissions)."""
    solutions, pylib = make_course(root)
    subs = root / "submissions"
    subs.mkdir()
    for name, content in submissions.items():
        write(subs, name, content)
    return solutions, pylib, subs
