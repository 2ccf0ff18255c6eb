"""Submissions that try to get points without the work (issue 12), on the fixture course.

Every attack is graded twice in one run per mode: in the sandbox (where bubblewrap works) and
without it (`sandbox=False`, as on macOS or Windows). Each must score 0 on what it attacks and
be flagged; files and course modules stay byte-identical; a blank graded after the attacks in
the same run still scores 0; nothing a submission starts outlives grading. The same attacks on
the real chapter 01 are in tests/test_grading.py (`test_the_issues_attacks_on_chapter_01...`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import nbformat
import pytest
from grading_fixture import POINTS, SOLVED, make_course, solved, submission, with_cells, write

from course_tools import grader as grading
from course_tools.grader import sandbox

TIMEOUT = 5
MEMORY_MB = 1024
ALL = set(POINTS)

FORGE_WORKER = (  # the attack: find the worker among the parents, forge, kill it
    "import json, os, signal\n"
    "pid, forged = os.getpid(), {'statuses': [{'status': 'ok'}] * 20, 'error': None}\n"
    "while pid > 1:\n"
    "    pid = int(open(f'/proc/{pid}/status').read().split('PPid:')[1].split()[0])\n"
    "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read() if pid > 0 else b''\n"
    "    if b'grader.worker' in cmd:\n"
    "        with open(f'/proc/{pid}/fd/1', 'w') as out:\n"
    "            out.write('\\nCOURSE-GRADE-RESULT ' + json.dumps(forged) + '\\n')\n"
    "        os.kill(pid, signal.SIGKILL)\n"
    "        break\n")
FIND_SOLUTIONS = (  # via course_lib.__file__, the cwd and a parent's cwd, then /tmp
    "import glob, json, os, course_lib\n"
    "roots = [os.path.dirname(os.path.dirname(course_lib.__file__)), os.getcwd()]\n"
    "roots += glob.glob('/tmp/pytest-of-*')\n"
    "try:\n"
    "    roots.append(os.readlink(f'/proc/{os.getppid()}/cwd'))\n"
    "except OSError:\n"
    "    pass\n"
    "for root in roots:\n"
    "    for path in glob.glob(os.path.join(root, '**', 'solutions', '90_fixture.ipynb'),\n"
    "                          recursive=True):\n"
    "        for cell in json.load(open(path))['cells']:\n"
    "            src = ''.join(cell['source'])\n"
    "            if cell['cell_type'] == 'code' and 'BEGIN SOLUTION' in src:\n"
    "                exec(src, globals())\n")
REWRITE_CHECKS = (  # rewrite the checker module the notebook imported (then do nothing)
    "import fx_checks\n"
    "path = fx_checks.__file__\n"
    "try:\n"
    "    text = open(path).read()\n"
    "    open(path, 'w').write(text.replace('if got != want(x):', 'if False:'))\n"
    "except OSError:\n"
    "    pass\n")
FAKE_PROBE = (  # replace the kernel-side probe: 'correct' outcomes, no tampering report
    "import sys, types, torch\n"
    "fake = types.ModuleType('course_lib.checks._probe')\n"
    "def probe(check_id, inputs, outputs, *objs):\n"
    "    cases = torch.load(inputs, weights_only=True)\n"
    "    torch.save([{'ok': 2 * c} for c in cases], outputs)\n"
    "fake.probe = probe\n"
    "sys.modules['course_lib.checks._probe'] = fake\n")
PICKLE_RESULT = (  # a result file that runs code when unpickled
    "import os, pickle, glob, threading, time\n"
    "class Boom:\n"
    "    def __reduce__(self):\n"
    "        return (os.system, ('touch /tmp/pwned-by-pickle',))\n"
    "def forge():\n"
    "    for _ in range(200):\n"
    "        for path in glob.glob('../io/*.out.pt'):\n"
    "            with open(path, 'wb') as f:\n"
    "                pickle.dump([{'ok': Boom()}], f)\n"
    "        time.sleep(0.005)\n"
    "threading.Thread(target=forge, daemon=True).start()\n")
THREAD_LATER = (  # honest at first; a thread swaps in a wrong answer after the checks
    "import threading, time\n"
    "def double(x):\n"
    "    return FACTOR * x\n"
    "def later():\n"
    "    time.sleep(3)\n"
    "    globals()['square'] = lambda x: 0\n"
    "threading.Thread(target=later).start()\n")
PATCH_BUILTINS = (
    "import builtins\n"
    "builtins.isinstance = lambda *a: True\n"
    "def double(x):\n"
    "    return 0\n")
WRITE_OUTSIDE = (
    "import os\n"
    "for place in ('/tmp/pwned.txt', '../pwned.txt', os.path.expanduser('~/pwned.txt')):\n"
    "    try:\n"
    "        open(place, 'w').write('x')\n"
    "    except OSError:\n"
    "        pass\n"
    + SOLVED["fx_double"] + "\n")
BREAK_SETUP = (  # a cell of its own before the set-up: the course's set-up cell then fails
    "import sys\n"
    "sys.modules['fx_checks'] = None\n")
LINGER = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(434343)'],\n"
    "                 start_new_session=True)\n" + SOLVED["fx_inc"] + "\n")

# name -> (submission, the exercises that must be 0 and flagged)
ATTACKS = {
    "01_rebinds_checkers_and_allclose.ipynb": (submission(fx_double=(
        "import numpy as np\ncheck.double = check.square = check.inc = lambda *a, **k: None\n"
        "np.allclose = lambda *a, **k: True\ndef double(x):\n    return 0")), ALL),
    "02_forges_the_worker_result.ipynb": (submission(fx_double=FORGE_WORKER), ALL),
    "03_rewrites_the_checkers.ipynb": (submission(fx_double=REWRITE_CHECKS), ALL),
    "04_runs_the_solutions.ipynb": (submission(fx_double=FIND_SOLUTIONS), ALL),
    "05_replaces_the_probe.ipynb": (submission(fx_double=FAKE_PROBE), ALL),
    "06_pickled_result.ipynb": (submission(fx_double=PICKLE_RESULT), ALL),
    "07_thread_changes_state_later.ipynb": (solved(fx_double=THREAD_LATER), ALL),
    "08_patches_builtins.ipynb": (submission(fx_double=PATCH_BUILTINS), ALL),
    "09_writes_outside_its_folder.ipynb": (solved(fx_double=WRITE_OUTSIDE), ALL),
    "10_leaves_a_process_behind.ipynb": (solved(fx_inc=LINGER), {"fx_inc_test"}),
    # The set-up fails after the submission's own code ran: its doing, so it costs it alone
    # (flagged), and grading goes on; it does not pass for a broken grading environment.
    "11_breaks_the_set_up.ipynb": (with_cells(solved(), lambda cells: cells.insert(
        0, nbformat.v4.new_code_cell(BREAK_SETUP))), ALL),
    "99_blank_after_the_attacks.ipynb": (submission(), set()),
}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    solutions, pylib = make_course(root)
    subs = root / "submissions"
    subs.mkdir()
    for name, (nb, _) in ATTACKS.items():
        write(subs, name, nb)
    return root, solutions, pylib, subs


def _digests(*folders: Path) -> dict[str, str]:
    return {str(p): grading.file_digest(p) for f in folders for p in sorted(f.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _lingering() -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if b"time.sleep(434343)" in cmdline.read_bytes():
                found.append(cmdline.parent.name)
    return found


MODES = ["sandbox", "no sandbox"] if sandbox.unavailable() is None else ["no sandbox"]
# Without the sandbox the grader has other defences for these; the rest are judged the same way
# in both modes (outside the kernel), so the sandbox run covers them.
UNSANDBOXED = ["02_forges_the_worker_result.ipynb", "03_rewrites_the_checkers.ipynb",
               "04_runs_the_solutions.ipynb", "09_writes_outside_its_folder.ipynb",
               "10_leaves_a_process_behind.ipynb", "11_breaks_the_set_up.ipynb",
               "99_blank_after_the_attacks.ipynb"]


@pytest.fixture(scope="module", params=MODES)
def attacked(course, request):
    """ONE grade of the attacks per mode (in name order, jobs=1: the blank comes last)."""
    root, solutions, pylib, subs = course
    before = _digests(subs, solutions, pylib)
    lines = []
    files = [subs] if request.param == "sandbox" else [subs / n for n in UNSANDBOXED]
    results = grading.grade(files, timeout=TIMEOUT, memory_mb=MEMORY_MB, jobs=1,
                            solutions_dir=solutions, python_path=[pylib],
                            sandbox=request.param == "sandbox", warn=lines.append)
    after = _digests(subs, solutions, pylib)
    stray = [p for p in ("/tmp/pwned.txt", "/tmp/pwned-by-pickle", str(Path.home() / "pwned.txt"))
             if Path(p).exists()]
    for p in stray:
        Path(p).unlink()
    return request.param, {Path(r.submission).name: r for r in results}, before, after, \
        lines, stray, _lingering()


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_scores_0_and_is_flagged_on_what_it_attacks(attacked, name):
    mode, results, *_ = attacked
    if name not in results:
        pytest.skip("covered by the sandboxed run")
    r = results[name]
    assert r.error is None or "worker stopped" in r.error, r.error
    want = ATTACKS[name][1]
    by_id = {e.id: e for e in r.exercises}
    assert set(by_id) == ALL
    for gid, e in by_id.items():
        if gid in want:
            assert e.score == 0 and e.flagged and e.feedback.startswith(grading.FLAG), (mode, e)
        elif name.startswith("99_"):
            assert e.score == 0 and not e.flagged and "not written yet" in e.feedback, (mode, e)
        else:
            assert not e.flagged, (mode, e)


def test_nothing_changed_nothing_written_nothing_left_running(attacked):
    mode, _, before, after, _, stray, lingering = attacked
    assert after == before, mode
    if mode == "sandbox":  # without it a write to /tmp succeeds (flagged, and documented)
        assert stray == []
    assert "/tmp/pwned-by-pickle" not in stray  # a pickled result is never unpickled
    assert lingering == [], mode


def test_without_the_sandbox_one_line_says_so(attacked):
    mode, *_, lines, _, _ = attacked
    if mode == "sandbox":
        assert lines == []
    else:
        assert len(lines) == 1 and "NOT sandboxed" in lines[0] and "solutions/" in lines[0]


def test_a_forged_worker_result_is_named(attacked):
    mode, results, *_ = attacked
    feedback = " ".join(e.feedback for e in results["02_forges_the_worker_result.ipynb"].exercises)
    if mode == "no sandbox":  # it found the worker: the forgery is seen, the kill reported
        assert "grading worker's output" in feedback
    assert "/proc" in feedback


# ---------------------------------------------------------------------------------------------
# The scan of learner cells (fast, no kernel): every solution is clean, every cheat is named

REPO = Path(__file__).resolve().parent.parent


def _answer_cells():
    import nbformat

    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
                yield f"{path.stem}:{cell.metadata['nbgrader']['grade_id']}", cell.source


def test_no_solution_of_any_chapter_looks_suspicious():
    from course_tools.grader.scan import suspicious

    found = {where: s for where, src in _answer_cells() if (s := suspicious(src, {"check"}))}
    assert found == {}


@pytest.mark.parametrize("source,words", [
    ("check.x = lambda *a: None", "rebinds the checker `check.x`"),
    ("import numpy as np\nnp.allclose = lambda *a, **k: True", "numpy.allclose"),
    ("import torch\nsetattr(torch, 'allclose', len)", "rewrites the module `torch`"),
    ("import builtins\nbuiltins.len = None", "builtins"),
    ("__builtins__.len = None", "builtins"),
    ("import sys\nsys.modules['course_lib.checks._probe'] = None", "sys.modules"),
    ("import sys as s\ns.setprofile(None)", "call tracking"),
    ("import os\nos.kill(os.getppid(), 9)", "parent process"),
    ("open('/proc/1/fd/1', 'w')", "/proc"),
    ("import course_lib\nprint(course_lib.__file__)", "__file__"),
    ("from course_lib.checks import _core", "reaches into the checkers"),
    ("p = 'solutions/01_soft_dictionary.ipynb'", "solution notebooks"),
    ("open('../x', 'w')", "outside its folder"),
    ("import ctypes", "ctypes"),
    ("!rm -rf ~", "shell commands"),
    ("import subprocess", "other programs"),
])
def test_the_scan_names_each_cheat(source, words):
    from course_tools.grader.scan import suspicious

    found = suspicious(source, {"check"})
    assert any(words in f for f in found), found
