"""The test run's one shared graded batch: every whole-notebook grade of the real chapters.

Grading a chapter runs its notebook in a kernel, which is the slowest thing the suite does, so it
happens once per test run, in this module's `graded_batch` fixture, and every test that needs a
chapter's score is here and reads it. One module is one unit of work for `--dist loadfile`, so
the batch is made on one worker, and tests/conftest.py sends it out first (the longest unit
first, so the workers finish together). The batch holds:

- every chapter's solution (full points) and blank exercise (0, each exercise "not written yet");
- chapter 01 with hostile answers: the issue-12 attacks on the grader, a call of the course's
  reference, an `os._exit`;
- the cheats only a kernel can show, each on the blank exercise notebook (so the chapter's other
  exercises fail fast): the in-kernel trap disarmed and the course's function called, a call of a
  checker's reference (a stub in the grading kernel), chapter 08's full score grid in NumPy (the
  memory judge) and every tile in NumPy (the FLOP counter), chapter 08's Triton row softmax
  cheated inside and outside its kernel; three of them once more without the sandbox;
- a file that is not a notebook.

What the grader's reading of the source catches is tested on the source, without a kernel
(tests/test_grader_reach.py, test_grading_attacks.py's scan cases); what the stripped course_lib
holds is tested on the stripped copy (tests/test_grading_stripped.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from course_tools import cli
from course_tools import grader as grading
from course_tools.exercises import hints
from course_tools.grader import sandbox, strip

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(p.name for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb")
                  if (REPO / "exercises" / p.name).exists())
CH01, CH04, CH08 = "01_soft_dictionary.ipynb", "04_masking.ipynb", "08_efficient_kernel.ipynb"
TIMEOUT_S = 120  # per cell, as nbval runs the notebooks (each runs in under 60 s)
JOBS = 4  # submissions at once: grading one waits on its kernel for half of its time


def grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


# ---------------------------------------------------------------- chapter 01's hostile answers

FIND_WORKER = (
    "import json, os, signal\n"
    "pid, forged = os.getpid(), {'statuses': [{'status': 'ok'}] * 40, 'error': None}\n"
    "while pid > 1:\n"
    "    pid = int(open(f'/proc/{pid}/status').read().split('PPid:')[1].split()[0])\n"
    "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read() if pid > 0 else b''\n"
    "    if b'grader.worker' in cmd or b'grading' in cmd:\n"
    "        with open(f'/proc/{pid}/fd/1', 'w') as out:\n"
    "            out.write('\\nCOURSE-GRADE-RESULT ' + json.dumps(forged) + '\\n')\n"
    "        os.kill(pid, signal.SIGKILL)\n"
    "        break\n")
REWRITE_CHECKERS = (
    "import pathlib, course_lib.checks\n"
    "for p in pathlib.Path(course_lib.checks.__file__).parent.glob('ch*.py'):\n"
    "    try:\n"
    "        p.write_text(p.read_text() + '\\ndef _pwned(): pass\\n')\n"
    "    except OSError:\n"
    "        pass\n")
RUN_SOLUTIONS = (
    "import glob, json, os, course_lib\n"
    "roots = {os.path.dirname(os.path.dirname(course_lib.__file__)), os.getcwd()}\n"
    "try:\n"
    "    roots.add(os.readlink(f'/proc/{os.getppid()}/cwd'))\n"
    "except OSError:\n"
    "    pass\n"
    "for root in roots:\n"
    "    for up in (root, os.path.dirname(root), os.path.dirname(os.path.dirname(root))):\n"
    "        for path in glob.glob(os.path.join(up, '**', '01_soft_dictionary.ipynb'),\n"
    "                              recursive=True):\n"
    "            for cell in json.load(open(path))['cells']:\n"
    "                src = ''.join(cell['source'])\n"
    "                if cell['cell_type'] == 'code' and 'BEGIN SOLUTION' in src:\n"
    "                    exec(src, globals())\n")
REBIND_CHECKERS = (
    "import numpy as np, torch\n"
    "for name in ('similarity_scores', 'softmax_weights', 'soft_lookup', 'query_gradient'):\n"
    "    setattr(check, name, lambda *a, **k: None)\n"
    "np.allclose = torch.allclose = lambda *a, **k: True\n"
    "def similarity_scores(query, keys):\n"
    "    return None\n")
# name -> (answer cell, its source, based on the solution (True) or the blank exercise (False))
CH01_VARIANTS = {
    "reference_alias": ("ch01_soft_lookup",
                        "from course_lib.lookup import soft_lookup as mine\n\n"
                        "def soft_lookup(query, keys, values, temperature=1.0):\n"
                        "    return mine(query, keys, values, temperature)", True),
    "os_exit": ("ch01_softmax", "import os\nos._exit(1)", True),
    "rebinds_checkers": ("ch01_scores", REBIND_CHECKERS, False),
    "forges_the_worker_result": ("ch01_scores", FIND_WORKER, False),
    "runs_the_solutions": ("ch01_scores", RUN_SOLUTIONS, False),
    # with the sandbox only: without one it would rewrite the real course for a moment
    "rewrites_the_checkers": ("ch01_scores", REWRITE_CHECKERS, False),
}
ATTACKS = ["rebinds_checkers", "forges_the_worker_result", "runs_the_solutions",
           "rewrites_the_checkers"]

# ------------------------------------------------- the cheats only a kernel shows (issue 23)

DISARM = (  # clear the trap, unregister the forbid list, then call the course's reference
    "import sys, threading\n"
    "from course_lib.lookup import soft_lookup as _reference\n"
    "object.__setattr__(check.soft_lookup, 'forbid', ())\n"
    "sys.setprofile(None)\n"
    "threading.setprofile(None)\n"
    "def soft_lookup(query, keys, values, temperature=1.0):\n"
    "    return _reference(query, keys, values, temperature)\n")
FULL_GRID = (  # a full-grid causal attention in NumPy (0 FLOPs, ~0 bytes seen by torch)
    "import numpy as np\n"
    "def causal_tiled(q, k, v, block_size):\n"
    "    Q, K, V = (np.asarray(t, dtype=np.float64) for t in (q, k, v))\n"
    "    n = len(Q)\n"
    "    s = Q @ K.T / np.sqrt(Q.shape[1])\n"
    "    s[np.arange(n)[:, None] < np.arange(n)[None, :]] = -np.inf\n"
    "    w = np.exp(s - s.max(1, keepdims=True))\n"
    "    return torch.tensor((w / w.sum(1, keepdims=True)) @ V, dtype=q.dtype)\n")
ALL_TILES_IN_NUMPY = (  # tile by tile (no grid, 0 FLOPs read), every future tile computed
    "import numpy as np\n"
    "def causal_tiled(q, k, v, block_size):\n"
    "    Q, K, V = (np.asarray(t, dtype=np.float64) for t in (q, k, v))\n"
    "    n, d = Q.shape\n"
    "    out = np.empty((n, V.shape[1]))\n"
    "    for i in range(0, n, block_size):\n"
    "        s = Q[i:i + block_size] @ K.T / np.sqrt(d)\n"
    "        s[np.arange(i, i + len(s))[:, None] < np.arange(n)[None, :]] = -np.inf\n"
    "        w = np.exp(s - s.max(1, keepdims=True))\n"
    "        out[i:i + block_size] = (w / w.sum(1, keepdims=True)) @ V\n"
    "    return torch.tensor(out, dtype=q.dtype)\n")
# name -> (notebook, answer cell, its source, the graded cell it must lose)
KERNEL_CHEATS = {
    "ch01_disarms_forbid": (CH01, "ch01_soft_lookup", DISARM, "ch01_soft_lookup_test"),
    "ch04_checker_reference": (CH04, "ch04_causal_attention",
                               "def causal_attention(q, k, v):\n"
                               "    return check._causal_reference(q, k, v)\n",
                               "ch04_causal_attention_test"),
    "ch08_full_grid_in_numpy": (CH08, "ch08_causal_tiled", FULL_GRID, "ch08_causal_tiled_test"),
    "ch08_all_tiles_in_numpy": (CH08, "ch08_causal_tiled", ALL_TILES_IN_NUMPY,
                                "ch08_causal_tiled_test"),
}
# Without the sandbox (macOS, Windows, --unsafe-no-sandbox) the stripped copy, the trap's
# disarming seen by the scan and the outside memory judge apply the same: one of each.
UNSANDBOXED = ["ch01_disarms_forbid", "ch04_checker_reference", "ch08_full_grid_in_numpy"]

# Chapter 08's row softmax in Triton (issue 23, "measure from outside"): the interpreter runs
# NumPy inside @triton.jit (no GPU would), or the launch is for show and torch answers.
ROW_SOFTMAX = "ch08_row_softmax"
LAUNCH = ("    def row_softmax(x):\n"
          "        y = torch.empty(x.shape)\n"
          "        softmax_kernel[(x.shape[0],)](x, y, x.stride(0), y.stride(0), x.shape[1],\n"
          "                                      BLOCK=triton.next_power_of_2(x.shape[1]))\n")
KERNEL_HEAD = ("    @triton.jit\n"
               "    def softmax_kernel(X, Y, x_stride, y_stride, n_cols, BLOCK: tl.constexpr):\n"
               "        row = tl.program_id(0)\n"
               "        offsets = tl.arange(0, BLOCK)\n"
               "        inside = offsets < n_cols\n"
               "        x = tl.load(X + row * x_stride + offsets, mask=inside,\n"
               "                    other=-float('inf'))\n")
TRITON_CHEATS = {
    "numpy_in_the_kernel": ("if HAVE_TRITON:\n    import numpy as np\n\n" + KERNEL_HEAD +
                            "        d = x.handle.data\n"
                            "        d[:] = np.exp(d - np.max(d)) / np.sum(np.exp(d - np.max(d)))\n"
                            "        tl.store(Y + row * y_stride + offsets, x, mask=inside)\n\n"
                            + LAUNCH + "        return y\n"),
    "torch_softmax_outside": ("if HAVE_TRITON:\n" + KERNEL_HEAD +
                              "        tl.store(Y + row * y_stride + offsets, x, mask=inside)\n\n"
                              + LAUNCH + "        return torch.softmax(x, dim=-1)\n"),
    "torch_exp_outside": ("if HAVE_TRITON:\n" + KERNEL_HEAD +
                          "        tl.store(Y + row * y_stride + offsets, x, mask=inside)\n\n"
                          + LAUNCH + "        e = torch.exp(x - x.amax(1, keepdim=True))\n"
                          "        return e / e.sum(1, keepdim=True)\n"),
}


# ------------------------------------------------------------------------------ the batch

@dataclass
class Batch:
    results: dict            # key -> one `course grade --json` result (a dict)
    digests: tuple           # ({path: digest} before, after): the submissions, untouched
    marked: tuple            # course files carrying the rewrite attack's mark, before and after
    sandboxed: bool

    def __getitem__(self, key):
        return self.results[key]

    def __contains__(self, key):
        return key in self.results


def _edited(folder: str, notebook: str, gid: str, source: str):
    nb = nbformat.read(REPO / folder / notebook, as_version=4)
    cells = [c for c in nb.cells if grade_id(c) == gid]
    assert len(cells) == 1, (notebook, gid)
    cells[0].source = source
    return nb


def course_marked() -> list[str]:
    """Course files carrying the mark of the rewrite attack (the live tree, which other authors
    may be editing meanwhile, so its digests are not compared; tests/test_grading_attacks.py
    compares the fixture course's files byte for byte)."""
    files = [*(REPO / "course_lib").rglob("*.py"), *(REPO / "solutions").glob("*.ipynb")]
    return [str(p) for p in files if "_pwned" in p.read_text(encoding="utf-8", errors="replace")]


def submissions(folder: Path, sandboxed: bool) -> dict:
    """Write every submission of the sandboxed run under folder: {key: path}. Snapshots of the
    chapters' notebooks, so an author re-executing one meanwhile cannot make the results race.
    The attacks and cheats come first, and the solutions and blanks after them."""
    paths = {}

    def put(key, name, nb):
        paths[key] = folder / name
        nbformat.write(nb, paths[key])

    if CH01 in CHAPTERS:
        for name, (gid, source, from_solution) in CH01_VARIANTS.items():
            if name == "rewrites_the_checkers" and not sandboxed:
                continue
            put(("variant", name), f"01_{name}.ipynb",
                _edited("solutions" if from_solution else "exercises", CH01, gid, source))
    for name, (notebook, gid, source, _) in KERNEL_CHEATS.items():
        if notebook in CHAPTERS:
            put(("cheat", name), f"{notebook[:2]}_{name}.ipynb",
                _edited("exercises", notebook, gid, source))
    if CH08 in CHAPTERS:
        for name, source in TRITON_CHEATS.items():
            put(("triton", name), f"08_{name}.ipynb",
                _edited("exercises", CH08, ROW_SOFTMAX, source))
    for name in CHAPTERS:
        for kind in ("solutions", "exercises"):
            (folder / kind).mkdir(exist_ok=True)
            paths[(kind, name)] = folder / kind / name
            paths[(kind, name)].write_bytes((REPO / kind / name).read_bytes())
    paths[("junk", "")] = folder / "junk.ipynb"
    paths[("junk", "")].write_bytes(b"\x00not a notebook")
    return paths


def grade(folder: Path) -> Batch:
    """Grade the batch: ONE `course grade --json` over every submission (sandboxed where
    bubblewrap works), then the unsandboxed cheats in a second, small run."""
    sandboxed = sandbox.unavailable() is None
    (folder / "sandboxed").mkdir()
    paths = submissions(folder / "sandboxed", sandboxed)
    before = {p: grading.file_digest(p) for p in paths.values()}
    marked_before = course_marked()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["grade", *map(str, paths.values()), "--json", "--timeout",
                           str(TIMEOUT_S), "--jobs", str(JOBS),
                           *([] if sandboxed else ["--unsafe-no-sandbox"])])
    assert status == 0, out.getvalue()[-2000:]
    by_path = {Path(r["submission"]): r for r in json.loads(out.getvalue())}
    results = {key: by_path[p] for key, p in paths.items()}

    bare = folder / "unsandboxed"
    bare.mkdir()
    loose = {}
    for name in UNSANDBOXED:
        notebook, gid, source, _ = KERNEL_CHEATS[name]
        if notebook in CHAPTERS:
            loose[("unsandboxed", name)] = bare / f"{notebook[:2]}_{name}.ipynb"
            nbformat.write(_edited("exercises", notebook, gid, source),
                           loose[("unsandboxed", name)])
    before.update({p: grading.file_digest(p) for p in loose.values()})
    graded = grading.grade(list(loose.values()), timeout=TIMEOUT_S, jobs=JOBS, sandbox=False)
    by_path = {Path(r["submission"]): r for r in json.loads(grading.format_json(graded))}
    results.update({key: by_path[p] for key, p in loose.items()})

    after = {p: grading.file_digest(p) for p in before}
    return Batch(results, (before, after), (marked_before, course_marked()), sandboxed)


