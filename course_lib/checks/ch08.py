"""Checkers for exercises/08_efficient_kernel.ipynb: the online-softmax update, the tiled
forward pass in torch, and the inner step of a Triton kernel (run through Triton's interpreter)."""

from __future__ import annotations

import math
import re

import numpy as np
import torch
import torch.nn.functional as F

import course_lib.flash as flash
import course_lib.flash.tiled as tiled
from course_lib.checks._core import call, expect_close, expect_shape, fail, to_tensor
from course_lib.checks._protocol import Check, each, hint

__all__ = ["online_update", "tiled_forward", "triton_inner_step", "hint"]

SOLUTION = "solutions/08_efficient_kernel.ipynb"


def _generator(exercise: int, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1009 + exercise) % 2**63)


def _pair(result, name: str, what: str):
    if result is None:
        fail(f"{name} returned None: did you forget to `return` {what}?")
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        length = f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""
        fail(f"{name} should return a pair {what}; it returned {type(result).__name__}{length}.")
    return result


# ---------------------------------------------------------------- exercise 1

def _reference_update(m, l, tile):
    m_new = torch.maximum(m, tile.amax(dim=1))
    return m_new, l * torch.exp(m - m_new) + torch.exp(tile - m_new[:, None]).sum(dim=1)


def _update_cases(seed: int, hidden: bool) -> list:
    """One case per tile of a row of scores, each starting from the exact running state."""
    g = _generator(1, seed)
    rows_of_scores = [torch.randn(3, 12, generator=g, dtype=torch.float64) * 2,
                      torch.randn(2, 10, generator=g, dtype=torch.float64) * 1e4]  # huge logits
    if hidden:
        masked = torch.randn(2, 12, generator=g, dtype=torch.float64)
        masked[:, 4:8] = -math.inf  # a fully masked tile after a visible one
        rows_of_scores += [masked, torch.randn(1, 3, generator=g, dtype=torch.float64)]
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


