"""The one-source exercise pipeline: solutions/ -> exercises/, and what the blank exercises do."""

import json
from pathlib import Path

import nbformat
import pytest

from course_tools.exercises import (
    BEGIN_SOLUTION,
    ExerciseFormatError,
    build,
    hints,
    hints_in,
    strip_solution,
    student_version,
)

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
IDS = [p.stem for p in SOLUTIONS]


def test_every_chapter_from_01_to_08_that_has_a_lecture_has_an_exercise_set():
    lectures = {p.stem for p in (ROOT / "notebooks").glob("0[1-8]_*.ipynb")}
    assert lectures <= {p.stem for p in SOLUTIONS}, "a lecture notebook has no solutions/ twin"


def test_exercises_folder_is_up_to_date(tmp_path):
    assert build(ROOT / "solutions", ROOT / "exercises", check=True).stale == [], (
        "exercises/ is stale: run `course build-exercises`"
    )


def test_build_is_byte_stable_and_check_detects_staleness(tmp_path):
    first = build(ROOT / "solutions", tmp_path, check=False)
    assert len(first.written) == len(SOLUTIONS)
    snapshot = {p.name: p.read_bytes() for p in tmp_path.glob("*.ipynb")}
    assert build(ROOT / "solutions", tmp_path, check=False).written == []
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.ipynb")} == snapshot
    victim = tmp_path / SOLUTIONS[0].name
    victim.write_text(victim.read_text().replace("YOUR CODE HERE", "edited by hand", 1))
    (tmp_path / "99_orphan.ipynb").write_text("{}")
    stale = build(ROOT / "solutions", tmp_path, check=True).stale
    assert {p.name for p in stale} == {victim.name, "99_orphan.ipynb"}


def test_strip_solution_keeps_indent_and_hint():
    src = ("def f(x):\n    # HINT: double it\n    ### BEGIN SOLUTION\n    return 2 * x\n"
           "    ### END SOLUTION\n")
    out = strip_solution(src, where="t")
    assert out == (
        "def f(x):\n    # HINT: double it\n    # YOUR CODE HERE\n"
        "    raise NotImplementedError('double it')\n"
    )
    assert "hidden" not in strip_solution(
        "a = 1\n### BEGIN HIDDEN TESTS\nhidden\n### END HIDDEN TESTS\n", where="t"
    )


@pytest.mark.parametrize(
    "src,msg",
    [
        ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n### END SOLUTION\n", "without its BEGIN"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "nested"),
    ],
)
def test_malformed_markers_are_reported(src, msg):
    with pytest.raises(ExerciseFormatError, match=msg):
        strip_solution(src, where="cell 3")


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_solution_notebook_is_well_formed(path):
    nb = nbformat.read(path, as_version=4)
    graded = [dict(c.metadata["nbgrader"], cell_index=i) for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(graded) >= 3, "each chapter needs at least 3 graded exercises"
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids)), "grade_id values must be unique"
    for cell in graded:
        assert cell["points"] > 0 and cell["locked"] is True
    answer_cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert answer_cells and all(
        BEGIN_SOLUTION in c.source for c in answer_cells if c.cell_type == "code"
    )
    assert len(hints(nb)) >= len(graded), "every answer region needs a `# HINT:` line above it"
    student = student_version(nb, path.name)
    assert "### BEGIN SOLUTION" not in json.dumps(student) and "HIDDEN TESTS" not in json.dumps(
        student
    )


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_blank_exercise_stubs_raise_their_hints(path):
    """Each answer region of the exercise becomes a stub raising NotImplementedError(its hint).

    Running the blank exercises is done once, in the shared graded batch (test_graded_batch.py)
    (every blank scores 0, each exercise failing as "not written yet" with its hint and no
    set-up cell failing); this test checks statically what that run relies on."""
    source = nbformat.read(path, as_version=4)
    student = nbformat.read(ROOT / "exercises" / path.name, as_version=4)
    assert hints(student) == hints(source) and hints(source)
    for cell in student.cells:
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        for hint in hints_in(cell.source):
            assert f"raise NotImplementedError({hint!r})" in cell.source, cell.source