@pytest.fixture(scope="module")
def graded_batch(tmp_path_factory):
    return grade(tmp_path_factory.mktemp("graded_batch"))


# ------------------------------------------------ every chapter: solution full, blank zero


def test_chapter_notebooks_and_course_files_are_byte_identical_after_grading(graded_batch):
    before, after = graded_batch.digests
    assert after == before
    course_before, course_after = graded_batch.marked
    assert course_before == course_after == []


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_solution_scores_full_points(graded_batch, name):
    r = graded_batch[("solutions", name)]
    assert r["error"] is None and len(r["exercises"]) >= 3
    assert r["score"] == r["max_score"] > 0, [(e["id"], e["feedback"]) for e in r["exercises"]
                                              if e["feedback"] != "passed"]


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_blank_exercise_scores_zero(graded_batch, name):
    """The one run of every blank exercise in the suite: each exercise fails as "not written
    yet" with one of its hints, and nothing else (a set-up cell, a check) breaks."""
    r = graded_batch[("exercises", name)]
    assert r["error"] is None and r["score"] == 0 and r["max_score"] > 0
    the_hints = hints(nbformat.read(REPO / "solutions" / name, as_version=4))
    for e in r["exercises"]:
        assert "not written yet" in e["feedback"], e
        assert any(h in e["feedback"] for h in the_hints), e
        assert "set-up cell" not in e["feedback"] and not e["flagged"], e


