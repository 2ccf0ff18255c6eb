"""Chapter 08's checks of tiling in plain torch: the online-softmax update that survives a fully
masked tile (build), causal tiled attention (build), and predicting, explaining and measuring
what causal tiling saves (predict, why, experiment). Re-exported by `course_lib.checks.ch08`."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import course_lib.flash.tiled as tiled
from course_lib.checks._cases import generator
from course_lib.checks._core import call, expect_close, expect_pair, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check, value_check
from course_lib.checks._judging import each, value
from course_lib.checks._mistakes import Mistake, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._routes import ATTENTION
from course_lib.checks._values import read_number

__all__ = ["online_update", "causal_tiled", "causal_fraction", "fraction_why",
           "measured_causal_fraction"]

SOLUTION = "solutions/08_efficient_kernel.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
KERNEL_HALF = ("_tiled_run", "_warm_flop_counter", "_Products")


# ---------------------------------------------------------------- exercise 1

def _reference_update(m, l, tile, rescale: bool = True):
    """The update (rescale=False: the old sum is not brought to the new max, the mistake)."""
    m_new = torch.maximum(m, tile.amax(dim=1))
    safe = torch.where(m_new == -math.inf, 0.0, m_new)  # a row that has seen only -inf so far
    old = l * torch.exp(m - safe) if rescale else l
    return m_new, old + torch.exp(tile - safe[:, None]).sum(dim=1)


def _update_cases(seed: int, hidden: bool) -> list:
    """One case per tile of a row of scores, each starting from the exact running state."""
    g = generator(1, seed)
    rows_of_scores = [torch.randn(3, 12, generator=g, dtype=torch.float64) * 2,
                      torch.randn(2, 10, generator=g, dtype=torch.float64) * 1e4]  # huge logits
    masked = torch.randn(3, 12, generator=g, dtype=torch.float64)
    masked[0, :4] = -math.inf   # row 0: a fully masked FIRST tile (it has seen nothing yet)
    masked[1, 4:8] = -math.inf  # row 1: a fully masked tile after a visible one
    masked[2, :] = -math.inf    # row 2: every key masked (a padding row)
    rows_of_scores.append(masked)
    if hidden:
        late = torch.randn(2, 12, generator=g, dtype=torch.float64)
        late[:, :8] = -math.inf
        rows_of_scores += [late, torch.randn(1, 3, generator=g, dtype=torch.float64)]
    cases = []
    for scores in rows_of_scores:
        rows, n = scores.shape
        m = torch.full((rows,), -math.inf, dtype=torch.float64)
        l = torch.zeros(rows, dtype=torch.float64)
        for start in range(0, n, 4):
            tile = scores[:, start:start + 4]
            cases.append({"m": m, "l": l, "tile": tile, "first": start == 0})
            m, l = _reference_update(m, l, tile)
    return cases


def _sum(update):
    return update[1]


@function_check(1, args=("m", "l", "tile"), cases=_update_cases, reference=_reference_update,
                mistakes=(
    Mistake("l_new adds the tile's terms to the old sum without rescaling it: the old sum was "
            "measured against the old max and must be brought to the new one first.",
            partial(_reference_update, rescale=False), atol=1e-8, rtol=1e-9, on=_sum),
))
def online_update(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        m, l, tile = case["m"], case["l"], case["tile"]
        rows = tile.shape[0]
        m_want, l_want = _reference_update(m, l, tile)
        got = expect_pair(result, "online_update", "(m_new, l_new)")
        m_got = to_tensor(got[0], "m_new", dtype=torch.float64)
        l_got = to_tensor(got[1], "l_new", dtype=torch.float64)
        expect_shape(m_got, (rows,), "m_new", "One running max per row: reduce over the tile's "
                     "key axis (dim=1).")
        expect_shape(l_got, (rows,), "l_new", "One running sum per row: reduce over dim=1.")
        nothing_seen = m_want == -math.inf
        if (torch.isnan(m_got[nothing_seen]).any() or torch.isnan(l_got[nothing_seen]).any()):
            fail("a row whose scores so far are ALL -inf (a fully masked tile, nothing seen "
                 "yet) gives NaN: exp(-inf - (-inf)) is exp(NaN). Such a row must stay at "
                 "m = -inf, l = 0: subtract a finite stand-in for its max.")
        expect_close(m_got, m_want, "m_new", atol=0, rtol=1e-12,
                     hint="The new running max is the larger of the old max and this tile's "
                          "max.")
        if torch.isfinite(l_want).all() and not torch.isfinite(l_got).all():
            fail("l_new contains inf/NaN: exp(score) overflows for large scores. Exponentiate "
                 "each score minus the NEW running max, so the largest term is exp(0) = 1.")
        named_mistake(case, (m_got, l_got))
        expect_close(l_got, l_want, "l_new", atol=1e-12, rtol=1e-9,
                     hint="After the update, l_new · exp(m_new) must be the sum of exp over every "
                          "score seen so far.")
    return ("online_update: after every tile, l·exp(m) is the sum of exp over all scores seen, "
            "and a row that has seen only masked scores stays at m = -inf, l = 0 without NaN.")


# ---------------------------------------------------------------- exercise 2

MEMORY_N, MEMORY_BLOCK = 512, 128


def _warm_flop_counter() -> None:
    """FlopCounterMode's first use loads about 150 MB of torch's dispatch machinery, for good.
    Done once when this module is imported (in grading, the grader's first cell), so that the
    kernel's memory read while causal_tiled's probe runs (Check.memory_mb) is the answer's own."""
    with FlopCounterMode(display=False):
        torch.zeros(2, 2) @ torch.zeros(2, 2)


_warm_flop_counter()

GRID_N = 8192  # a hidden case when grading: its (n, n) score grid alone is 256 MiB in float32
GRID_MB = GRID_N * GRID_N * 4 / 2**20


def _causal_reference(q, k, v, rows: int = 1024):
    """Causal attention, a block of `rows` queries at a time (the grader's memory stays small
    at GRID_N too)."""
    n = q.shape[0]
    if n <= rows:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = []
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        allowed = torch.arange(i1)[None, :] <= torch.arange(i0, i1)[:, None]
        out.append(F.scaled_dot_product_attention(q[i0:i1], k[:i1], v[:i1], attn_mask=allowed))
    return torch.cat(out)


def _tiled_reference(q, k, v, block_size, causal: bool = True):
    """Tiled attention as the exercise writes it: causal, the future key blocks skipped and the
    diagonal block masked; causal=False, every tile of the grid (the mask forgotten)."""
    n, d = q.shape
    out = torch.empty(n, v.shape[1], dtype=q.dtype)
    for i in range(0, n, block_size):
        rows = torch.arange(i, min(i + block_size, n))
        q_tile = q[rows] * d ** -0.5
        m = torch.full((len(rows),), -math.inf, dtype=q.dtype)
        l = torch.zeros(len(rows), dtype=q.dtype)
        acc = torch.zeros(len(rows), v.shape[1], dtype=q.dtype)
        for j in range(0, int(rows[-1]) + 1 if causal else n, block_size):
            cols = torch.arange(j, min(j + block_size, n))
            s = q_tile @ k[cols].T
            if causal:
                s = s.masked_fill(cols[None, :] > rows[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(dim=1))
            p, alpha = torch.exp(s - m_new[:, None]), torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=1)
            acc = acc * alpha[:, None] + p @ v[cols]
            m = m_new
        out[rows] = acc / l[:, None]
    return out


def _tiled_out(result):
    """The output in what a causal_tiled case gives: its measurement's, or (out, lse)'s."""
    if isinstance(result, dict):
        result = result.get("out")
    return result[0] if isinstance(result, tuple) and len(result) == 2 else result


def _tiled_cases(seed: int, hidden: bool) -> list:
    g = generator(2, seed)
    shapes = [(16, 8, 8, 8), (50, 16, 12, 8), (64, 8, 8, 16), (33, 4, 4, 32)]
    shapes += [(1, 4, 3, 8), (70, 8, 8, 64), (20, 8, 8, 64)] if hidden else []
    cases = [{"q": torch.randn(n, d, generator=g, dtype=torch.float64),
              "k": torch.randn(n, d, generator=g, dtype=torch.float64),
              "v": torch.randn(n, d_v, generator=g, dtype=torch.float64),
              "block_size": block, "measure": None} for n, d, d_v, block in shapes]
    q, k, v = (torch.randn(MEMORY_N, 16, generator=g) for _ in range(3))
    cases.append({"q": q, "k": k, "v": v, "block_size": MEMORY_BLOCK, "measure": "flops"})
    if hidden:  # grading: memory is read from outside the kernel (Check.memory_mb), at GRID_N
        return cases + [{**{x: torch.randn(GRID_N, 16, generator=g) for x in "qkv"},
                         "block_size": MEMORY_BLOCK, "measure": None}]
    # in the notebook, peak_bytes (torch's profiler) counts it, which itself costs the kernel
    # about 100 MB: too much beside the grader's outside measurement
    return cases + [{"q": q, "k": k, "v": v, "block_size": MEMORY_BLOCK, "measure": "memory"}]


class _Products(TorchDispatchMode):
    """Records the widest matrix product an answer runs, as torch's dispatcher sees it (every
    `@`, `matmul`, `einsum` or `bmm` arrives as one of these operators, however it was spelled):
    a tiled loop multiplies tiles, so no dimension of its products exceeds the block."""

    OPS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
           torch.ops.aten.baddbmm.default}

    def __init__(self):
        super().__init__()
        self.widest = [0, 0, 0]          # (rows, inner, columns) of the widest product seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            a, b = (args[1], args[2]) if func in (torch.ops.aten.addmm.default,
                                                   torch.ops.aten.baddbmm.default) else args[:2]
            shape = [int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])]
            if max(shape) > max(self.widest):
                self.widest = shape
        return func(*args, **(kwargs or {}))


