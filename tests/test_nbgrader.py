"""The real nbgrader grades the chapters as `course grade` does: the solution full marks, the
blank 0, out of the same points.

docs/instructors.md ("Using the notebooks with nbgrader") tells an instructor to put each solution
notebook into an nbgrader assignment of its own, `nbgrader generate_assignment` it, then release,
collect and `nbgrader autograde`. This does exactly that, in throwaway nbgrader courses under
tmp_path: their own nbgrader_config.py, gradebook, kernelspec (this interpreter) and
Jupyter/IPython folders, so no user or global configuration is read or written and nothing
reaches the network.

- Every chapter's assignment is generated (no kernel runs for that), and the gradebook's points
  per grade cell are compared with `course grade`'s.
- A representative set is autograded (`REPRESENTATIVE`: chapter 05, with predictions and the
  cheat below, and chapter 08, the Triton chapter): learner "solved" hands in the solution
  notebook as it is, "blank" the generated release notebook unchanged. The other chapters'
  autograde is the `sweep` marker, which the test command leaves out and `make test-all` runs
  (an instructor's check before a workshop): `.venv/bin/pytest tests/test_nbgrader.py -m sweep`.

nbgrader scores a grade cell 0 when it raises or writes to stderr, its points otherwise, so this
also checks that no check cell of a correct answer writes a warning and that a blank's every
check cell raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from course_tools.grader.read import parse_source

pytest.importorskip("nbgrader", reason="nbgrader is a test dependency: pip install -e .[test]")
from nbgrader.api import Gradebook  # noqa: E402  (after the skip: nbgrader is optional)

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(p.name for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb")
                  if (REPO / "exercises" / p.name).exists())
# autograded by the test command: a chapter with predictions and the cheat, and the Triton one
REPRESENTATIVE = ("05_multihead.ipynb", "08_efficient_kernel.ipynb")
KERNEL = "attention-course-nbgrader-test"
CELL_TIMEOUT = 120  # seconds per cell, as the suite's nbval runs (each notebook runs in < 60 s)
TOTAL_TIMEOUT = 600  # seconds for one nbgrader command (each takes about 90 s here)
STUDENTS = ("solved", "blank")
# A third learner hands in chapter 05 with an answer that rewrites its check's forbid list in the
# kernel, then calls the course's split_heads (which the chapter's own cells use, so it works
# there): nbgrader's own run gives it the points; the course's ReadTheSource preprocessor
# (grader/for_nbgrader.py) gives it 0.
REREGISTER = "object.__setattr__(check.{c}, 'forbid', ())\ncheck.{c}.__post_init__()\n"
CHEATS = {
    "05_multihead.ipynb": ("ch05_split_heads", "ch05_split_heads_test",
                           REREGISTER.format(c="split_heads") +
                           "from course_lib.multihead import split_heads as _s\n"
                           "def split_heads(x, num_heads):\n    return _s(x, num_heads)\n"),
}
COURSES = 2 if (os.cpu_count() or 1) >= 2 else 1  # nbgrader courses graded side by side


def assignment(name: str) -> str:
    return "ch" + name[:2]


def nbgrader(args: list[str], course: Path, env: dict) -> None:
    """One nbgrader command, this interpreter's nbgrader (never a bare `nbgrader` from PATH)."""
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TOTAL_TIMEOUT)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout[-8000:]}"