def _update_judge(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        m, l, tile = case["m"], case["l"], case["tile"]
        rows = tile.shape[0]
        m_want, l_want = _reference_update(m, l, tile)
        l_norescale = l + torch.exp(tile - m_want[:, None]).sum(dim=1)
        got = _pair(result, "online_update", "(m_new, l_new)")
        m_got = to_tensor(got[0], "m_new", dtype=torch.float64)
        l_got = to_tensor(got[1], "l_new", dtype=torch.float64)
        expect_shape(m_got, (rows,), "m_new", "One running max per row: reduce over the tile's "
                     "key axis (dim=1).")
        expect_shape(l_got, (rows,), "l_new", "One running sum per row: reduce over dim=1.")
        expect_close(m_got, m_want, "m_new", atol=0, rtol=1e-12,
                     hint="The new running max is the larger of the old max and this tile's "
                          "max.")
        if torch.isfinite(l_want).all() and not torch.isfinite(l_got).all():
            fail("l_new contains inf/NaN: exp(score) overflows for large scores. Exponentiate "
                 "each score minus the NEW running max, so the largest term is exp(0) = 1.")
        if not case["first"] and torch.allclose(l_got, l_norescale, rtol=1e-9) \
                and not torch.allclose(l_norescale, l_want, rtol=1e-9):
            fail("l_new adds the tile's terms to the old sum without rescaling it: the old sum "
                 "was measured against the old max and must be brought to the new one first.")
        expect_close(l_got, l_want, "l_new", atol=1e-12, rtol=1e-9,
                     hint="After the update, l_new · exp(m_new) must be the sum of exp over every "
                          "score seen so far.")
    return "online_update: after every tile, l·exp(m) is the sum of exp over all scores seen."


online_update = Check(
    id="ch08.online_update",
    cases=_update_cases,
    run=lambda fn, case: call(fn, case["m"], case["l"], case["tile"], name="online_update"),
    judge=_update_judge,
    hints=(
        "The running sum l was measured against the old running max m; when a new tile raises "
        "the max, the old sum must be re-expressed against the new one before adding.",
        "First take the new max over the old max and this tile's row max. Scale the old sum by "
        "the exponential of (old max - new max), then add the tile's exponentials taken "
        "relative to the new max.",
        "m_new = max(m, rowmax(tile)); l_new = l · exp(m - m_new) + Σ_j exp(tile_j - m_new).",
        f"The worked answer is exercise 1 of {SOLUTION}.",
    ),
    grade_ids=("ex08_online_update_test",),
)


# ---------------------------------------------------------------- exercise 2

MEMORY_N, MEMORY_BLOCK = 512, 128


def _tiled_cases(seed: int, hidden: bool) -> list:
    g = _generator(2, seed)
    shapes = [(16, 16, 8, 8, 8), (37, 50, 16, 12, 8), (5, 64, 8, 8, 16), (33, 33, 4, 4, 32)]
    shapes += [(1, 1, 4, 3, 8), (70, 20, 8, 8, 64)] if hidden else []
    cases = [{"q": torch.randn(n_q, d, generator=g, dtype=torch.float64),
              "k": torch.randn(n_k, d, generator=g, dtype=torch.float64),
              "v": torch.randn(n_k, d_v, generator=g, dtype=torch.float64),
              "block_size": block, "memory": False} for n_q, n_k, d, d_v, block in shapes]
    q, k, v = (torch.randn(MEMORY_N, 16, generator=g) for _ in range(3))
    return cases + [{"q": q, "k": k, "v": v, "block_size": MEMORY_BLOCK, "memory": True}]


def _tiled_run(fn, case):
    args = (case["q"], case["k"], case["v"], case["block_size"])
    if not case["memory"]:
        return call(fn, *args, name="tiled_forward")
    from course_lib.measure import peak_bytes

    box = []
    peak = peak_bytes(lambda: box.append(call(fn, *args, name="tiled_forward")))
    return {"peak": peak, "out": box[0] if box else None}


def _tiled_judge(cases: list, outcomes: list) -> str:
    peak = None
    for case, got in each(cases, outcomes):
        q, k, v, block = case["q"], case["k"], case["v"], case["block_size"]
        if case["memory"]:
            if not isinstance(got, dict):
                fail("the memory measurement of tiled_forward came back malformed.")
            peak, got = got.get("peak"), got.get("out")
        if isinstance(got, tuple) and len(got) == 2:
            got = got[0]  # (out, logsumexp) is fine too
        want = F.scaled_dot_product_attention(q, k, v)
        t = to_tensor(got, "tiled_forward(q, k, v, block_size)", dtype=want.dtype)
        expect_shape(t, want.shape, "the output",
                     f"One row per query and d_v = {v.shape[1]} columns (the width of v).")
        if k.shape[0] > 1 and torch.allclose(t, F.scaled_dot_product_attention(q, k, v, scale=1.0)):
            fail("your output matches attention without the 1/√d scale: scale the scores by "
                 "d ** -0.5.")
        tol = 1e-9 if want.dtype == torch.float64 else 1e-5
        expect_close(t, want, "the output", atol=tol, rtol=tol * 100,
                     hint="Keep a running max, sum and output per query row; rescale the sum "
                          "and the output whenever the max grows, and divide at the end. "
                          f"(Case: n_q={q.shape[0]}, n_k={k.shape[0]}, block_size={block}: is "
                          "the last, shorter tile included?)")
    grid = MEMORY_N * MEMORY_N * 4
    if not isinstance(peak, int) or isinstance(peak, bool):
        fail("the memory measurement of tiled_forward came back malformed.")
    if peak >= grid / 2:
        fail(f"with n = {MEMORY_N} and block_size = {MEMORY_BLOCK}, your function had "
             f"{peak / 2**20:.2f} MiB allocated at its peak, about the size of the full "
             f"{MEMORY_N}x{MEMORY_N} score grid ({grid / 2**20:.2f} MiB): compute scores one "
             "(block x block) tile at a time.")
    return (f"tiled_forward: matches SDPA on ragged sizes, and its peak memory "
            f"({peak / 2**20:.2f} MiB at n = {MEMORY_N}) stays well below the "
            f"{grid / 2**20:.0f} MiB score grid.")


tiled_forward = Check(
    id="ch08.tiled_forward",
    cases=_tiled_cases,
    run=_tiled_run,
    judge=_tiled_judge,
    forbid=((F, "scaled_dot_product_attention"), (flash, "tiled_attention"),
            (flash, "naive_attention"), (tiled, "tiled_attention"), (tiled, "naive_attention")),
    hints=(
        "Never hold all n x n scores at once: walk over blocks of keys and keep, for every "
        "query, just enough running state to finish the softmax at the end.",
        "For each block of queries keep a running max, a running sum and a running output. For "
        "each block of keys: score the tile, update the max, rescale the sum and the output by "
        "how much the max grew, add the tile's part. Divide once at the very end; the last "
        "block may be shorter.",
        "Per key tile: s = q_blk kᵀ / sqrt(d); m_new = max(m, rowmax s); α = exp(m - m_new); "
        "p = exp(s - m_new); l = l α + rowsum p; acc = acc α + p v; out = acc / l.",
        f"The worked answer is exercise 2 of {SOLUTION}.",
    ),
    grade_ids=("ex08_tiled_forward_test",),
)


# ---------------------------------------------------------------- exercise 3: Triton

NO_TRITON = "triton-not-installed"


def _inner_step_kernel():
    """The exercise kernel (course_lib/flash/exercise_kernel.py), defined for the interpreter."""
    import importlib

    flash.prepare_triton(interpret=True, quiet=True)
    return importlib.import_module("course_lib.flash.exercise_kernel").one_block_attention


def _not_written_hint(error: BaseException) -> str | None:
    chain, seen = [error], set()
    while chain:
        e = chain.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, NotImplementedError):
            return str(e)
        chain += [x for x in (e.__cause__, e.__context__) if x is not None]
    found = re.search(r"NotImplementedError\(\\?['\"](.*?)\\?['\"]\)", repr(error))
    if found:
        return found.group(1)
    return "" if "NotImplementedError" in repr(error) else None


