"""Chapter 08's Triton puzzles, between the first kernel and the row softmax, in the spirit of
Sasha Rush's Triton-Puzzles: the launch is given, the learner writes one small kernel, and the
check runs it through Triton's interpreter on guarded buffers (`guard`), so that a load or
store outside the tensors is stopped and named. Re-exported by `course_lib.checks.ch08`.

* `add_bias_kernel`: a masked 2-D tile, Z = X + b (row vector), on a grid of tiles;
* `row_mean_kernel`: a row reduction, one program per row;
* `row_max_kernel`: a loop over the blocks of a row longer than one block.
"""

from __future__ import annotations

import numpy as np
import torch

import course_lib.flash as flash
from course_lib.checks._cases import generator
from course_lib.checks._core import expect_close, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check
from course_lib.checks._judging import each
from course_lib.checks.ch08.compiling import compile_first
from course_lib.checks.ch08.guard import canary_view, describe, guard, stopped
from course_lib.checks.ch08.kernels import (
    NO_TRITON,
    SKIPPED,
    _interpreted,
    _launch_failed,
    _no_triton,
)

SOLUTION = "solutions/08_efficient_kernel.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
KERNEL_HALF = ("_bias_run", "_block", "_launch", "_max_run", "_mean_run")
TILE = 4          # add_bias_kernel's BLOCK_R = BLOCK_C
MAX_BLOCK = 8     # row_max_kernel's BLOCK: rows are longer
UNDEFINED = ("the masked lanes of your load have no `other=`: on a GPU they hold whatever was in "
             "memory (this check fills them with NaN), and here they reached the result. Give "
             "the load an `other=` that cannot change it.")


def _launch(kernel, name: str, grid: tuple, *args, **meta) -> dict:
    """Run the learner's kernel on the check's own launch, guarded; what happened, as data."""
    if not flash.triton_available():
        return {"skipped": NO_TRITON}
    _interpreted(kernel, name)
    flash.prepare_triton(interpret=True, quiet=True)
    pending = compile_first(kernel, name, args, meta)  # for a GPU first: Python in it fails
    with guard() as record:
        try:
            with np.errstate(all="ignore"):
                kernel[grid](*args, **meta)
        except Exception as e:  # noqa: BLE001 - any learner error becomes feedback
            if stopped(e) is None:
                _launch_failed(e, name, "")
    if pending and "access" not in record:
        fail(pending)
    return record


def _judged(got, name: str, n_cols: int, n_rows: int | None = None, tile=None):
    """The output of one case, after the guard's findings; None when Triton is absent."""
    if not isinstance(got, dict):
        fail(f"the {name} check came back malformed.")
    if _no_triton(got.get("skipped")):
        return None
    if "access" in got:
        fail(describe(got["access"], n_cols, n_rows, tile))
    return got


def _row_cases(g, shapes, spread=1.0) -> list:
    cases = []
    for rows, cols, stride in shapes:
        x = torch.randn(rows, cols, generator=g) * spread
        cases.append({"x": x, "stride": stride})
    return cases


# ------------------------------------------------------------- puzzle 1: a masked 2-D tile

def _bias_cases(seed: int, hidden: bool) -> list:
    g = generator(8, seed)
    shapes = [(5, 7, 9, 8), (4, 4, 4, 4), (9, 3, 5, 6)] + ([(1, 1, 2, 3), (6, 10, 10, 13)]
                                                          if hidden else [])
    return [{"x": torch.randn(r, c, generator=g), "b": torch.randn(c, generator=g),
             "stride_x": sx, "stride_z": sz} for r, c, sx, sz in shapes]