def isolated_env(tmp: Path) -> dict:
    """The environment nbgrader and its kernels run in: every Jupyter and IPython folder in tmp,
    the kernel this interpreter. TRITON_INTERPRET is removed (the test session's conftest sets
    it): chapter 08's set-up cell chooses Triton's interpreter itself, as on a learner's laptop."""
    kernels = tmp / "jupyter_data" / "kernels" / KERNEL
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (attention course, nbgrader test)", "language": "python"}))
    env = {k: v for k, v in os.environ.items()
           if k not in {"TRITON_INTERPRET", "MPLBACKEND", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH"}}
    for var, folder in {"JUPYTER_CONFIG_DIR": "jupyter_config", "JUPYTER_DATA_DIR": "jupyter_data",
                        "JUPYTER_RUNTIME_DIR": "jupyter_runtime", "IPYTHONDIR": "ipython",
                        "MPLCONFIGDIR": "mplconfig"}.items():
        (tmp / folder).mkdir(exist_ok=True)
        env[var] = str(tmp / folder)
    env["JUPYTER_PATH"] = str(tmp / "jupyter_data")
    # nbgrader runs `alembic` from PATH when it creates a gradebook: this environment's, which
    # is not on PATH when the tests run as .venv/bin/python without activating it
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def write_config(course: Path, db_url: str) -> None:
    (course / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"c.CourseDirectory.db_url = {db_url!r}\n"
        f"c.Execute.kernel_name = {KERNEL!r}\n"
        f"c.Execute.timeout = {CELL_TIMEOUT}\n"
        "c.Execute.startup_timeout = 120\n"
        "from course_tools.grader.for_nbgrader import autograde_preprocessors\n"
        "c.Autograde.autograde_preprocessors = autograde_preprocessors()\n")


def new_course(tmp: Path, names: list[str]) -> tuple[Path, str, dict]:
    """An nbgrader course with the chapters named as its assignments, generated: (its folder, its
    gradebook's URL, the environment its commands run in)."""
    course = tmp / "course"
    course.mkdir(parents=True)
    db_url = f"sqlite:///{course / 'gradebook.db'}"
    env = isolated_env(tmp)
    write_config(course, db_url)
    for name in names:
        (course / "source" / assignment(name)).mkdir(parents=True)
        (course / "source" / assignment(name) / name).write_bytes(
            (REPO / "solutions" / name).read_bytes())
    nbgrader(["generate_assignment", "*"], course, env)  # every assignment in source/
    return course, db_url, env


def grade_course(tmp: Path, names: list[str]) -> dict:
    """One nbgrader course for the chapters named: generate their assignments, hand in both
    learners' notebooks, autograde them all in one call, and read the gradebook:
    {(chapter, student): (score, max_score, {grade cell: (score, max_score)}, the notebook
    nbgrader executed)}."""
    course, db_url, env = new_course(tmp, names)
    for name in names:
        released = (course / "release" / assignment(name) / name).read_bytes()
        handed = [("solved", (REPO / "solutions" / name).read_bytes()), ("blank", released)]
        if name in CHEATS:
            handed.append(("cheat", cheated(name)))
        for student, nb in handed:
            into = course / "submitted" / student / assignment(name)
            into.mkdir(parents=True)
            (into / name).write_bytes(nb)
    nbgrader(["autograde", "*"], course, env)
    results = {}
    with Gradebook(db_url) as gb:
        for name in names:
            for student in STUDENTS + (("cheat",) if name in CHEATS else ()):
                sub = gb.find_submission(assignment(name), student)
                nb = gb.find_submission_notebook(Path(name).stem, assignment(name), student)
                cells = {g.name: (g.score, g.max_score) for g in nb.grades}
                autograded = course / "autograded" / student / assignment(name) / name
                results[name, student] = (sub.score, sub.max_score, cells, autograded)
    return results


def cheated(name: str) -> bytes:
    answer, _, source = CHEATS[name]
    nb = nbformat.read(REPO / "solutions" / name, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == answer:
            cell.source = source
    return nbformat.writes(nb).encode()


def chapters():
    """Every chapter, those outside REPRESENTATIVE marked `sweep` (left out by the test
    command; `make test-all` runs them)."""
    return [name if name in REPRESENTATIVE else pytest.param(name, marks=pytest.mark.sweep)
            for name in CHAPTERS]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Every chapter's assignment generated in one nbgrader course: {chapter: {grade cell:
    points}}, read from its gradebook (no kernel runs)."""
    course, db_url, _ = new_course(tmp_path_factory.mktemp("nbgrader-generate"), CHAPTERS)
    with Gradebook(db_url) as gb:
        return {name: {c.name: c.max_score for c in
                       gb.find_notebook(Path(name).stem, assignment(name)).grade_cells}
                for name in CHAPTERS
                if (course / "release" / assignment(name) / name).exists()}


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    """The chapters this run's selected tests ask for, autograded by nbgrader. With two cores
    and more than one chapter, two independent nbgrader courses (each its own folders, gradebook
    and kernels; nothing shared) grade half of them each at the same time."""
    wanted = sorted({item.callspec.params["name"] for item in request.session.items
                     if getattr(item, "module", None) is request.module
                     and "graded" in item.fixturenames
                     and "name" in getattr(getattr(item, "callspec", None), "params", {})})
    tmp = tmp_path_factory.mktemp("nbgrader")
    courses = max(1, min(COURSES, len(wanted)))
    groups = [wanted[i::courses] for i in range(courses)]
    with ThreadPoolExecutor(courses) as pool:
        parts = pool.map(grade_course, [tmp / f"course{i}" for i in range(courses)], groups)
        return {key: value for part in parts for key, value in part.items()}


def outputs(autograded: Path, cells: list[str]) -> dict:
    """What each grade cell named printed to stderr or raised, as nbgrader executed it."""
    nb = nbformat.read(autograded, as_version=4)
    said = {}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in cells:
            said[gid] = [o.get("text") or f"{o.get('ename')}: {o.get('evalue')}"[:2000]
                         for o in cell.get("outputs", [])
                         if o.output_type == "error" or o.get("name") == "stderr"]
    return said


@pytest.mark.parametrize("name", chapters())
def test_nbgrader_gives_the_solution_full_marks(graded, name):
    """A grade cell loses its points in nbgrader when it raises or writes to stderr."""
    score, max_score, cells, autograded = graded[name, "solved"]
    assert score == max_score > 0, outputs(autograded, [c for c, s in cells.items() if s[0] < s[1]])


@pytest.mark.parametrize("name", chapters())
def test_nbgrader_gives_the_blank_zero(graded, name):
    """Every check cell of the generated student version raises."""
    score, max_score, cells, _ = graded[name, "blank"]
    assert score == 0 and max_score > 0, {c: s for c, s in cells.items() if s[0]}


@pytest.mark.parametrize("name", CHAPTERS)
def test_nbgrader_counts_the_points_course_grade_counts(generated, name):
    """The same graded cells, each worth the same points, in both graders (read from the
    gradebook nbgrader's generate_assignment wrote)."""
    source = parse_source(REPO / "solutions" / name,
                          nbformat.read(REPO / "solutions" / name, as_version=4))
    ours = {gid: points for gid, points, _ in source.graded}
    assert generated[name] == ours


@pytest.mark.parametrize("name", chapters())
def test_an_autograded_submission_is_scored_out_of_those_points(graded, name):
    """What nbgrader's autograde recorded for each learner: out of the same points."""
    ours = sum(points for _, points, _ in parse_source(
        REPO / "solutions" / name, nbformat.read(REPO / "solutions" / name, as_version=4)).graded)
    for student in STUDENTS:
        _, max_score, cells, _ = graded[name, student]
        assert max_score == ours == sum(m for _, m in cells.values())


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_nbgrader_with_the_courses_reading_of_the_source_gives_a_cheat_zero(graded, name):
    """The cheat's check passes in the kernel (its forbid list is gone there); the preprocessor
    adds an error to its grade cell and to every one judged after it, as `course grade` does."""
    score, max_score, cells, autograded = graded[name, "cheat"]
    _, test, _ = CHEATS[name]
    assert cells[test][0] == 0, cells
    said = outputs(autograded, [test])[test]
    assert any("FlaggedByCourseGrader" in s and "rules out" in s for s in said), said
    cell = next(c for c in nbformat.read(autograded, as_version=4).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == test)
    printed = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
    assert printed.startswith("✔"), printed  # in the kernel, the disarmed check passed
    assert score < max_score