def _triton_cases(seed: int, hidden: bool) -> list:
    g = _generator(3, seed)
    sizes = [(32, 64, 16, 1.0), (64, 128, 32, 1.0), (32, 64, 16, 60.0)]  # the last: huge logits
    sizes += [(48, 32, 16, 1.0), (16, 16, 16, 30.0)] if hidden else []
    return [{"q": torch.randn(n_q, d, generator=g) * spread, "k": torch.randn(n_k, d, generator=g),
             "v": torch.randn(n_k, d, generator=g), "spread": spread}
            for n_q, n_k, d, spread in sizes]


def _triton_run(fn, case):
    """Launch the exercise kernel with the learner's step (type checks only; no judging)."""
    if not flash.triton_available():
        return NO_TRITON
    if fn is None:
        fail("`attn_inner_step` is None: define it in the cell above and run that cell first.")
    kind = type(fn).__name__
    if kind not in ("InterpretedFunction", "JITFunction"):
        fail(f"`attn_inner_step` should be a Triton function (decorate it with @triton.jit); "
             f"got a {kind}.")
    if kind == "JITFunction":
        fail("`attn_inner_step` was compiled for a GPU, but this check runs Triton's "
             "interpreter: run the notebook's set-up cell (prepare_triton(interpret=True)) "
             "before defining it.")
    kernel = _inner_step_kernel()
    if not flash.interpreter_ready():
        fail("Triton was imported before its interpreter was switched on, so this check cannot "
             "run your function: restart the kernel and run the set-up cell "
             "(prepare_triton(interpret=True)) before anything imports triton.")
    q, k, v = case["q"], case["k"], case["v"]
    n_q, d = q.shape
    out = torch.empty(n_q, d)
    try:
        with np.errstate(all="ignore"):  # an unstable answer's overflow is reported by the judge
            kernel[(n_q // 16,)](q, k, v, out, k.shape[0], d ** -0.5, STEP=fn, BLOCK_M=16,
                                 BLOCK_N=16, D=d)
    except Exception as e:  # noqa: BLE001 - any learner error becomes feedback
        hint_text = _not_written_hint(e)
        if hint_text is not None:
            fail("`attn_inner_step` (or a function it calls) is not written yet"
                 + (f". Hint: {hint_text}" if hint_text else "."))
        message = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
        fail(f"running the kernel with your `attn_inner_step` raised {type(e).__name__}: "
             f"{message}. It must return the triple (acc, l_i, m_i) with the same shapes it got.")
    return out


def _triton_judge(cases: list, outcomes: list) -> str:
    for case, out in each(cases, outcomes):
        if isinstance(out, str) and out == NO_TRITON:
            if flash.triton_available():
                fail("the notebook's kernel has no Triton, so exercise 3 could not run there.")
            return ("triton_inner_step: skipped, Triton is not installed here (it ships for Linux "
                    "only); the other exercises still count.")
        q, k, v = case["q"], case["k"], case["v"]
        want = F.scaled_dot_product_attention(q, k, v)
        t = to_tensor(out, "the kernel's output", dtype=torch.float32)
        expect_shape(t, want.shape, "the kernel's output")
        if case["spread"] > 1 and not torch.isfinite(t).all():
            fail("with large scores the kernel's output has inf/NaN: exponentiate each score "
                 "minus the NEW running max, never the raw score.")
        expect_close(t, want, "the kernel's output", atol=2e-4, rtol=2e-4,
                     hint="After every key block, l_i · exp(m_i) must be the sum of exp over the "
                          "scores seen so far, and acc the matching weighted sum of values.")
    return "triton_inner_step: the kernel built on your step matches SDPA, large scores included."


triton_inner_step = Check(
    id="ch08.triton_inner_step",
    cases=_triton_cases,
    run=_triton_run,
    judge=_triton_judge,
    hints=(
        "It is exercise 1's update once more, now inside a Triton kernel and for the output "
        "too: when the running max grows, everything accumulated so far is rescaled.",
        "From the block's scores qk: new max per row; the probabilities relative to it; the "
        "factor exp(old max - new max); rescale l_i and acc by that factor, then add the row "
        "sums of p and p times v. tl.max, tl.exp, tl.sum and tl.dot work on whole blocks.",
        "m_new = tl.maximum(m_i, tl.max(qk, 1)); p = tl.exp(qk - m_new[:, None]); "
        "α = tl.exp(m_i - m_new); l_i = l_i·α + tl.sum(p, 1); acc = acc·α[:, None] + tl.dot(p, v).",
        f"The worked answer is exercise 3 of {SOLUTION}.",
    ),
    grade_ids=("ex08_triton_inner_step_test",),
)
