"""The grader and the machine it runs on (issue 20): a learner never scores 0 for the grader's
environment.

The course's own set-up cells get their own, generous limit (a busy machine can take longer
than a learner's per-cell limit just to import torch); a checkout that was never installed
grades as well (the kernel imports the course_lib the grader imported); and when the course's
own first cells fail in the kernel before any submitted code ran, `course grade` and `course
check` stop with an error that says what is wrong with the grading environment, exit 2, and
score nothing. Fixture course: tests/grading_fixture.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from grading_fixture import make_course, solved, source_notebook, write

from course_tools import cli
from course_tools import grader as grading
from course_tools.grader import pipeline, sandbox

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 2  # the learner's per-cell limit here: below what the set-up cell takes
SLOW = TIMEOUT + 0.5  # the set-up cell sleeps this long (and imports torch through the checks)
MODES = ["no sandbox"] + (["sandbox"] if sandbox.unavailable() is None else [])


@pytest.fixture(scope="module")
def slow_course(tmp_path_factory):
    """The fixture course with a set-up cell slower than the learner's limit, and a solution."""
    root = tmp_path_factory.mktemp("environment")
    solutions, pylib = make_course(root)
    nb = source_notebook()
    nb.cells[1].source = f"import time\ntime.sleep({SLOW})\n" + nb.cells[1].source
    nbformat.write(nb, solutions / "90_fixture.ipynb")
    return root, solutions, pylib, write(root, "mine.ipynb", solved())


def _checkout(folder: Path) -> Path:
    """A copy of the course's packages that no Python has installed."""
    for package in ("course_lib", "course_tools"):
        shutil.copytree(REPO / package, folder / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return folder


@pytest.mark.parametrize("mode", MODES)
def test_an_uninstalled_checkout_grades_and_a_slow_set_up_does_not_cost_the_learner(
        slow_course, tmp_path, mode):
    """`PYTHONPATH=checkout python -m course_tools grade ...`, with no pip install of that copy:
    the kernel imports the same course_lib (the preflight checks it), and the set-up cell that
    sleeps past the learner's 2 s limit runs to its end, so the solution scores full marks."""
    _, solutions, pylib, mine = slow_course
    checkout = _checkout(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k != "COURSE_GRADE_NO_SANDBOX"}
    env["PYTHONPATH"] = str(checkout)
    where = "import importlib.util as u; print(u.find_spec('course_lib').origin)"
    found = subprocess.run([sys.executable, "-c", where], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == str(checkout / "course_lib" / "__init__.py")
    cmd = [sys.executable, "-m", "course_tools", "grade", str(mine), "--json",
           "--timeout", str(TIMEOUT), "--memory-mb", "1024", "--solutions", str(solutions),
           "--python-path", str(pylib), *(["--unsafe-no-sandbox"] if mode == "no sandbox" else [])]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["error"] is None and result["score"] == result["max_score"] == 6, result
    assert ("NOT sandboxed" in done.stderr) == (mode == "no sandbox")


def test_grade_stops_when_the_kernel_cannot_import_the_checkers(slow_course, capsys):
    """The checkers' folder was not handed to the kernel (no --python-path): every submission
    would score 0, so `course grade` says what is wrong instead, and prints no scores."""
    _, solutions, _, mine = slow_course
    status = cli.main(["grade", str(mine), "--json", "--timeout", str(TIMEOUT),
                       "--solutions", str(solutions)])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert "cannot grade: the grading environment is broken" in err
    assert "cannot import `fx_checks`" in err and "--python-path DIR" in err
    assert "before any submitted code ran" in err and "nothing was scored" in err


def test_check_stops_the_same_way(slow_course, capsys):
    _, solutions, _, mine = slow_course
    status = cli.main(["check", str(mine), "--timeout", str(TIMEOUT), "--solutions",
                       str(solutions)])
    out, err = capsys.readouterr()
    assert status == 2 and "total" not in out and "exercise(s) to go" not in out
    assert "course check: cannot grade" in err and "`fx_checks`" in err


def test_a_broken_environment_stops_the_batch_at_the_first_submission(slow_course, monkeypatch):
    _, solutions, _, mine = slow_course
    runs = []

    def counted(*args, **kwargs):
        runs.append(args[0])
        return run_submission(*args, **kwargs)

    run_submission = pipeline.run_submission
    monkeypatch.setattr(pipeline, "run_submission", counted)
    with pytest.raises(grading.GradingEnvironmentError, match="fx_checks"):
        grading.grade([mine, mine, mine], timeout=TIMEOUT, jobs=1, solutions_dir=solutions)
    assert runs == ["mine.ipynb"]
