"""The grader: honest scores, hostile submissions, and every chapter's solution/blank extremes.

Slow parts run once: one `course grade --json` over a folder of hostile fixture notebooks
(tests/grading_fixture.py: a small course whose checks are `Check`s), per module; every chapter's
solution and exercise notebooks plus hostile variants of chapter 01 are graded in the test
run's shared batch (tests/test_graded_batch.py). The attacks on the grader itself:
tests/test_grading_attacks.py.
"""

from __future__ import annotations

import contextlib
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
from grading_fixture import (
    POINTS,
    SOLVED,
    course_with,
    drop,
    gid_of,
    set_source,
    solved,
    submission,
    with_cells,
    write,
)

import course_lib.lookup as lookup
from course_lib.checks import _core, ch01
from course_lib.checks._core import CheckFailure
from course_lib.checks._trap import ReferenceCall, forbid
from course_lib.lookup import soft_lookup as aliased_reference
from course_tools import cli
from course_tools import grader as grading
from course_tools.grader import sandbox

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 5  # seconds per cell for the fixture notebooks (their cells take milliseconds)
MEMORY_MB = 1024  # cap for the fixture kernels (they do not import torch)
SANDBOXED = sandbox.unavailable() is None
FULL = solved()



def fails(**words: str | None) -> tuple[dict, dict]:
    """The expected scores and feedback of a submission that loses the exercises named: full
    points but 0 for each, whose feedback holds the words given (None: no words asserted)."""
    return POINTS | dict.fromkeys(words, 0), {k: w for k, w in words.items() if w is not None}


# name -> (notebook or raw bytes, expected {exercise: score}, words expected in the feedback)
HOSTILE = {
    "correct.ipynb": (FULL, POINTS, {}),
    "blank.ipynb": (submission(), *fails(fx_double_test="not written yet. Hint: multiply by FACTOR",
                                         fx_square_test=None, fx_inc_test=None)),
    "infinite_loop.ipynb": (
        solved(fx_square="def square(x):\n    while True:\n        pass"),
        *fails(fx_square_test="timed out after")),
    "loop_ignores_interrupt.ipynb": (
        solved(fx_square="import signal\ndef square(x):\n"
                         "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                         "    while True:\n        pass"),
        *fails(fx_square_test="ignored the interrupt")),
    "os_exit_in_answer.ipynb": (
        solved(fx_double="def double(x):\n    return FACTOR * x\nimport os\nos._exit(3)"),
        *fails(fx_double_test="kernel died")),
    "segfault_in_check.ipynb": (
        solved(fx_square="import faulthandler\ndef square(x):\n    faulthandler._sigsegv()"),
        *fails(fx_square_test="kernel died")),
    # Allocated, never touched: the cap stops it within milliseconds however busy the machine
    # is (a bytearray zero-fills its pages, which took over the 5 s limit under load).
    "memory_bomb.ipynb": (
        solved(fx_inc="import numpy as np\ndef inc(x):\n    hog = []\n    while True:\n"
                      "        hog.append(np.empty(50 * 2**20, dtype=np.uint8))"),
        *fails(fx_inc_test="MemoryError")),
    "output_flood.ipynb": (
        solved(fx_double="for _ in range(24):\n    print('x' * 2**20)\n" + SOLVED["fx_double"]),
        POINTS, {}),
    "deleted_cells.ipynb": (
        with_cells(FULL, drop("fx_square_test", "fx_inc")),
        *fails(fx_square_test="cell missing", fx_inc_test="answer cell missing")),
    "renamed_grade_id.ipynb": (
        with_cells(FULL, lambda cells: [c.metadata["nbgrader"].update(grade_id="mine")
                                        for c in cells if gid_of(c) == "fx_inc_test"]),
        *fails(fx_inc_test="cell missing")),
    "edited_tests.ipynb": (
        with_cells(solved(fx_double="def double(x):\n    return 0"),
                   lambda cells: [set_source("fx_double_test", "pass")(cells),
                                  set_source("fx_setup", "FACTOR = 0")(cells)]),
        *fails(fx_double_test="double(3) should be 6")),
    "added_cells.ipynb": (
        with_cells(solved(fx_square="def square(x):\n    return helper(x)"),
                   lambda cells: cells.insert(3, nbformat.v4.new_code_cell(
                       "def helper(x):\n    return x ** 2"))),
        POINTS, {}),
    "fails_hidden_test.ipynb": (
        solved(fx_double="def double(x):\n    return 6 if x == 3 else 0"),
        *fails(fx_double_test="double(-1) should be -2")),
    "writes_and_deletes_its_own_files.ipynb": (
        solved(fx_double="import glob, os\nfor p in glob.glob('*.ipynb'):\n    os.remove(p)\n"
                         "open('mine.txt', 'w').write('x')\nos.chmod('.', 0o500)\n"
                         + SOLVED["fx_double"]),
        POINTS, {}),
    "renamed copy (2).ipynb": (with_cells(FULL, lambda cells: None).copy() | {"metadata": {}},
                               POINTS, {}),
    "not_json.ipynb": (b"this is not { a notebook", None, "not a readable Jupyter notebook"),
    "binary.ipynb": (bytes(range(256)) * 8, None, "not a readable Jupyter notebook"),
    "empty.ipynb": (b"", None, "not a readable Jupyter notebook"),
    "json_but_not_notebook.ipynb": (b'{"cells": 5, "hello": [1, 2]}', None,
                                    "not a readable Jupyter notebook"),
    "malformed_cells.ipynb": (
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
            {"cell_type": "code", "source": 7, "metadata": {"nbgrader": "x"}}, "junk",
            {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "fx_inc"}},
             "source": ["def inc(x):\n", "    return x + 1\n"], "outputs": []},
            {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "fx_inc_test"}},
             "source": "", "outputs": []}]}).encode(),
        *fails(fx_double_test="cell missing", fx_square_test=None)),
    "unrelated_notebook.ipynb": (
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), None,
        "matches no notebook"),
}


