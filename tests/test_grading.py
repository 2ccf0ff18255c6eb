"""The grader: honest scores, hostile submissions, and every chapter's solution/blank extremes.

Slow parts run once per module: one `course grade --json` over a folder of hostile fixture
notebooks (built here, in tmp), and one `grade()` over every chapter's solution and exercise
notebooks. The tests then read those results.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import functools
import importlib
import io
import json
import os
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

import course_lib.lookup as lookup
from course_tools import cli
from course_tools import grader as grading
from course_lib.checks import _core, ch01
from course_lib.checks._core import CheckFailure, ReferenceCall, forbid
from course_tools.exercises import hints, student_version
from course_lib.lookup import soft_lookup as aliased_reference

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 5          # seconds per cell for the fixture notebooks (their cells take milliseconds)
MEMORY_MB = 1024     # cap for the fixture kernels (they do not import torch)


# ---------------------------------------------------------------------------------------------
# A small source notebook in nbgrader format, and hostile variants of it


def _meta(grade_id, *, grade=False, solution=False, locked=True, points=None):
    m = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def _answer(gid, body):
    return nbformat.v4.new_code_cell(body, metadata=_meta(gid, solution=True, locked=False))


def _test(gid, body, points):
    return nbformat.v4.new_code_cell(body, metadata=_meta(gid, grade=True, points=points))


def source_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Fixture exercises"),
        nbformat.v4.new_code_cell("import os\nFACTOR = 2", metadata=_meta("fx_setup")),
        _answer("fx_double", "def double(x):\n    # HINT: multiply by FACTOR\n    ### BEGIN SOLUTION\n"
                             "    return FACTOR * x\n    ### END SOLUTION"),
        _test("fx_double_test", 'assert double(3) == 6, "double(3) should be 6"\n'
                                "### BEGIN HIDDEN TESTS\n"
                                'assert double(-1) == -2, "hidden test: double(-1) should be -2"\n'
                                "### END HIDDEN TESTS", 2),
        _answer("fx_square", "def square(x):\n    # HINT: x times x\n    ### BEGIN SOLUTION\n"
                             "    return x * x\n    ### END SOLUTION"),
        _test("fx_square_test", 'assert square(4) == 16, "square(4) should be 16"', 3),
        _answer("fx_inc", "def inc(x):\n    # HINT: add one\n    ### BEGIN SOLUTION\n"
                          "    return x + 1\n    ### END SOLUTION"),
        _test("fx_inc_test", 'assert inc(1) == 2, "inc(1) should be 2"', 1),
    ]
    return nb


SOLVED = {"fx_double": "def double(x):\n    return FACTOR * x",
          "fx_square": "def square(x):\n    return x * x",
          "fx_inc": "def inc(x):\n    return x + 1"}


def submission(**answers):
    """The exercise notebook with some answer cells filled in (the rest stay blank)."""
    nb = student_version(source_notebook(), "90_fixture.ipynb")
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def with_cells(nb, edit):
    nb = copy.deepcopy(nb)
    edit(nb.cells)
    return nb


def _gid(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def drop(*gids):
    return lambda cells: cells.__setitem__(slice(None), [c for c in cells if _gid(c) not in gids])


def set_source(gid, text):
    def edit(cells):
        for c in cells:
            if _gid(c) == gid:
                c.source = text
    return edit


FULL = submission(**SOLVED)

# name -> (notebook or raw bytes, expected {exercise: score}, words expected in the feedback)
HOSTILE = {
    "correct.ipynb": (FULL, {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}, {}),
    "blank.ipynb": (submission(), {"fx_double_test": 0, "fx_square_test": 0, "fx_inc_test": 0},
                    {"fx_double_test": "not written yet (hint: multiply by FACTOR)"}),
    "infinite_loop.ipynb": (
        submission(**dict(SOLVED, fx_square="def square(x):\n    while True:\n        pass")),
        {"fx_double_test": 2, "fx_square_test": 0, "fx_inc_test": 1},
        {"fx_square_test": "timed out after"}),
    "loop_ignores_interrupt.ipynb": (
        submission(**dict(SOLVED, fx_square="import signal\ndef square(x):\n"
                                            "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                            "    while True:\n        pass")),
        {"fx_double_test": 2, "fx_square_test": 0, "fx_inc_test": 1},
        {"fx_square_test": "ignored the interrupt"}),
    "os_exit_in_answer.ipynb": (
        submission(**dict(SOLVED, fx_double="def double(x):\n    return FACTOR * x\nimport os\nos._exit(3)")),
        {"fx_double_test": 0, "fx_square_test": 3, "fx_inc_test": 1},
        {"fx_double_test": "kernel died"}),
    "segfault_in_check.ipynb": (
        submission(**dict(SOLVED, fx_square="import ctypes\ndef square(x):\n    return ctypes.string_at(0)")),
        {"fx_double_test": 2, "fx_square_test": 0, "fx_inc_test": 1},
        {"fx_square_test": "kernel died"}),
    "memory_bomb.ipynb": (
        submission(**dict(SOLVED, fx_inc="def inc(x):\n    hog = []\n    while True:\n"
                                         "        hog.append(bytearray(50 * 2**20))")),
        {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 0},
        {"fx_inc_test": "MemoryError"}),
    "output_flood.ipynb": (
        submission(**dict(SOLVED, fx_double="for _ in range(24):\n    print('x' * 2**20)\n" + SOLVED["fx_double"])),
        {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}, {}),
    "leaves_a_child_process.ipynb": (
        submission(**dict(SOLVED, fx_inc="import subprocess, sys\n"
                                         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(424242)'])\n"
                                         + SOLVED["fx_inc"])),
        {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}, {}),
    "kills_the_worker.ipynb": (
        submission(**dict(SOLVED, fx_inc="import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")),
        {"fx_double_test": 0, "fx_square_test": 0, "fx_inc_test": 0}, {}),
    "deleted_cells.ipynb": (
        with_cells(FULL, drop("fx_square_test", "fx_inc")),
        {"fx_double_test": 2, "fx_square_test": 0, "fx_inc_test": 0},
        {"fx_square_test": "cell missing", "fx_inc_test": "answer cell missing"}),
    "renamed_grade_id.ipynb": (
        with_cells(FULL, lambda cells: [c.metadata["nbgrader"].update(grade_id="mine")
                                        for c in cells if _gid(c) == "fx_inc_test"]),
        {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 0},
        {"fx_inc_test": "cell missing"}),
    "edited_tests.ipynb": (
        with_cells(submission(**dict(SOLVED, fx_double="def double(x):\n    return 0")),
                   lambda cells: [set_source("fx_double_test", "pass")(cells),
                                  set_source("fx_setup", "FACTOR = 0")(cells)]),
        {"fx_double_test": 0, "fx_square_test": 3, "fx_inc_test": 1},
        {"fx_double_test": "double(3) should be 6"}),
    "added_cells.ipynb": (
        with_cells(submission(**dict(SOLVED, fx_square="def square(x):\n    return helper(x)")),
                   lambda cells: cells.insert(3, nbformat.v4.new_code_cell("def helper(x):\n    return x ** 2"))),
        {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}, {}),
    "fails_hidden_test.ipynb": (
        submission(**dict(SOLVED, fx_double="def double(x):\n    return 6 if x == 3 else 0")),
        {"fx_double_test": 0, "fx_square_test": 3, "fx_inc_test": 1},
        {"fx_double_test": "hidden test: double(-1)"}),
    "writes_and_deletes_files.ipynb": (
        submission(**dict(SOLVED, fx_double=(
            "import glob, os\n"
            "for p in set(map(os.path.realpath, glob.glob('*.ipynb') + glob.glob('../*/*.ipynb'))):\n"
            "    os.remove(p)\n"
            "open('pwned.txt', 'w').write('x')\nopen('../pwned.txt', 'w').write('x')\n"
            "os.chmod('.', 0o500)\n"
            + SOLVED["fx_double"]))),
        {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}, {}),
    "renamed copy (2).ipynb": (
        with_cells(FULL, lambda cells: None).copy() | {"metadata": {}},
        {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}, {}),
    "not_json.ipynb": (b"this is not { a notebook", None, "not a readable Jupyter notebook"),
    "binary.ipynb": (bytes(range(256)) * 8, None, "not a readable Jupyter notebook"),
    "empty.ipynb": (b"", None, "not a readable Jupyter notebook"),
    "json_but_not_notebook.ipynb": (b'{"cells": 5, "hello": [1, 2]}', None, "not a readable Jupyter notebook"),
    "malformed_cells.ipynb": (
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                    "cells": [{"cell_type": "code", "source": 7, "metadata": {"nbgrader": "x"}},
                              "junk", {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "fx_inc"}},
                                       "source": ["def inc(x):\n", "    return x + 1\n"], "outputs": []},
                              {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "fx_inc_test"}},
                               "source": "", "outputs": []}]}).encode(),
        {"fx_double_test": 0, "fx_square_test": 0, "fx_inc_test": 1}, {"fx_double_test": "cell missing"}),
    "unrelated_notebook.ipynb": (nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]),
                                 None, "matches no notebook"),
}


if not sys.platform.startswith("linux"):  # the memory cap is Linux-only; elsewhere a bomb is not capped
    HOSTILE.pop("memory_bomb.ipynb")
if os.name != "posix":  # signals and process groups: POSIX only
    for _name in ("loop_ignores_interrupt.ipynb", "kills_the_worker.ipynb", "segfault_in_check.ipynb"):
        HOSTILE.pop(_name)


def _write(folder: Path, name: str, content) -> Path:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(nbformat.writes(nbformat.from_dict(content)), encoding="utf-8")
    return path


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: grading.file_digest(p) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def fixture_course(tmp_path_factory):
    root = tmp_path_factory.mktemp("grading")
    solutions = root / "solutions"
    solutions.mkdir()
    nbformat.write(source_notebook(), solutions / "90_fixture.ipynb")
    subs = root / "submissions"
    subs.mkdir()
    for name, (content, _, _) in HOSTILE.items():
        _write(subs, name, content)
    return root, solutions, subs


@pytest.fixture(scope="module")
def hostile_run(fixture_course):
    """ONE `course grade --json` over every hostile submission: it must run to the end."""
    root, solutions, subs = fixture_course
    before = _digests(subs)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["grade", str(subs), "--json", "--timeout", str(TIMEOUT),
                           "--memory-mb", str(MEMORY_MB), "--solutions", str(solutions)])
    return status, json.loads(out.getvalue()), before, _digests(subs), subs


def test_hostile_run_finishes_with_status_0_and_one_result_each(hostile_run):
    status, results, _, _, subs = hostile_run
    assert status == 0
    assert sorted(Path(r["submission"]).name for r in results) == sorted(HOSTILE)
    for r in results:
        assert set(r) == {"submission", "score", "max_score", "exercises", "error"}
        for e in r["exercises"]:
            assert set(e) == {"id", "score", "max_score", "feedback"}


def test_every_submission_file_is_byte_identical_and_nothing_was_added(hostile_run):
    _, _, before, after, subs = hostile_run
    assert after == before
    assert not (subs / "pwned.txt").exists() and not (subs.parent / "pwned.txt").exists()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_no_process_started_by_a_submission_outlives_grading(hostile_run):
    lingering = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if b"time.sleep(424242)" in cmdline.read_bytes():
                lingering.append(cmdline.parent.name)
    assert lingering == []


def _by_name(results):
    return {Path(r["submission"]).name: r for r in results}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_case_scores(hostile_run, name):
    _, results, _, _, _ = hostile_run
    r = _by_name(results)[name]
    _, expected, words = HOSTILE[name]
    if expected is None:  # not gradable: an error, no exercises, 0 points
        assert r["exercises"] == [] and r["score"] == 0 and words in r["error"]
        return
    got = {e["id"]: e["score"] for e in r["exercises"]}
    assert got == expected, [(e["id"], e["feedback"]) for e in r["exercises"]]
    assert r["score"] == sum(expected.values()) and r["max_score"] == 6
    feedback = {e["id"]: e["feedback"] for e in r["exercises"]}
    for gid, score in got.items():
        if score == {"fx_double_test": 2, "fx_square_test": 3, "fx_inc_test": 1}[gid]:
            assert feedback[gid] == "passed"
        else:
            assert feedback[gid] and feedback[gid] != "passed"
    for gid, word in words.items():
        assert word in feedback[gid], feedback[gid]


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_a_worker_killed_by_its_kernel_costs_only_that_submission(hostile_run):
    _, results, _, _, _ = hostile_run
    r = _by_name(results)["kills_the_worker.ipynb"]
    assert r["error"] and "worker stopped" in r["error"]
    assert _by_name(results)["correct.ipynb"]["error"] is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory cap is Linux-only")
def test_a_cap_too_small_for_python_itself_is_reported_not_crashed(fixture_course):
    _, solutions, subs = fixture_course
    (r,) = grading.grade([subs / "correct.ipynb"], timeout=TIMEOUT, memory_mb=40, solutions_dir=solutions)
    assert r.score == 0 and "could not start" in r.error and "40 MB" in r.error
    assert all("could not start" in e.feedback and "[" not in e.feedback for e in r.exercises)


# ---------------------------------------------------------------------------------------------
# Check (learners): no hidden tests, hints in the table; CSV/table formats


def test_check_runs_without_hidden_tests_and_shows_hints(fixture_course, capsys):
    _, solutions, _ = fixture_course
    folder = fixture_course[0] / "learner"
    folder.mkdir()
    # double passes its visible test but not the hidden one; square is still blank
    nb = submission(fx_double="def double(x):\n    return 6 if x == 3 else 0", fx_inc=SOLVED["fx_inc"])
    path = _write(folder, "mine.ipynb", nb)
    before = grading.file_digest(path)
    assert cli.main(["check", str(path), "--timeout", str(TIMEOUT), "--solutions", str(solutions)]) == 0
    out = capsys.readouterr().out
    assert "total 3/6" in out and "hidden" not in out.split("total")[1].split("exercise(s) to go")[0]
    assert "fx_square_test" in out and "hint: x times x" in out and "hint: multiply" not in out
    assert "1 exercise(s) to go" in out
    assert grading.file_digest(path) == before and sorted(folder.iterdir()) == [path]


def test_check_works_from_the_exercise_notebooks_when_solutions_are_not_handed_out(fixture_course, capsys):
    root, _, subs = fixture_course
    exercises = root / "exercises_only"
    exercises.mkdir()
    nbformat.write(submission(), exercises / "90_fixture.ipynb")  # the blank exercise as the source
    nb = submission(fx_double="def double(x):\n    return 6 if x == 3 else 0", fx_inc=SOLVED["fx_inc"])
    path = _write(root, "mine_too.ipynb", nb)
    assert cli.main(["check", str(path), "--timeout", str(TIMEOUT), "--solutions", str(exercises)]) == 0
    out = capsys.readouterr().out
    assert "total 3/6" in out and "hint: x times x" in out


def test_csv_and_table_formats():
    r = grading.SubmissionResult("a.ipynb", [grading.ExerciseResult("ex1_test", 2, 2, "passed"),
                                             grading.ExerciseResult("ex2_test", 0, 3, "wrong, " * 40)],
                                 source="solutions/01_x.ipynb")
    bad = grading.SubmissionResult("b.ipynb", error="not a readable Jupyter notebook (x)")
    rows = list(csv.reader(io.StringIO(grading.format_csv([r, bad]))))
    assert rows[0] == ["submission", "exercise", "score", "max_score", "feedback"]
    assert rows[1] == ["a.ipynb", "ex1_test", "2", "2", "passed"]
    assert rows[2][:4] == ["a.ipynb", "ex2_test", "0", "3"] and rows[2][4] == "wrong, " * 40
    assert rows[3] == ["b.ipynb", "", "0", "0", "not a readable Jupyter notebook (x)"]
    table = grading.format_table([r, bad])
    assert "total 2/5" in table and "ex1_test" in table and "2/2" in table and "0/3" in table
    assert "…" in table and max(map(len, table.splitlines())) <= 115
    assert "error: not a readable" in table and "2 submissions graded" in table
    assert json.loads(grading.format_json([r]))[0]["score"] == 2


def test_cli_csv_on_real_files(fixture_course, capsys):
    _, solutions, subs = fixture_course
    status = cli.main(["grade", str(subs / "correct.ipynb"), str(subs / "not_json.ipynb"), "--csv",
                       "--timeout", str(TIMEOUT), "--solutions", str(solutions)])
    assert status == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0] == "submission,exercise,score,max_score,feedback" and len(rows) == 5
    assert rows[1].endswith("fx_double_test,2,2,passed")


def test_missing_path_is_reported_with_status_1(fixture_course, capsys):
    _, solutions, _ = fixture_course
    assert cli.main(["grade", "/nonexistent/x.ipynb", "--json", "--solutions", str(solutions)]) == 1
    assert "file not found" in json.loads(capsys.readouterr().out)[0]["error"]


# ---------------------------------------------------------------------------------------------
# Assembling and matching (pure, fast)


def test_matching_by_metadata_ids_and_name(fixture_course):
    _, solutions, _ = fixture_course
    sources = grading.load_sources(solutions)
    assert grading.match_source(FULL, sources, "whatever.ipynb").name == "90_fixture.ipynb"
    no_ids = with_cells(submission(), lambda cells: [c.metadata.clear() for c in cells])
    assert grading.match_source(no_ids, sources, "x.ipynb").name == "90_fixture.ipynb"  # metadata
    no_ids.metadata.clear()
    assert grading.match_source(no_ids, sources, "x.ipynb") is None
    assert grading.match_source(no_ids, sources, "90_fixture.ipynb").name == "90_fixture.ipynb"


def test_assemble_takes_locked_cells_from_the_source_with_hidden_tests(fixture_course):
    _, solutions, subs = fixture_course
    source = grading.load_sources(solutions)["90_fixture.ipynb"]
    edited = HOSTILE["edited_tests.ipynb"][0]
    plan = grading.assemble(source, edited, hidden=True)
    by_id = {c.grade_id: c for c in plan.cells}
    assert by_id["fx_setup"].source == "import os\nFACTOR = 2"
    assert "hidden test" in by_id["fx_double_test"].source
    assert by_id["fx_double"].source == "def double(x):\n    return 0"
    plan = grading.assemble(source, edited, hidden=False)
    assert "hidden test" not in {c.grade_id: c for c in plan.cells}["fx_double_test"].source


# ---------------------------------------------------------------------------------------------
# forbid: an answer that runs the course's own reference is flagged, in every alias form


def _own_soft_lookup(q, k, v, t=1.0):
    s = k @ q / t
    e = np.exp(s - s.max())
    w = e / e.sum()
    return w @ v, w


class _CallableAlias:
    def __call__(self, *a):
        return aliased_reference(*a)


def _swallows(q, k, v, t=1.0):
    try:
        lookup.soft_lookup(q, k, v, t)
    except Exception:  # noqa: BLE001 - the cheat hides the trap's error; still flagged
        pass
    return aliased_reference(q, k, v, t)


def _switches_off_tracking(q, k, v, t=1.0):
    import sys

    sys.setprofile(None)
    return aliased_reference(q, k, v, t)


CHEATS = {
    "the reference itself": aliased_reference,
    "alias imported before the check": lambda q, k, v, t=1.0: aliased_reference(q, k, v, t),
    "module attribute": lambda q, k, v, t=1.0: lookup.soft_lookup(q, k, v, t),
    "functools.partial": functools.partial(aliased_reference),
    "callable object": _CallableAlias(),
    "catches the trap": _swallows,
    "switches off the tracking": _switches_off_tracking,
    "via importlib.reload": lambda q, k, v, t=1.0: importlib.reload(lookup).soft_lookup(q, k, v, t),
}


@pytest.mark.parametrize("name", list(CHEATS))
def test_forbid_flags_every_form_of_calling_the_reference(name):
    original = lookup.soft_lookup
    try:
        with pytest.raises(ReferenceCall) as info:
            ch01.soft_lookup(CHEATS[name])
    finally:
        lookup.soft_lookup = original  # the reload case re-created the module's functions
    assert "calls the course's own" in str(info.value) or "call tracking" in str(info.value)
    assert isinstance(info.value, CheckFailure)


def test_forbid_passes_an_honest_answer_and_restores_everything(capsys):
    before = lookup.soft_lookup
    import sys

    profile = sys.getprofile()
    ch01.soft_lookup(_own_soft_lookup)
    assert capsys.readouterr().out.startswith("✔")
    assert lookup.soft_lookup is before and sys.getprofile() is profile


def test_forbid_lets_the_checker_call_the_reference_through_an_alias():
    q, k, v = np.ones(2), np.eye(2), np.arange(2.0)

    def checker(fn):
        with forbid((lookup, "soft_lookup"), exercise="x"):
            want = aliased_reference(q, k, v)  # the checker's own reference: allowed
            got = _core.call(fn, q, k, v)
        return want, got

    checker(_own_soft_lookup)
    with pytest.raises(ReferenceCall):
        checker(lambda *a: aliased_reference(*a))


def test_forbid_keeps_the_original_behaviour_for_the_module_attribute():
    with pytest.raises(CheckFailure, match="calls the course's own `course_lib.lookup.soft_lookup`"):
        with forbid((lookup, "soft_lookup"), exercise="x"):
            lookup.soft_lookup(np.ones(2), np.eye(2), np.ones(2))
    assert lookup.soft_lookup is aliased_reference


def test_forbid_flags_an_aliased_builtin_but_not_the_checkers_own_call():
    import torch
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention  # the alias a learner imports before the check
    q = torch.randn(3, 4)

    def checker(fn):
        with forbid((F, "scaled_dot_product_attention"), exercise="attention"):
            want = sdpa(q, q, q)  # the checker's own reference: allowed
            got = _core.call(fn, q, q, q)
        _core.expect_close(got, want, "out")

    checker(lambda a, b, c: torch.softmax(a @ b.T / 2.0, dim=-1) @ c)
    with pytest.raises(ReferenceCall, match="torch.nn.functional.scaled_dot_product_attention"):
        checker(lambda a, b, c: sdpa(a, b, c))
    with pytest.raises(ReferenceCall):
        checker(sdpa)
    assert F.scaled_dot_product_attention is sdpa


def test_forbid_flags_a_reference_method_reached_through_a_subclass():
    class Reference:  # stands for a course_lib class whose method the exercise asks for
        def forward(self, x):
            return 2 * x

    class Learner(Reference):
        def __call__(self, x):
            return super().forward(x)

    def checker(fn):
        with forbid((Reference, "forward"), exercise="forward"):
            return _core.call(fn, 3)

    assert checker(lambda x: x + x) == 6
    with pytest.raises(ReferenceCall, match="Reference.forward"):
        checker(Learner())
    with pytest.raises(ReferenceCall):
        checker(Reference().forward)  # a bound method of the reference


def test_forbid_does_not_mask_other_failures_of_an_honest_answer():
    with pytest.raises(CheckFailure) as info:
        ch01.soft_lookup(lambda q, k, v, t=1.0: (None, None))
    assert not isinstance(info.value, ReferenceCall)


# ---------------------------------------------------------------------------------------------
# Every chapter: its solution scores full points, its blank exercise 0; a reference-calling
# answer is flagged (chapter 01). Chapters are discovered, so new ones are covered as they land.

CHAPTERS = sorted(p.name for p in (REPO / "solutions").glob("*.ipynb") if (REPO / "exercises" / p.name).exists())


@pytest.fixture(scope="module")
def chapter_run(tmp_path_factory):
    """Grade a snapshot of every chapter's solution and blank exercise in one run (snapshots, so
    an author re-executing a notebook meanwhile cannot make the results race)."""
    snap = tmp_path_factory.mktemp("chapters")
    paths = {}
    for name in CHAPTERS:
        for folder in ("solutions", "exercises"):
            (snap / folder).mkdir(exist_ok=True)
            copy_path = snap / folder / name
            copy_path.write_bytes((REPO / folder / name).read_bytes())
            paths[(folder, name)] = copy_path
    cheat = None
    if "01_soft_dictionary.ipynb" in CHAPTERS:  # two hostile submissions of a real chapter
        def variant(gid, source, name):
            nb = nbformat.read(REPO / "solutions" / "01_soft_dictionary.ipynb", as_version=4)
            for cell in nb.cells:
                if cell.metadata.get("nbgrader", {}).get("grade_id") == gid:
                    cell.source = source
            nbformat.write(nb, snap / name)
            return snap / name
        cheat = paths[("cheat", "01")] = variant(
            "ch01_soft_lookup", "from course_lib.lookup import soft_lookup as mine\n\n"
            "def soft_lookup(query, keys, values, temperature=1.0):\n"
            "    return mine(query, keys, values, temperature)", "01_reference_alias.ipynb")
        paths[("exit", "01")] = variant("ch01_softmax", "import os\nos._exit(1)", "01_os_exit.ipynb")
    paths[("junk", "")] = snap / "junk.ipynb"
    paths[("junk", "")].write_bytes(b"\x00not a notebook")
    before = {p: grading.file_digest(p) for p in paths.values()}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # ONE command over every chapter plus hostile cases
        status = cli.main(["grade", *map(str, paths.values()), "--json", "--timeout", "120"])
    assert status == 0
    after = {p: grading.file_digest(p) for p in paths.values()}
    by_path = {Path(r["submission"]): r for r in json.loads(out.getvalue())}
    return {key: by_path[p] for key, p in paths.items()}, cheat, before, after


def test_chapter_notebooks_are_byte_identical_after_grading(chapter_run):
    _, _, before, after = chapter_run
    assert after == before


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_solution_scores_full_points(chapter_run, name):
    r = chapter_run[0][("solutions", name)]
    assert r["error"] is None and len(r["exercises"]) >= 3
    assert r["score"] == r["max_score"] > 0, [(e["id"], e["feedback"]) for e in r["exercises"]
                                              if e["feedback"] != "passed"]


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_blank_exercise_scores_zero(chapter_run, name):
    """The one run of every blank exercise in the suite: each exercise fails as "not written
    yet" with one of its hints, and nothing else (a set-up cell, a check) breaks."""
    r = chapter_run[0][("exercises", name)]
    assert r["error"] is None and r["score"] == 0 and r["max_score"] > 0
    the_hints = hints(nbformat.read(REPO / "solutions" / name, as_version=4))
    for e in r["exercises"]:
        assert "not written yet" in e["feedback"], e
        assert any(h in e["feedback"] for h in the_hints), e
        assert "set-up cell" not in e["feedback"], e


def test_hostile_submissions_of_a_real_chapter(chapter_run):
    results, cheat = chapter_run[:2]
    assert results[("junk", "")]["error"].startswith("not a readable Jupyter notebook")
    if cheat is None:
        pytest.skip("chapter 01 is not there")
    by_id = {e["id"]: e for e in results[("cheat", "01")]["exercises"]}
    flagged = by_id.pop("ch01_soft_lookup_test")
    assert flagged["score"] == 0 and flagged["feedback"].startswith(grading.FLAG)
    assert "calls the course's own `course_lib.lookup.soft_lookup`" in flagged["feedback"]
    assert all(e["score"] == e["max_score"] for e in by_id.values())
    # os._exit in the softmax answer: that exercise and the one that needs softmax fail, the
    # kernel is restarted, and the others still score.
    by_id = {e["id"]: e for e in results[("exit", "01")]["exercises"]}
    assert by_id["ch01_softmax_test"]["score"] == 0 and "kernel died" in by_id["ch01_softmax_test"]["feedback"]
    assert by_id["ch01_scores_test"]["score"] == by_id["ch01_scores_test"]["max_score"]
    assert by_id["ch01_gradient_test"]["score"] == by_id["ch01_gradient_test"]["max_score"]