# ------------------------------------------------------------ chapter 01's hostile answers


@pytest.mark.parametrize("name", ATTACKS)
def test_the_issues_attacks_on_chapter_01_score_0_and_are_flagged(graded_batch, name):
    if ("variant", name) not in graded_batch:
        pytest.skip("chapter 01 is not there" if CH01 not in CHAPTERS else
                    "needs the sandbox (it would rewrite the real course for a moment)")
    r = graded_batch[("variant", name)]
    assert r["score"] == 0 and r["exercises"], r
    assert all(e["flagged"] and e["feedback"].startswith(grading.FLAG) for e in r["exercises"]), r


def test_hostile_submissions_of_a_real_chapter(graded_batch):
    assert graded_batch[("junk", "")]["error"].startswith("not a readable Jupyter notebook")
    if CH01 not in CHAPTERS:
        pytest.skip("chapter 01 is not there")
    by_id = {e["id"]: e for e in graded_batch[("variant", "reference_alias")]["exercises"]}
    flagged = by_id.pop("ch01_soft_lookup_test")
    assert flagged["score"] == 0 and flagged["feedback"].startswith(grading.FLAG)
    assert flagged["flagged"] is True
    assert "calls the course's own `course_lib.lookup.soft_lookup`" in flagged["feedback"]
    assert all(e["score"] == e["max_score"] for e in by_id.values())
    # os._exit in the softmax answer: that exercise and the one that needs softmax fail, the
    # kernel is restarted, and the others still score.
    by_id = {e["id"]: e for e in graded_batch[("variant", "os_exit")]["exercises"]}
    assert by_id["ch01_softmax_test"]["score"] == 0
    assert "kernel died" in by_id["ch01_softmax_test"]["feedback"]
    assert by_id["ch01_scores_test"]["score"] == by_id["ch01_scores_test"]["max_score"]
    assert by_id["ch01_gradient_test"]["score"] == by_id["ch01_gradient_test"]["max_score"]