if not sys.platform.startswith("linux"):  # the memory cap is Linux-only
    HOSTILE.pop("memory_bomb.ipynb")
if os.name != "posix":  # signals and process groups: POSIX only
    for _name in ("loop_ignores_interrupt.ipynb", "segfault_in_check.ipynb"):
        HOSTILE.pop(_name)


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: grading.file_digest(p) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def fixture_course(tmp_path_factory):
    root = tmp_path_factory.mktemp("grading")
    solutions, pylib, subs = course_with(root, {n: c for n, (c, _, _) in HOSTILE.items()})
    return root, solutions, subs, pylib


def _grade_cli(*args, solutions, pylib):
    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["grade", *map(str, args), "--timeout", str(TIMEOUT),
                           "--memory-mb", str(MEMORY_MB), "--solutions", str(solutions),
                           "--python-path", str(pylib)])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def hostile_run(fixture_course):
    """ONE `course grade --json` over every hostile submission: it must run to the end."""
    root, solutions, subs, pylib = fixture_course
    before = _digests(subs)
    status, out, err = _grade_cli(subs, "--json", "--jobs", "4", solutions=solutions, pylib=pylib)
    return status, json.loads(out), before, _digests(subs), subs, err


def test_hostile_run_finishes_with_status_0_and_one_result_each(hostile_run):
    status, results, *_ = hostile_run
    assert status == 0
    assert sorted(Path(r["submission"]).name for r in results) == sorted(HOSTILE)
    for r in results:
        assert set(r) == {"submission", "score", "max_score", "exercises", "error"}
        for e in r["exercises"]:
            assert set(e) == {"id", "score", "max_score", "feedback", "flagged"}


def test_every_submission_file_is_byte_identical_and_nothing_was_added(hostile_run):
    _, _, before, after, subs, _ = hostile_run
    assert after == before


def test_the_sandbox_line_is_printed_exactly_when_there_is_no_sandbox(hostile_run):
    err = hostile_run[-1]
    assert err.count("NOT sandboxed") == (0 if SANDBOXED else 1), err


def _by_name(results):
    return {Path(r["submission"]).name: r for r in results}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_case_scores(hostile_run, name):
    results = hostile_run[1]
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
        if score == POINTS[gid]:
            assert feedback[gid] == "passed"
        else:
            assert feedback[gid] and feedback[gid] != "passed"
    for gid, word in words.items():
        assert word in feedback[gid], feedback[gid]
    assert not any(e["flagged"] for e in r["exercises"]), "an honest mistake is not tampering"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory cap is Linux-only")
def test_a_cap_too_small_for_python_itself_stops_grading_with_a_clear_error(fixture_course):
    """No kernel starts: that is the grading environment's fault, so no zeros are handed out."""
    _, solutions, subs, pylib = fixture_course
    with pytest.raises(grading.GradingEnvironmentError) as info:
        grading.grade([subs / "correct.ipynb"], timeout=TIMEOUT, memory_mb=40,
                      solutions_dir=solutions, python_path=[pylib])
    assert "grading environment is broken" in str(info.value)
    assert "could not start" in str(info.value) and "40 MB" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Check (learners): no hidden tests, hints in the table; CSV/table formats