def _tiled_run(fn, case):
    args = (case["q"], case["k"], case["v"], case["block_size"])
    if case["measure"] is None:
        return call(fn, *args, name="causal_tiled")
    box = []
    if case["measure"] == "memory":
        from course_lib.measure import peak_bytes

        peak = peak_bytes(lambda: box.append(call(fn, *args, name="causal_tiled")))
        return {"peak": peak, "out": box[0] if box else None}
    with FlopCounterMode(display=False) as counter, _Products() as products:
        out = call(fn, *args, name="causal_tiled")
    return {"flops": counter.get_total_flops(), "widest": products.widest, "out": out}


@function_check(2, run=_tiled_run, cases=_tiled_cases,
                forbid=ATTENTION,
                memory_mb=GRID_MB / 2,
                memory_note=f"it holds about the {GRID_N}x{GRID_N} score grid of the check's "
                            f"largest hidden case ({GRID_MB:.0f} MiB in float32) at once: "
                            "compute the scores one (block x block) tile at a time",
                reference=_tiled_reference, mistakes=(
    Mistake("your output is attention WITHOUT the causal mask: query i must see keys 0..i only.",
            partial(_tiled_reference, causal=False), atol=1e-9, rtol=1e-7, on=_tiled_out),
))
def causal_tiled(cases: list, outcomes: list) -> str:
    peak = flops = widest = None
    for case, got in each(cases, outcomes):
        q, k, v, block = case["q"], case["k"], case["v"], case["block_size"]
        if case["measure"] is not None:
            if not isinstance(got, dict):
                fail("the measurement of causal_tiled came back malformed.")
            peak, flops = got.get("peak", peak), got.get("flops", flops)
            widest = got.get("widest", widest)
            got = got.get("out")
        if isinstance(got, tuple) and len(got) == 2:
            got = got[0]  # (out, logsumexp) is fine too
        want = _causal_reference(q, k, v)
        t = to_tensor(got, "causal_tiled(q, k, v, block_size)", dtype=want.dtype)
        expect_shape(t, want.shape, "the output",
                     f"One row per query and d_v = {v.shape[1]} columns (the width of v).")
        tol = 1e-9 if want.dtype == torch.float64 else 1e-5
        if q.shape[0] <= 1024:  # the grader's time: not on the largest hidden case
            named_mistake(case, t)
        expect_close(t, want, "the output", atol=tol, rtol=tol * 100,
                     hint="Query i may see keys 0..i: skip key blocks that start after the query "
                          "block ends and mask the scores above the diagonal inside the block "
                          f"that straddles it. (Case: n={q.shape[0]}, block_size={block}.)")
    grid = MEMORY_N * MEMORY_N * 4
    in_kernel = any(case["measure"] == "memory" for case in cases)
    if not isinstance(flops, int) or isinstance(flops, bool) or in_kernel and (
            not isinstance(peak, int) or isinstance(peak, bool)):
        fail("the measurement of causal_tiled came back malformed.")
    if not (isinstance(widest, list) and len(widest) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) for x in widest)):
        fail("the measurement of causal_tiled came back malformed.")
    rows, inner, cols = widest
    if rows > MEMORY_BLOCK and max(inner, cols) > MEMORY_BLOCK:
        fail(f"at n = {MEMORY_N} and block_size = {MEMORY_BLOCK}, one of your matrix products is "
             f"({rows} x {inner}) @ ({inner} x {cols}): the whole score grid at once, not one "
             "(block x block) tile at a time.")
    if max(widest) > MEMORY_BLOCK:
        fail(f"at n = {MEMORY_N} and block_size = {MEMORY_BLOCK}, one of your matrix products is "
             f"({rows} x {inner}) @ ({inner} x {cols}), wider than a block: each query block "
             "scores its whole causal prefix at once. That is chunking, not tiling: it needs a "
             "(block x n) strip of scores at a time. Go over the key blocks one tile at a time, "
             "and carry the running max, sum and weighted sum from tile to tile (the online "
             "softmax of exercise 1).")
    if in_kernel and peak >= grid / 2:
        fail(f"with n = {MEMORY_N} and block_size = {MEMORY_BLOCK}, your function had "
             f"{peak / 2**20:.2f} MiB allocated at its peak, about the size of the full "
             f"{MEMORY_N}x{MEMORY_N} score grid ({grid / 2**20:.2f} MiB): compute scores one "
             "(block x block) tile at a time.")
    full = _flops(MEMORY_N, 16, MEMORY_BLOCK, causal=False)
    if flops < 0.45 * full:  # under the triangle itself: the work went around torch's counter
        fail(f"torch's FLOP counter saw only {flops:,} FLOPs at n = {MEMORY_N}, less than "
             f"causal attention needs ({0.5 * full:,.0f}, half the full grid): the scores and "
             "the weighted sums are not computed with torch matrix products (`@`), so the check "
             "cannot see which tiles you compute. Use `q_tile @ k_tile.T` and `p @ v_tile`.")
    if flops > 0.8 * full:
        fail(f"your function spends {flops:,} FLOPs at n = {MEMORY_N}, as much as the full grid "
             f"({full:,}): it computes the tiles above the diagonal and throws them away. Skip "
             "every key block that starts after the query block ends.")
    skips = (f"causal_tiled: matches causal SDPA on ragged sizes, skips the future tiles "
             f"({flops / full:.2f} of the full FLOPs at n = {MEMORY_N})")
    if not in_kernel:
        return (f"{skips}; at n = {GRID_N} its memory is judged from outside the kernel, "
                f"against the {GRID_MB:.0f} MiB score grid.")
    return (f"{skips} and peaks at {peak / 2**20:.2f} MiB, well below the "
            f"{grid / 2**20:.0f} MiB score grid.")