# ------------------------------------------------ the cheats only a kernel shows (issue 23)
# Each earned full points before the grading kernel's course_lib was stripped. Cheats that the
# grader's reading of the source catches are tested on the source (tests/test_grader_reach.py::
# test_the_issues_cheats_are_caught_by_reading_the_source); the references a cheat could call
# are stubs in the stripped copy (tests/test_grading_stripped.py).


def _scores_0(result: dict, name: str) -> None:
    target = KERNEL_CHEATS[name][3]
    assert result["error"] is None, result["error"]
    scores = {e["id"]: e for e in result["exercises"]}
    feedback = scores[target]["feedback"]
    assert scores[target]["score"] == 0, (target, feedback)
    assert scores[target]["flagged"] or "does not have it" in feedback or \
        strip.IN_GRADER in feedback or "read from outside the kernel" in feedback or \
        "torch's FLOP counter saw only" in feedback, feedback


@pytest.mark.parametrize("name", sorted(KERNEL_CHEATS))
def test_a_cheat_that_calls_a_reference_the_kernel_had_scores_0(graded_batch, name):
    _scores_0(graded_batch[("cheat", name)], name)


@pytest.mark.parametrize("name", UNSANDBOXED)
def test_without_the_sandbox_the_same_cheats_score_0(graded_batch, name):
    _scores_0(graded_batch[("unsandboxed", name)], name)


