"""The Checks of chapters 01-08 and the solution notebooks that use them agree: graded test cells
hold only check calls (the grader reads them with `ast`), every check has tiered hints whose
first tier is the `# HINT:` line, and neither that nudge nor the student cell gives the solution
away (issue 13: no more than a third of the solution's 3-token sequences)."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.checks import Check, get, hint
from course_lib.checks._protocol import all_checks
from course_tools.exercises import student_version

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = [f"{n:02d}" for n in range(1, 9)]
SOLUTIONS = {nn: next((ROOT / "solutions").glob(f"{nn}_*.ipynb")) for nn in CHAPTERS}
CHECKS = [c for c in all_checks() if c.id[2:4] in CHAPTERS]
TOKEN = re.compile(r"\w+|[^\w\s]")


def _grams(text: str) -> set:
    tokens = TOKEN.findall(text)
    return {tuple(tokens[i:i + 3]) for i in range(len(tokens) - 2)}


def _solution_code(source: str) -> str:
    lines, inside = [], False
    for line in source.split("\n"):
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside:
            lines.append(line)
    return "\n".join(lines)


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
def test_the_hint_line_is_the_tier_one_nudge_and_gives_nothing_away(nn, cell, blank):
    grade_id = cell.metadata["nbgrader"]["grade_id"]
    check = get(grade_id)
    hint_lines = [line.split("# HINT:", 1)[1].strip() for line in cell.source.split("\n")
                  if "# HINT:" in line]
    assert hint_lines == [check.hints[0]]
    solution = _grams(_solution_code(cell.source))
    assert solution, "an answer cell without solution code"
    for text, what in ((check.hints[0], "the tier-1 hint"), (blank.source, "the student cell")):
        shared = len(solution & _grams(text)) / len(solution)
        assert shared <= 1 / 3, f"{what} shares {shared:.0%} of the solution's 3-token sequences"
    assert f"raise NotImplementedError({check.hints[0]!r})" in blank.source


def test_hint_tiers_on_request(capsys):
    hint("ch03_jacobian", 2)
    out = capsys.readouterr().out
    assert out.startswith("Hint 2 of 4 for ch03_jacobian: ") and "quotient rule" in out
    assert 'check.hint("ch03_jacobian", 3)' in out