# ---------------------------------------------------------------- exercises 3 and 4

FRACTION_N, FRACTION_D, FRACTION_BLOCK = 1024, 64, 128
MEASURE_BLOCK = 64   # exercise 4 measures at a block size the prediction's reveal did not show


def _flops(n: int, d: int, block: int, causal: bool) -> int:
    """FLOPs of the course's tiled_attention (one head) at this size."""
    q = k = v = torch.zeros(1, n, d)
    with FlopCounterMode(display=False) as counter:
        tiled.tiled_attention(q, k, v, causal=causal, block_size=block)
    return counter.get_total_flops()


def measured_fraction(block: int = FRACTION_BLOCK) -> float:
    """FLOPs of causal tiled attention over those of the full grid, at the exercise's size."""
    args = (FRACTION_N, FRACTION_D, block)
    return _flops(*args, causal=True) / _flops(*args, causal=False)


def _read_fraction(got) -> float:
    return read_number(got, "predicted_fraction", 0, 1, "a fraction between 0 and 1")


@commit_check(3, read=_read_fraction, grade="causal_fraction")
def causal_fraction(got: float) -> str:
    measured = measured_fraction()
    t = FRACTION_N // FRACTION_BLOCK
    return (f"prediction committed. The count: causal tiling at block {FRACTION_BLOCK} spends "
            f"{measured:.4f} of the full FLOPs ({t * (t + 1) // 2} of the {t * t} tiles); you "
            f"predicted {got:.3f}.")