# Chapter 08's Triton row softmax cheated (the same cheats in-process: tests/test_checks_ch08.py):
# with only that answer written, the whole notebook scores 0.
TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None or
                            sandbox.unavailable() is not None or CH08 not in CHAPTERS,
                            reason="needs Triton (Linux), the sandbox (bubblewrap), chapter 08")


@TRITON
@pytest.mark.parametrize("name", sorted(TRITON_CHEATS))
def test_a_cheating_row_softmax_scores_0(graded_batch, name):
    r = graded_batch[("triton", name)]
    assert r["error"] is None, r["error"]
    by_id = {e["id"]: e for e in r["exercises"]}
    softmax = by_id[f"{ROW_SOFTMAX}_test"]
    assert softmax["score"] == 0, softmax
    assert r["score"] == 0, [(e["id"], e["score"]) for e in r["exercises"] if e["score"]]


@TRITON
def test_numpy_in_the_kernel_is_named(graded_batch):
    feedback = {e["id"]: e for e in graded_batch[("triton", "numpy_in_the_kernel")]["exercises"]}
    assert "calls numpy.exp inside @triton.jit" in feedback[f"{ROW_SOFTMAX}_test"]["feedback"]


@TRITON
def test_work_outside_the_kernel_is_named(graded_batch):
    feedback = {e["id"]: e for e in graded_batch[("triton", "torch_exp_outside")]["exercises"]}
    assert "returns a tensor that softmax_kernel was not given" in \
        feedback[f"{ROW_SOFTMAX}_test"]["feedback"]
