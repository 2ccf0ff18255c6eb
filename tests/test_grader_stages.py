"""The grader's stages one at a time, on synthetic inputs: no kernel is started here.

`assemble` (which cells run, in what role), `score` (statuses and verdicts -> results), the
worker's `KernelRun` (restarts and replays, with a scripted stand-in for the kernel), the shared
limits and the kernel's launcher. The end-to-end runs through real kernels are in
tests/test_grading.py, tests/test_grading_attacks.py and tests/test_graded_batch.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from grading_fixture import POINTS, SOLVED, gid_of, make_course, solved, source_notebook

from course_tools.grader import limits, preflight
from course_tools.grader.assemble import Plan, RunCell, assemble, learner_cells
from course_tools.grader.probes import Verdict
from course_tools.grader.read import parse_source
from course_tools.grader.results import FLAG, PASSED
from course_tools.grader.run import RunResult
from course_tools.grader.score import describe, judge_cell, score, troubles
from course_tools.grader.worker import LAUNCHER, KernelRun, _status_of

TIMEOUT = 5


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    make_course(tmp_path_factory.mktemp("stages"))  # puts fx_checks on sys.path
    return parse_source(Path("90_fixture.ipynb"), source_notebook())


def _roles(plan):
    return [(c.role, c.grade_id) for c in plan.cells]


# ---------------------------------------------------------------------------------- assemble

def test_assemble_opens_with_the_preflight_then_follows_the_source(source):
    plan = assemble(source, solved(), hidden=True)
    assert _roles(plan) == [
        ("preflight", None), ("setup", "fx_setup"),
        ("answer", "fx_double"), ("probe", "fx_double_test"),
        ("answer", "fx_square"), ("probe", "fx_square_test"),
        ("answer", "fx_inc"), ("probe", "fx_inc_test")]
    assert plan.cells[0].imports == ("fx_checks",) and plan.cells[0].source == ""
    probes = [c for c in plan.cells if c.role == "probe"]
    assert [c.call.check.id for c in probes] == ["fx90.double", "fx90.square", "fx90.inc"]
    assert [c.call.args for c in probes] == [("double",), ("square",), ("inc",)]
    answer = plan.cells[2]
    assert answer.source == SOLVED["fx_double"] and answer.exercise == "fx_double_test"
    assert plan.hints == {"fx_double_test": "multiply by FACTOR", "fx_square_test": "x times x",
                          "fx_inc_test": "add one"}
    assert plan.missing == plan.answers_missing == {} and plan.in_kernel == []


def test_assemble_runs_the_sources_set_up_even_when_the_submission_edited_it(source):
    nb = solved()
    for cell in nb.cells:
        if gid_of(cell) == "fx_setup":
            cell.source = "FACTOR = 0"
    setup = assemble(source, nb).cells[1]
    assert setup.role == "setup" and setup.source == source.nb.cells[1].source


def test_assemble_places_the_learners_own_cells_after_the_cell_they_follow(source):
    nb = solved()
    nb.cells.insert(0, nbformat.v4.new_code_cell("print('first')"))
    at = next(k for k, c in enumerate(nb.cells) if gid_of(c) == "fx_square")
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("helper = 1"))
    nb.cells.insert(at + 2, nbformat.v4.new_markdown_cell("prose is not run"))
    nb.cells.insert(at + 3, nbformat.v4.new_code_cell("   "))
    plan = assemble(source, nb)
    assert _roles(plan)[:2] == [("preflight", None), ("extra", None)]
    k = next(i for i, c in enumerate(plan.cells) if c.grade_id == "fx_square")
    assert (plan.cells[k + 1].role, plan.cells[k + 1].source) == ("extra", "helper = 1")
    assert plan.cells[k + 1].exercise == "fx_square_test"
    assert plan.cells[k + 2].role == "probe" and len(plan.cells) == 10


def test_learner_cells_skips_unchanged_copies_of_unlabelled_source_cells(tmp_path):
    nb = source_notebook()
    nb.cells.insert(2, nbformat.v4.new_code_cell("GIVEN = 3"))  # a plain source cell, no grade_id
    src = parse_source(tmp_path / "x.ipynb", nb)
    sub = solved()
    sub.cells.insert(2, nbformat.v4.new_code_cell("GIVEN = 3"))  # the learner's unchanged copy
    sub.cells.insert(3, nbformat.v4.new_code_cell("GIVEN = 4"))  # an edit: the learner's own
    learner = learner_cells(src, sub)
    assert learner.after == {"fx_setup": ["GIVEN = 4"]}
    assert set(learner.first) == src.ids


def test_assemble_names_deleted_answers_and_graded_cells(source):
    nb = solved()
    nb.cells = [c for c in nb.cells if gid_of(c) not in ("fx_square", "fx_inc_test")]
    plan = assemble(source, nb)
    assert plan.answers_missing == {"fx_square_test": ["fx_square"]}
    assert set(plan.missing) == {"fx_inc_test"} and "cell missing" in plan.missing["fx_inc_test"]
    assert "fx_inc_test" not in {c.grade_id for c in plan.cells}


def test_assemble_for_check_runs_the_test_cells_without_their_hidden_tests(tmp_path):
    nb = source_notebook()
    for cell in nb.cells:
        if gid_of(cell) == "fx_inc_test":
            cell.source = ("check.inc(inc)\n### BEGIN HIDDEN TESTS\nassert inc(9) == 10\n"
                           "### END HIDDEN TESTS")
    src = parse_source(tmp_path / "90_fixture.ipynb", nb)
    graded = assemble(src, solved(), hidden=True)
    assert graded.in_kernel == ["fx_inc_test"]  # not only check calls: run in the kernel
    assert [c.source for c in graded.cells if c.grade_id == "fx_inc_test"] == [nb.cells[7].source]
    checked = assemble(src, solved(), hidden=False)
    tests = [c for c in checked.cells if c.role == "test"]
    assert [c.grade_id for c in tests] == ["fx_double_test", "fx_square_test", "fx_inc_test"]
    assert tests[2].source.strip() == "check.inc(inc)" and checked.in_kernel == []


# ------------------------------------------------------------------------------------- score

def _plan(*cells, missing=None, answers_missing=None):
    return Plan(list(cells), missing or {}, answers_missing or {}, {"fx_double_test": "a hint"})


def _probe(gid):
    return RunCell("", "probe", gid, gid)


OK = {"status": "ok"}
GRADED = parse_source(Path("x.ipynb"), source_notebook())


def _score(plan, statuses, verdicts=None, flags=(), suspicious=None):
    run = RunResult(statuses, flags=list(flags), verdicts=verdicts or {})
    results = score(GRADED, plan, run, timeout=TIMEOUT, memory_mb=512, suspicious=suspicious)
    return {r.id: r for r in results}


def _three(**verdicts):
    plan = _plan(RunCell("", "preflight"), *(_probe(g) for g in POINTS))
    passed = Verdict(True, "fine")
    return plan, [OK] * 4, {i + 1: verdicts.get(g, passed) for i, g in enumerate(POINTS)}


def test_score_gives_full_points_when_every_verdict_passes():
    plan, statuses, verdicts = _three()
    got = _score(plan, statuses, verdicts)
    assert {g: (r.score, r.feedback, r.flagged) for g, r in got.items()} == {
        g: (p, PASSED, False) for g, p in POINTS.items()}
    assert got["fx_double_test"].hint == "a hint"


def test_score_takes_the_verdicts_words_or_the_cells_own_error():
    plan, statuses, verdicts = _three(fx_double_test=Verdict(False, "double(3) should be 6"))
    statuses[2] = {"status": "error", "ename": "NotImplementedError", "evalue": "x times x"}
    del verdicts[2]  # the probe's cell failed: no result came back
    got = _score(plan, statuses, verdicts)
    assert got["fx_double_test"].feedback == "double(3) should be 6"
    assert got["fx_square_test"].feedback == "not written yet (hint: x times x)"
    assert got["fx_inc_test"].feedback == PASSED and got["fx_square_test"].score == 0


def test_a_reach_flag_costs_only_the_exercise_whose_probe_runs_the_forbidden_name():
    """What tests/test_grader_reach.py finds on the source becomes a 0 here, for that exercise."""
    plan, statuses, verdicts = _three()
    run = RunResult(statuses, flags=[], verdicts=verdicts)
    results = score(GRADED, plan, run, timeout=TIMEOUT, memory_mb=512,
                    reached={2: ["the code square runs uses `pow`, where the exercise rules out "
                                 "`pow`"]})
    got = {r.id: r for r in results}
    assert got["fx_square_test"].score == 0 and got["fx_square_test"].flagged
    assert got["fx_square_test"].feedback.startswith(FLAG) and "rules out `pow`" in \
        got["fx_square_test"].feedback
    assert {g: r.score for g, r in got.items() if g != "fx_square_test"} == {
        g: p for g, p in POINTS.items() if g != "fx_square_test"}


def test_tampering_costs_the_exercises_judged_at_or_after_it():
    plan, statuses, verdicts = _three()
    statuses[2] = dict(OK, intrusions=["wrote /tmp/x"])
    got = _score(plan, statuses, verdicts, suspicious={3: ["your answer cell reads /proc"]})
    assert got["fx_double_test"].feedback == PASSED
    assert got["fx_square_test"].feedback == FLAG + "wrote /tmp/x"
    assert got["fx_inc_test"].feedback == FLAG + "wrote /tmp/x; your answer cell reads /proc"
    assert got["fx_inc_test"].flagged and got["fx_inc_test"].score == 0
    got = _score(*_three(fx_inc_test=Verdict(False, "refused", ["a forged result"])),
                 flags=["the run was forged"])
    assert all(r.feedback.startswith(FLAG + "the run was forged") for r in got.values())
    assert got["fx_inc_test"].feedback == FLAG + "the run was forged; a forged result (refused)"


def test_trouble_around_an_exercise_is_appended_with_the_cells_own_limit():
    plan = _plan(RunCell("", "preflight"), RunCell("x = 1", "setup", "fx_setup", "fx_double_test"),
                 RunCell("def double(", "answer", "fx_double", "fx_double_test"),
                 _probe("fx_double_test"), RunCell("", "extra", None, "fx_square_test"),
                 _probe("fx_square_test"), _probe("fx_inc_test"))
    statuses = [OK, {"status": "timeout"},
                {"status": "error", "ename": "SyntaxError", "evalue": "'(' was never closed"},
                {"status": "error", "ename": "NameError", "evalue": "name 'double' is not defined"},
                {"status": "died"}, {"status": "timeout"}, OK]
    got = _score(plan, statuses, {6: Verdict(True, "fine")})
    double = got["fx_double_test"].feedback
    assert double.startswith("NameError: name 'double' is not defined [a set-up cell: timed out "
                             f"after {limits.SETUP_S} s")
    assert "your answer cell `fx_double`: SyntaxError: '(' was never closed]" in double
    square = got["fx_square_test"].feedback
    assert square.startswith(f"timed out after {TIMEOUT} s and was interrupted")
    assert "[a cell you added: the kernel died" in square and "512 MB" in square
    assert troubles(plan, statuses, timeout=TIMEOUT, memory_mb=512).keys() == {
        "fx_double_test", "fx_square_test"}


def test_missing_cells_and_exercises_never_judged():
    plan = _plan(RunCell("", "preflight"), _probe("fx_double_test"),
                 missing={"fx_inc_test": "cell missing: gone"},
                 answers_missing={"fx_square_test": ["fx_square"]})
    got = _score(plan, [OK, OK], {1: Verdict(True, "fine")})
    assert got["fx_inc_test"].feedback == "cell missing: gone"
    assert got["fx_square_test"].feedback == "not run [answer cell missing: `fx_square`]"
    assert got["fx_double_test"].score == 2


def test_a_test_cell_run_in_the_kernel_passes_when_it_ran_and_flags_a_reference_call():
    cell = RunCell("assert f()", "test", "fx_inc_test", "fx_inc_test")
    assert judge_cell(cell, OK, None, "") == (True, "", [])
    st = {"status": "error", "ename": "ReferenceCall", "evalue": "calls the course's own f"}
    words = describe(st, TIMEOUT, 512)
    assert words == "calls the course's own f"
    assert judge_cell(cell, st, None, words) == (False, words, [words])


@pytest.mark.parametrize("st,words", [
    ({"status": "stuck"}, "ignored the interrupt"),
    ({"status": "skipped", "reason": "not run: the kernel died 4 times"}, "died 4 times"),
    ({"status": "skipped"}, "not run"),
    ({"status": "error", "ename": "AssertionError", "line": "assert x == 1"}, "at `assert x"),
    ({"status": "error", "ename": "MemoryError"}, "cap 512 MB"),
    ({"status": "error", "ename": "CheckFailure", "evalue": "rows sum to 2"}, "rows sum to 2"),
])
def test_describe_puts_a_status_in_words(st, words):
    assert words in describe(st, TIMEOUT, 512)


# ------------------------------------------------------------------- limits and preflight

def test_the_courses_own_cells_get_their_own_limit():
    assert limits.cell_limit("setup", 5) == limits.cell_limit("preflight", 5) == limits.SETUP_S
    assert limits.cell_limit("setup", 900) == 900  # never less than the learner's
    assert {limits.cell_limit(r, 5) for r in ("answer", "probe", "test", "extra")} == {5}
    short, long = limits.run_deadline([5] * 3), limits.run_deadline([5, 300, 5])
    assert short > 3 * 5 and long > short + 300


def _status(role, st, gid=None):
    return RunCell("import torch\nx = 1", role, gid), st


def _problem(*cells_and_statuses, started=True, error=None):
    plan = Plan([c for c, _ in cells_and_statuses], {}, {}, {})
    run = RunResult([st for _, st in cells_and_statuses], error=error, started=started)
    return preflight.environment_problem(plan, run, timeout=TIMEOUT, memory_mb=512,
                                         grader_lib=Path("/course/course_lib"),
                                         python_path=["/my/checks"])


def test_a_failure_before_any_submitted_code_is_the_environments():
    missing_lib = {"status": "error", "ename": "ModuleNotFoundError",
                   "evalue": "No module named 'course_lib'"}
    why = _problem(_status("preflight", missing_lib))
    assert "cannot import course_lib" in why and "/course/course_lib" in why
    assert "pip install -e ." in why and why.endswith("(before any submitted code ran)")
    missing = {"status": "error", "ename": "ModuleNotFoundError", "evalue": "No module named 'fx'"}
    why = _problem(_status("preflight", OK), _status("setup", missing, "fx_setup"))
    assert "`fx`, which the course's set-up cell `fx_setup` imports" in why
    assert "--python-path DIR (folders given: /my/checks)" in why
    why = _problem(_status("preflight", OK), _status("setup", {"status": "timeout"}))
    assert f"took longer than {limits.SETUP_S} s" in why and "`import torch`" in why
    assert "memory" in _problem(_status("preflight", {"status": "died"}))
    why = _problem(_status("preflight", {"status": "skipped"}), started=False,
                   error="the kernel could not start (RuntimeError: x)")
    assert why.startswith("the kernel could not start (RuntimeError: x)")


def test_after_the_learners_first_cell_a_failure_is_the_submissions():
    broken = {"status": "error", "ename": "ModuleNotFoundError", "evalue": "No module named 'fx'"}
    assert _problem(_status("preflight", OK), _status("extra", OK),
                    _status("setup", broken)) is None
    assert _problem(_status("preflight", OK), _status("setup", OK), _status("answer", broken),
                    _status("setup", {"status": "timeout"})) is None
    # the worker stopped without a result (a submission can kill it): nothing is known
    stopped = {"status": "skipped", "reason": "the grading worker stopped (exit status -9)"}
    assert _problem(_status("preflight", stopped), _status("setup", stopped)) is None


def _run_preflight(tmp_path, expected, modules=()):
    fake = tmp_path / "lib" / "course_lib"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("")
    return subprocess.run([sys.executable, "-c", preflight.source(modules, expected)],
                          cwd=tmp_path, env={"PYTHONPATH": str(fake.parent)},
                          capture_output=True, text=True, timeout=60)


def test_the_preflight_cell_checks_which_course_lib_the_kernel_imported(tmp_path):
    ok = _run_preflight(tmp_path, tmp_path / "lib" / "course_lib", ("json",))
    assert ok.returncode == 0, ok.stderr
    wrong = _run_preflight(tmp_path, "/elsewhere/course_lib")
    assert "ImportError: the kernel imported course_lib from" in wrong.stderr
    missing = _run_preflight(tmp_path, tmp_path / "lib" / "course_lib", ("no_such_checks",))
    assert "No module named 'no_such_checks'" in missing.stderr


# -------------------------------------------------------------------------- worker, launcher

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory cap is Linux-only")
def test_the_launcher_caps_memory_then_becomes_the_command():
    show = "import resource; print(resource.getrlimit(resource.RLIMIT_DATA))"
    done = subprocess.run([sys.executable, "-I", LAUNCHER, "300", "0", sys.executable, "-c", show],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str((300 << 20, 300 << 20)), done.stderr


def test_a_cells_status_from_its_outputs():
    cell = nbformat.v4.new_code_cell("x")
    assert _status_of(cell, 5, 0.1) == {"status": "ok"}
    cell.outputs = [nbformat.v4.new_output("error", ename="KeyboardInterrupt", evalue="",
                                           traceback=[])]
    assert _status_of(cell, 5, 5.2) == {"status": "timeout"}
    assert _status_of(cell, 5, 1.0)["status"] == "error"  # interrupted by the learner's code
    cell.outputs = [nbformat.v4.new_output(
        "error", ename="ValueError", evalue="\x1b[31mbad\x1b[0m",
        traceback=["\x1b[0;32m----> 3\x1b[0m f(x)"])]
    assert _status_of(cell, 5, 0.1) == {"status": "error", "ename": "ValueError",
                                        "evalue": "bad", "line": "f(x)"}


class ScriptedRun(KernelRun):
    """KernelRun with the kernel replaced by a script: cell index -> statuses, one per try."""

    def __init__(self, n, script, collect=()):
        spec = {"cells": [f"cell {i}" for i in range(n)], "limits": [5] * n, "memory_mb": 0,
                "collect": [["p.out.pt"] if i in collect else [] for i in range(n)]}
        super().__init__(spec)
        self.script = {i: list(s) for i, s in script.items()}
        self.log: list[str] = []

    async def start(self):
        self.log.append("start")

    async def stop(self):
        self.log.append("stop")

    async def execute(self, i):
        self.log.append(f"run {i}")
        steps = self.script.get(i)
        return {"status": steps.pop(0) if steps else "ok"}


def _scripted(n, script, collect=()):
    runner = ScriptedRun(n, script, collect)
    return runner, asyncio.run(runner.run())


def test_kernel_run_restarts_and_replays_what_ran_normally_before(monkeypatch):
    monkeypatch.setattr("course_tools.grader.worker.collect", lambda spec, i: None)
    runner, result = _scripted(5, {1: ["error"], 3: ["died"]}, collect={2})
    assert [s["status"] for s in result["statuses"]] == ["ok", "error", "ok", "died", "ok"]
    assert result["started"] and result["error"] is None
    # cells 0 and 1 replayed (an error still defines what ran before it); the probe 2 is not
    assert runner.log == ["start", "run 0", "run 1", "run 2", "run 3", "stop", "start",
                          "run 0", "run 1", "run 4", "stop"]


def test_kernel_run_gives_up_after_max_restarts(monkeypatch):
    monkeypatch.setattr("course_tools.grader.worker.collect", lambda spec, i: None)
    n = limits.MAX_RESTARTS + 3
    _, result = _scripted(n, {i: ["stuck"] for i in range(n)})
    statuses = [s["status"] for s in result["statuses"]]
    assert statuses == ["stuck"] * (limits.MAX_RESTARTS + 1) + ["skipped"] * 2
    assert f"{limits.MAX_RESTARTS + 1} times" in result["statuses"][-1]["reason"]


def test_kernel_run_stops_when_a_replay_dies(monkeypatch):
    monkeypatch.setattr("course_tools.grader.worker.collect", lambda spec, i: None)
    _, result = _scripted(4, {0: ["ok", "died"], 1: ["died"]})
    assert [s["status"] for s in result["statuses"]] == ["ok", "died", "skipped", "skipped"]
    assert "while replaying" in result["statuses"][2]["reason"]