fraction_why = choice_check(3, "fraction_why", "abc", module=__name__)


def _the_fraction(case, got) -> dict:
    return {"got": got}


@value_check(4, grade="measured_fraction", reference=partial(measured_fraction, MEASURE_BLOCK),
             mistakes=(
    Mistake("causal_over_full = {got:.4f}: both counts are the same, so both runs were "
            "non-causal (or both causal). Pass causal=True to one of them.",
            lambda: 1.0, atol=0.002, rtol=0, detail=_the_fraction),
    Mistake("causal_over_full = 0.5 is the formula for the masked grid, not a measurement: "
            "count the FLOPs of both calls with FlopCounterMode and divide.",
            lambda: 0.5, atol=0.002, rtol=0),
    Mistake(f"causal_over_full = {{got:.4f}} is the count at block_size = {FRACTION_BLOCK}, "
            f"exercise 3's: this one asks for block_size = {MEASURE_BLOCK}.",
            measured_fraction, atol=0.002, rtol=0, detail=_the_fraction),
))
def measured_causal_fraction(cases: list, outcomes: list) -> str:
    got = read_number(value(outcomes[0], "causal_over_full"), "causal_over_full", 0, 10,
                      "a number (causal FLOPs / full FLOPs)")
    measured = measured_fraction(MEASURE_BLOCK)
    if abs(got - measured) <= 0.002:
        return (f"measured_causal_fraction: {got:.4f} of the full FLOPs at block_size = "
                f"{MEASURE_BLOCK}, as FlopCounterMode counts them: smaller tiles, fewer wasted "
                "diagonal halves, closer to one half.")
    named_mistake(cases[0], got)
    if got > 1:
        fail(f"causal_over_full = {got:.4f} is above 1, upside down: divide the causal count by "
             "the full one.")
    direction = "larger" if got > measured else "smaller"
    fail(f"causal_over_full = {got:.4f} is {direction} than the check's count: use exactly "
         f"n = {FRACTION_N}, d = {FRACTION_D}, block_size = {MEASURE_BLOCK}, one head, the same "
         "inputs for both calls.")
