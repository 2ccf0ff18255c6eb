"""Cheating chapter-08 submissions graded through the real grader (issue 23, "measure from
outside"): a Triton row softmax that does its work in NumPy inside the @triton.jit body (the
interpreter runs that; no GPU would), and one whose kernel launch is for show while the answer
comes from torch outside it. Each is chapter 08's blank exercise notebook with only the
row-softmax answer cell written, so the other exercises fail fast and each submission takes
seconds; the row softmax must score 0. The same cheats in-process: tests/test_checks_ch08.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import nbformat
import pytest
from grading_fixture import gid_of

from course_tools import cli
from course_tools.grader import sandbox

REPO = Path(__file__).resolve().parent.parent
CH08 = "08_efficient_kernel.ipynb"
EXERCISE = "ch08_row_softmax"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                       reason="Triton is not installed (it ships for Linux only)"),
    pytest.mark.skipif(not (REPO / "exercises" / CH08).exists(), reason="no chapter 08"),
    pytest.mark.skipif(sandbox.unavailable() is not None,
                       reason="grades in the sandbox (bubblewrap) only"),
]

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
CHEATS = {
    # the interpreter hands the kernel NumPy arrays: do the softmax on them
    "numpy_in_the_kernel": ("if HAVE_TRITON:\n    import numpy as np\n\n" + KERNEL_HEAD +
                            "        d = x.handle.data\n"
                            "        d[:] = np.exp(d - np.max(d)) / np.sum(np.exp(d - np.max(d)))\n"
                            "        tl.store(Y + row * y_stride + offsets, x, mask=inside)\n\n"
                            + LAUNCH + "        return y\n"),
    # a launch for show, the answer from torch
    "torch_softmax_outside": ("if HAVE_TRITON:\n" + KERNEL_HEAD +
                              "        tl.store(Y + row * y_stride + offsets, x, mask=inside)\n\n"
                              + LAUNCH + "        return torch.softmax(x, dim=-1)\n"),
    # ... without naming torch.softmax
    "torch_exp_outside": ("if HAVE_TRITON:\n" + KERNEL_HEAD +
                          "        tl.store(Y + row * y_stride + offsets, x, mask=inside)\n\n"
                          + LAUNCH + "        e = torch.exp(x - x.amax(1, keepdim=True))\n"
                          "        return e / e.sum(1, keepdim=True)\n"),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """ONE `course grade` over every cheat (each a copy of the blank exercise notebook)."""
    folder = tmp_path_factory.mktemp("ch08_cheats")
    paths = {}
    for name, source in CHEATS.items():
        nb = nbformat.read(REPO / "exercises" / CH08, as_version=4)
        cells = [c for c in nb.cells if gid_of(c) == EXERCISE]
        assert len(cells) == 1
        cells[0].source = source
        paths[name] = folder / f"08_{name}.ipynb"
        nbformat.write(nb, paths[name])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["grade", *map(str, paths.values()), "--json", "--timeout", "120"])
    assert status == 0
    by_path = {Path(r["submission"]): r for r in json.loads(out.getvalue())}
    return {name: by_path[p] for name, p in paths.items()}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_cheating_row_softmax_scores_0(graded, name):
    r = graded[name]
    assert r["error"] is None, r["error"]
    by_id = {e["id"]: e for e in r["exercises"]}
    softmax = by_id[f"{EXERCISE}_test"]
    assert softmax["score"] == 0, softmax
    assert r["score"] == 0, [(e["id"], e["score"]) for e in r["exercises"] if e["score"]]


def test_numpy_in_the_kernel_is_named(graded):
    feedback = {e["id"]: e for e in graded["numpy_in_the_kernel"]["exercises"]}
    assert "calls numpy.exp inside @triton.jit" in feedback[f"{EXERCISE}_test"]["feedback"]


def test_work_outside_the_kernel_is_named(graded):
    feedback = {e["id"]: e for e in graded["torch_exp_outside"]["exercises"]}
    assert "returns a tensor that softmax_kernel was not given" in \
        feedback[f"{EXERCISE}_test"]["feedback"]