def test_check_runs_without_hidden_tests_and_shows_hints(fixture_course, capsys):
    root, solutions, _, pylib = fixture_course
    folder = root / "learner"
    folder.mkdir()
    # double passes its visible test but not the hidden one; square is still blank
    nb = submission(fx_double="def double(x):\n    return 6 if x == 3 else 0",
                    fx_inc=SOLVED["fx_inc"])
    path = write(folder, "mine.ipynb", nb)
    before = grading.file_digest(path)
    results = grading.grade([path], timeout=TIMEOUT, hidden=False, solutions_dir=solutions,
                            python_path=[pylib])
    out = grading.format_table(results, hints=True)
    assert "total 3/6" in out and "should be" not in out
    assert "fx_square_test" in out and "int: x times x" in out and "multiply" not in out
    assert grading.file_digest(path) == before and sorted(folder.iterdir()) == [path]


def test_check_command_prints_the_table_and_what_is_left(fixture_course, capsys):
    root, solutions, _, pylib = fixture_course
    path = write(root, "mine_too.ipynb", submission(fx_inc=SOLVED["fx_inc"]))
    assert cli.main(["check", str(path), "--timeout", str(TIMEOUT), "--solutions",
                     str(solutions), "--python-path", str(pylib)]) == 0
    out = capsys.readouterr().out
    assert "total 1/6" in out and "2 exercise(s) to go" in out and "int: x times x" in out


def test_check_works_from_the_exercise_notebooks_when_solutions_are_not_handed_out(
        fixture_course):
    root, _, _, pylib = fixture_course
    exercises = root / "exercises_only"
    exercises.mkdir()
    nbformat.write(submission(), exercises / "90_fixture.ipynb")  # the blank as the source
    nb = submission(fx_double="def double(x):\n    return 6 if x == 3 else 0",
                    fx_inc=SOLVED["fx_inc"])
    path = write(root, "mine_three.ipynb", nb)
    results = grading.grade([path], timeout=TIMEOUT, hidden=False, solutions_dir=exercises,
                            python_path=[pylib])
    out = grading.format_table(results, hints=True)
    assert "total 3/6" in out and "int: x times x" in out


def test_csv_and_table_formats():
    ex = grading.ExerciseResult
    r = grading.SubmissionResult("a.ipynb", [
        ex("ex1_test", 2, 2, "passed"), ex("ex2_test", 0, 3, "wrong, " * 40),
        ex("ex3_test", 0, 1, grading.FLAG + "x", flagged=True)], source="solutions/01_x.ipynb")
    bad = grading.SubmissionResult("b.ipynb", error="not a readable Jupyter notebook (x)")
    rows = list(csv.reader(io.StringIO(grading.format_csv([r, bad]))))
    assert rows[0] == ["submission", "exercise", "score", "max_score", "flagged", "feedback"]
    assert rows[1] == ["a.ipynb", "ex1_test", "2", "2", "", "passed"]
    assert rows[2][:5] == ["a.ipynb", "ex2_test", "0", "3", ""] and rows[2][5] == "wrong, " * 40
    assert rows[3] == ["a.ipynb", "ex3_test", "0", "1", "yes", "FLAGGED: x"]
    assert rows[4] == ["b.ipynb", "", "0", "0", "", "not a readable Jupyter notebook (x)"]
    table = grading.format_table([r, bad])
    assert "total 2/6   1 FLAGGED" in table and "ex1_test" in table and "0/3" in table
    assert "…" in table and max(map(len, table.splitlines())) <= 115
    assert "error: not a readable" in table and "2 submissions graded" in table
    exported = json.loads(grading.format_json([r]))[0]
    assert exported["score"] == 2 and [e["flagged"] for e in exported["exercises"]] == [
        False, False, True]


def test_cli_csv_on_real_files(fixture_course):
    _, solutions, subs, pylib = fixture_course
    status, out, _ = _grade_cli(subs / "correct.ipynb", subs / "not_json.ipynb", "--csv",
                                solutions=solutions, pylib=pylib)
    assert status == 0
    rows = out.strip().splitlines()
    assert rows[0] == "submission,exercise,score,max_score,flagged,feedback" and len(rows) == 5
    assert rows[1].endswith("fx_double_test,2,2,,passed")


