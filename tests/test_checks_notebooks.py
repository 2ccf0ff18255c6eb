"""The Checks of every chapter with a solution notebook and those notebooks agree: graded test cells
hold only check calls (the grader reads them with `ast` and judges each call itself), every check
has tiered hints ending at its solution, and an answer cell named after a check shows that check's
tier-1 hint as its `# HINT:` line. (That no nudge or student cell gives the solution away is
tests/test_exercise_design.py's job.)"""

import ast
from pathlib import Path

import nbformat
import pytest

from course_lib.checks import Check, get
from course_lib.checks._registry import all_checks
from course_tools.exercises import student_version

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(p.name[:2] for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = {nn: next((ROOT / "solutions").glob(f"{nn}_*.ipynb")) for nn in CHAPTERS}
CHECKS = [c for c in all_checks() if c.id[2:4] in CHAPTERS]


def _cells(kind: str):
    """(chapter, solution cell, student cell) for every answer ("solution") or test ("grade")
    cell of the solution notebooks."""
    for nn, path in SOLUTIONS.items():
        nb = nbformat.read(path, as_version=4)
        student = student_version(nb, path.name)
        for cell, blank in zip(nb.cells, student.cells):
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get(kind):
                yield pytest.param(nn, cell, blank, id=cell.metadata["nbgrader"]["grade_id"])


def test_every_chapter_has_checks():
    assert {c.id[2:4] for c in CHECKS} == set(CHAPTERS)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.id)
def test_every_check_has_tiers_ending_at_the_solution(check):
    assert isinstance(check, Check) and len(check.hints) >= 2
    assert f"solutions/{check.id[2:4]}_" in check.hints[-1]
    assert check.grade_ids and get(check.hint_key) is check
    assert all(len(h) > 20 for h in check.hints)


@pytest.mark.parametrize("nn, cell, blank", list(_cells("grade")))
def test_graded_test_cells_hold_only_check_calls(nn, cell, blank):
    """What the grader parses: `check.<name>(<learner names>)`, nothing else, no hidden tests."""
    assert "HIDDEN TESTS" not in cell.source
    tree = ast.parse(cell.source)
    assert tree.body, "an empty test cell"
    grade_id = cell.metadata["nbgrader"]["grade_id"]
    for statement in tree.body:
        assert isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
        func = statement.value.func
        assert isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        assert func.value.id == "check", "the set-up cell imports the chapter's checks as `check`"
        assert all(isinstance(a, ast.Name) for a in statement.value.args)
        assert not statement.value.keywords
        checker = get(f"ch{nn}.{func.attr}")
        assert grade_id in checker.grade_ids, f"{checker.id} does not list {grade_id}"


@pytest.mark.parametrize("nn, cell, blank", list(_cells("solution")))
def test_an_answer_cell_named_after_a_check_shows_its_tier_one_hint(nn, cell, blank):
    try:
        check = get(cell.metadata["nbgrader"]["grade_id"])
    except ValueError:
        pytest.skip("this answer cell feeds a check named otherwise (e.g. a prediction)")
    hint_lines = [line.split("# HINT:", 1)[1].strip() for line in cell.source.split("\n")
                  if "# HINT:" in line]
    assert hint_lines == [check.hints[0]]
    assert f"raise NotImplementedError({check.hints[0]!r})" in blank.source