def _bias_run(kernel, case):
    x, b = case["x"], case["b"]
    rows, cols = x.shape
    xv = canary_view(x, case["stride_x"])
    z = canary_view(torch.zeros_like(x), case["stride_z"])
    grid = (-(-rows // TILE), -(-cols // TILE))
    record = _launch(kernel, "add_bias_kernel", grid, xv, b.clone(), z, rows, cols,
                     xv.stride(0), z.stride(0), BLOCK_R=TILE, BLOCK_C=TILE)
    return {**record, "z": z.clone()}


@function_check(6, run=_bias_run, grade="add_bias", cases=_bias_cases)
def add_bias_kernel(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        x, b = case["x"], case["b"]
        rows, cols = x.shape
        if _judged(got, "add_bias_kernel", cols, rows, (TILE, TILE)) is None:
            return f"add_bias_kernel: {SKIPPED}"
        z = to_tensor(got.get("z"), "Z", dtype=torch.float32)
        expect_shape(z, x.shape, "Z")
        want = x + b
        if rows == cols and rows > 1 and torch.allclose(z, x + b[:, None], atol=1e-6):
            fail("b is added along the wrong axis: b[j] belongs to COLUMN j, so it broadcasts "
                 "as a row, b[None, :], over the tile's rows.")
        if not torch.isfinite(z).all() and got.get("undefined_other"):
            fail(UNDEFINED)
        expect_close(z, want, "Z", atol=1e-6, rtol=1e-5,
                     hint=f"(Case: {rows} x {cols}, tiles of {TILE} x {TILE}, row strides "
                          f"{case['stride_x']} and {case['stride_z']}.) Program (i, j) owns rows "
                          f"i*{TILE}.. and columns j*{TILE}..; every element of Z is written "
                          "once.")
    return ("add_bias_kernel: every tile loaded and stored under a 2-D mask, on strided tensors, "
            "without touching a byte outside them.")


# ------------------------------------------------------------- puzzle 2: a row reduction

def _mean_cases(seed: int, hidden: bool) -> list:
    g = generator(9, seed)
    shapes = [(3, 5, 8), (4, 16, 16), (2, 37, 40)] + ([(1, 1, 1), (5, 100, 101)]
                                                       if hidden else [])
    return _row_cases(g, shapes)


def _block(cols: int) -> int:
    return 1 << max(0, cols - 1).bit_length()




def _row_out(case, got, name: str):
    """The OUT of one row-puzzle case after the checks both make; None when Triton is absent."""
    rows, cols = case["x"].shape
    if _judged(got, name, cols) is None:
        return None
    out = to_tensor(got.get("out"), "OUT", dtype=torch.float32)
    expect_shape(out, (rows,), "OUT")
    if not torch.isfinite(out).all() and got.get("undefined_other"):
        fail(UNDEFINED)
    return out


def _each_row(cases: list, outcomes: list, name: str, judge, passed: str) -> str:
    """A row puzzle's judge: `judge(x, out)` on every case's OUT, then `passed`."""
    for case, got in each(cases, outcomes):
        out = _row_out(case, got, name)
        if out is None:
            return f"{name}: {SKIPPED}"
        judge(case["x"], out)
    return passed


def _mean_run(kernel, case, name: str = "row_mean_kernel", block: int | None = None) -> dict:
    """One program per row of X into OUT (n_rows,): row_mean_kernel's launch, BLOCK >= n_cols;
    row_max_kernel's too, with its name and a smaller BLOCK."""
    x = canary_view(case["x"], case["stride"])
    rows, cols = x.shape
    out = torch.zeros(rows)
    record = _launch(kernel, name, (rows,), x, out, cols, x.stride(0), BLOCK=block or _block(cols))
    return {**record, "out": out}


@function_check(7, run=_mean_run, grade="row_mean", cases=_mean_cases)
def row_mean_kernel(cases: list, outcomes: list) -> str:
    def judge(x, out):
        rows, cols = x.shape
        want = x.mean(dim=1)
        block = _block(cols)
        if block > cols and torch.allclose(out, want * cols / block, atol=1e-5):
            fail(f"with {cols} columns in a block of {block}, you divided by BLOCK: a mean "
                 f"divides by the {cols} values the row holds, n_cols.")
        if block > cols and not torch.isfinite(out).all():
            fail("OUT has inf/NaN: the masked lanes joined the sum. Load them as a value that "
                 "adds nothing.")
        expect_close(out, want, "OUT", atol=1e-5, rtol=1e-4,
                     hint=f"(Case: {rows} rows of {cols}, BLOCK = {block}.) Program r loads row "
                          "r as one masked block, sums it with tl.sum and stores one number.")
    return _each_row(cases, outcomes, "row_mean_kernel", judge, "row_mean_kernel: one program "
                     "per row, a masked load, a sum over the block, / n_cols.")


# ------------------------------------------------------------- puzzle 3: a loop over blocks

def _max_cases(seed: int, hidden: bool) -> list:
    g = generator(10, seed)
    shapes = [(3, 8, 8), (4, 37, 40), (2, 13, 13)] + ([(1, 1, 3), (3, 64, 70)]
                                                       if hidden else [])
    cases = _row_cases(g, shapes)
    negative = -torch.rand(3, 21, generator=g) - 0.5  # every score below zero
    return cases + [{"x": negative, "stride": 24}]


def _max_run(kernel, case):
    return _mean_run(kernel, case, "row_max_kernel", MAX_BLOCK)


@function_check(8, run=_max_run, grade="row_max", cases=_max_cases)
def row_max_kernel(cases: list, outcomes: list) -> str:
    def judge(x, out):
        rows, cols = x.shape
        want = x.amax(dim=1)
        if cols > MAX_BLOCK and torch.equal(out, x[:, :MAX_BLOCK].amax(dim=1)) and \
                not torch.equal(want, out):
            fail(f"OUT is the max of the first {MAX_BLOCK} columns only: a row of {cols} needs "
                 f"{-(-cols // MAX_BLOCK)} blocks; loop over them, keeping a running max.")
        if (x < 0).all() and torch.equal(out, torch.zeros(rows)):
            fail("on rows whose scores are all negative OUT is 0: the masked lanes (or the "
                 "running max's starting value) count as 0 and beat every score. Start, and "
                 "fill masked lanes, with -inf.")
        expect_close(out, want, "OUT", atol=0, rtol=0,
                     hint=f"(Case: {rows} rows of {cols}, BLOCK = {MAX_BLOCK}.) for start in "
                          "range(0, n_cols, BLOCK): load the block at start + tl.arange(0, "
                          "BLOCK), masked, and keep the larger of the running max and its max.")
    return _each_row(cases, outcomes, "row_max_kernel", judge, "row_max_kernel: a loop over a "
                     "row's blocks with a running max, the last block masked, right for "
                     "all-negative rows too.")