def test_missing_path_is_reported_with_status_1(fixture_course, capsys):
    _, solutions, _, _ = fixture_course
    assert cli.main(["grade", "/nonexistent/x.ipynb", "--json", "--solutions", str(solutions)]) == 1
    assert "file not found" in json.loads(capsys.readouterr().out)[0]["error"]


# ---------------------------------------------------------------------------------------------
# Assembling and matching (pure, fast)


def test_matching_by_metadata_ids_and_name(fixture_course):
    _, solutions, _, _ = fixture_course
    sources = grading.load_sources(solutions)
    assert grading.match_source(FULL, sources, "whatever.ipynb").name == "90_fixture.ipynb"
    no_ids = with_cells(submission(), lambda cells: [c.metadata.clear() for c in cells])
    assert grading.match_source(no_ids, sources, "x.ipynb").name == "90_fixture.ipynb"
    no_ids.metadata.clear()
    assert grading.match_source(no_ids, sources, "x.ipynb") is None
    assert grading.match_source(no_ids, sources, "90_fixture.ipynb").name == "90_fixture.ipynb"


def test_assemble_judges_check_calls_in_the_grader_and_runs_test_cells_only_for_check(
        fixture_course):
    _, solutions, _, _ = fixture_course
    source = grading.load_sources(solutions)["90_fixture.ipynb"]
    edited = HOSTILE["edited_tests.ipynb"][0]
    plan = grading.assemble(source, edited, hidden=True)
    by_id = {c.grade_id: c for c in plan.cells}
    assert by_id["fx_setup"].source == "import os\nimport fx_checks as check\nFACTOR = 2"
    assert by_id["fx_double"].source == "def double(x):\n    return 0"
    probe = by_id["fx_double_test"]
    assert probe.role == "probe" and probe.call.check.id == "fx90.double"
    assert probe.call.args == ("double",) and plan.in_kernel == []
    plan = grading.assemble(source, edited, hidden=False)
    test = {c.grade_id: c for c in plan.cells}["fx_double_test"]
    assert test.role == "test" and test.source == "check.double(double)"


def test_a_test_cell_that_is_not_only_check_calls_runs_in_the_kernel(fixture_course, tmp_path):
    _, solutions, _, _ = fixture_course
    nb = nbformat.read(solutions / "90_fixture.ipynb", as_version=4)
    for cell in nb.cells:
        if gid_of(cell) == "fx_inc_test":
            cell.source = "check.inc(inc)\nassert inc(2) == 3"
    nbformat.write(nb, tmp_path / "90_fixture.ipynb")
    source = grading.load_sources(tmp_path)["90_fixture.ipynb"]
    plan = grading.assemble(source, FULL, hidden=True)
    assert plan.in_kernel == ["fx_inc_test"]
    assert [c.role for c in plan.cells if c.grade_id == "fx_inc_test"] == ["test"]


# ---------------------------------------------------------------------------------------------
# forbid: an answer that runs the course's own reference is flagged, in every alias form


def _own_soft_lookup(q, k, v, t=1.0):  # chapter 01 scores keys by closeness (issue 22)
    s = -((k - q) ** 2).sum(axis=-1) / t
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
    original = dict(vars(lookup))
    try:
        with pytest.raises(ReferenceCall) as info:
            ch01.soft_lookup(CHEATS[name])
    finally:  # the reload case re-created every function of the module: put them all back
        for attr, obj in original.items():
            setattr(lookup, attr, obj)
    assert all(getattr(lookup, a) is o for a, o in original.items())
    assert "which this exercise rules out" in str(info.value) or "call tracking" in str(info.value)
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
    message = "calls the course's own `course_lib.lookup.soft_lookup`"
    with pytest.raises(CheckFailure, match=message):
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
# Every chapter is graded in the test run's shared batch (tests/test_graded_batch.py: solutions,
# blanks, chapter 01's attacks); what needs no kernel is here. Chapters are discovered, so new
# ones are covered as they land.

CHAPTERS = sorted(p.name for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb")
                  if (REPO / "exercises" / p.name).exists())


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_graded_cell_of_every_chapter_is_judged_in_the_grader(name):
    """No chapter relies on a test cell run inside the learner's kernel (which could be fooled):
    every graded cell is check calls, judged by the grader."""
    source = grading.load_sources(REPO / "solutions")[name]
    plan = grading.assemble(source, source.nb, hidden=True)
    assert plan.in_kernel == []
    assert {c.grade_id for c in plan.cells if c.role == "probe"} == {g for g, _, _ in source.graded}
