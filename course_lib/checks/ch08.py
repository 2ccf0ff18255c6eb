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
from course_lib.checks._core import call, expect_close, expect_shape, fail, forbid, passed, to_tensor


def _pair(result, name: str, what: str):
    if result is None:
        fail(f"{name} returned None: did you forget to `return` {what}?")
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        length = f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""
        fail(f"{name} should return a pair {what}; it returned {type(result).__name__}{length}.")
    return result


def online_update(fn) -> None:
    """Exercise 1: online_update(m, l, scores) -> (m_new, l_new) for one tile of scores.

    m, l: (rows,) running max and running sum; scores: (rows, block). After every tile,
    l · exp(m) must equal the sum of exp(score) over all scores seen so far.
    """
    g = torch.Generator().manual_seed(8)
    cases = [torch.randn(3, 12, generator=g, dtype=torch.float64) * 2,
             torch.randn(2, 10, generator=g, dtype=torch.float64) * 1e4]   # huge logits: stability
    for scores in cases:
        rows, n = scores.shape
        m = torch.full((rows,), -math.inf, dtype=torch.float64)
        l = torch.zeros(rows, dtype=torch.float64)
        for start in range(0, n, 4):
            tile = scores[:, start:start + 4]
            m_want = torch.maximum(m, tile.amax(dim=1))
            l_want = l * torch.exp(m - m_want) + torch.exp(tile - m_want[:, None]).sum(dim=1)
            l_norescale = l + torch.exp(tile - m_want[:, None]).sum(dim=1)
            got = _pair(call(fn, m.clone(), l.clone(), tile.clone(), name="online_update"),
                        "online_update", "(m_new, l_new)")
            m_got = to_tensor(got[0], "m_new", dtype=torch.float64)
            l_got = to_tensor(got[1], "l_new", dtype=torch.float64)
            expect_shape(m_got, (rows,), "m_new", "One running max per row: reduce over the tile's "
                         "key axis (dim=1).")
            expect_shape(l_got, (rows,), "l_new", "One running sum per row: reduce over dim=1.")
            expect_close(m_got, m_want, "m_new", atol=0, rtol=1e-12,
                         hint="The new running max is the larger of the old max and this tile's max.")
            if torch.isfinite(l_want).all() and not torch.isfinite(l_got).all():
                fail("l_new contains inf/NaN: exp(score) overflows for large scores. Exponentiate "
                     "score - m_new instead, so the largest term is exp(0) = 1.")
            if start > 0 and torch.allclose(l_got, l_norescale, rtol=1e-9) \
                    and not torch.allclose(l_norescale, l_want, rtol=1e-9):
                fail("l_new adds the tile's terms to the old sum without rescaling it: the old "
                     "sum was measured against the old max. Multiply it by exp(m - m_new) first.")
            expect_close(l_got, l_want, "l_new", atol=1e-12, rtol=1e-9,
                         hint="l_new = l * exp(m - m_new) + sum_j exp(scores_j - m_new).")
            m, l = m_want, l_want
        lse = m + torch.log(l)
        expect_close(lse, torch.logsumexp(scores, dim=1), "m + log(l) after the last tile")
    passed("online_update: after every tile, l·exp(m) is the sum of exp over all scores seen.")


def _attention_cases():
    g = torch.Generator().manual_seed(9)
    shapes = [(16, 16, 8, 8, 8), (37, 50, 16, 12, 8), (5, 64, 8, 8, 16), (33, 33, 4, 4, 32)]
    for n_q, n_k, d, d_v, block in shapes:
        q = torch.randn(n_q, d, generator=g, dtype=torch.float64)
        k = torch.randn(n_k, d, generator=g, dtype=torch.float64)
        v = torch.randn(n_k, d_v, generator=g, dtype=torch.float64)
        yield q, k, v, block


def tiled_forward(fn) -> None:
    """Exercise 2: tiled_forward(q, k, v, block_size) -> out, softmax(q kᵀ/√d) v by tiles.

    q: (n_q, d), k: (n_k, d), v: (n_k, d_v); n need not be a multiple of block_size. Also
    checks, with torch's memory profiler, that no n_q x n_k grid is ever allocated.
    """
    refs = [(q, k, v, block, F.scaled_dot_product_attention(q, k, v),
             F.scaled_dot_product_attention(q, k, v, scale=1.0)) for q, k, v, block in _attention_cases()]
    forbidden = ((F, "scaled_dot_product_attention"), (flash, "tiled_attention"),
                 (flash, "naive_attention"), (tiled, "tiled_attention"), (tiled, "naive_attention"))
    with forbid(*forbidden, exercise="tiled_forward"):
        for q, k, v, block, want, unscaled in refs:
            got = call(fn, q.clone(), k.clone(), v.clone(), block, name="tiled_forward")
            if isinstance(got, tuple) and len(got) == 2:
                got = got[0]  # (out, logsumexp) is fine too
            t = to_tensor(got, "tiled_forward(q, k, v, block_size)", dtype=torch.float64)
            expect_shape(t, want.shape, "the output",
                         f"One row per query and d_v = {v.shape[1]} columns (the width of v).")
            if torch.allclose(t, unscaled):
                fail("your output matches attention without the 1/√d scale: multiply the scores "
                     "by d ** -0.5.")
            expect_close(t, want, "the output", atol=1e-9, rtol=1e-7,
                         hint="Keep m, l and acc per query row; rescale l and acc by exp(m - m_new) "
                              f"at every tile and divide acc by l at the end. (Case: n_q={q.shape[0]}, "
                              f"n_k={k.shape[0]}, block_size={block}: is the last, shorter tile included?)")
    # the memory check runs outside `forbid` (its call tracing would slow the profiler badly);
    # the value checks above already caught answers that call a reference
    n, block = 512, 128
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(n, 16, generator=g) for _ in range(3))
    from course_lib.flash.measure import peak_bytes

    peak = peak_bytes(lambda: call(fn, q, k, v, block, name="tiled_forward"))
    grid = n * n * 4
    if peak >= grid / 2:
        fail(f"with n = {n} and block_size = {block}, your function had {peak / 2**20:.2f} MiB "
             f"allocated at its peak, about the size of the full {n}x{n} score grid "
             f"({grid / 2**20:.2f} MiB): compute scores one (block x block) tile at a time.")
    passed(f"tiled_forward: matches SDPA on ragged sizes, and its peak memory ({peak / 2**20:.2f} MiB "
           f"at n = {n}) stays well below the {grid / 2**20:.0f} MiB score grid.")


# ------------------------------------------------------------------------------------------------
# exercise 3: the inner step of a Triton kernel, through the interpreter
# ------------------------------------------------------------------------------------------------

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


def triton_inner_step(fn) -> None:
    """Exercise 3: a @triton.jit function attn_inner_step(acc, l_i, m_i, qk, v) -> (acc, l_i, m_i),
    the online-softmax update of one key block inside a Triton kernel, run through the
    interpreter on a CPU."""
    if not flash.triton_available():
        passed("triton_inner_step: skipped, Triton is not installed here (it ships for Linux "
               "only); the other exercises still count.")
        return
    if fn is None:
        fail("`attn_inner_step` is None: define it in the cell above and run that cell first.")
    kind = type(fn).__name__
    if kind not in ("InterpretedFunction", "JITFunction"):
        fail(f"`attn_inner_step` should be a Triton function (decorate it with @triton.jit); "
             f"got a {kind}.")
    if kind == "JITFunction":
        fail("`attn_inner_step` was compiled for a GPU, but this check runs Triton's interpreter: "
             "run the notebook's set-up cell (prepare_triton(interpret=True)) before defining it.")
    kernel = _inner_step_kernel()
    if not flash.interpreter_ready():
        fail("Triton was imported before its interpreter was switched on, so this check cannot "
             "run your function: restart the kernel and run the set-up cell "
             "(prepare_triton(interpret=True)) before anything imports triton.")
    g = torch.Generator().manual_seed(12)
    cases = [(32, 64, 16, 1.0), (64, 128, 32, 1.0), (32, 64, 16, 60.0)]  # the last: huge logits
    for n_q, n_k, d, spread in cases:
        q = torch.randn(n_q, d, generator=g) * spread
        k, v = torch.randn(n_k, d, generator=g), torch.randn(n_k, d, generator=g)
        out = torch.empty(n_q, d)
        scale = d ** -0.5
        try:
            with np.errstate(all="ignore"):  # an unstable answer's overflow is reported below
                kernel[(n_q // 16,)](q, k, v, out, n_k, scale, STEP=fn, BLOCK_M=16, BLOCK_N=16, D=d)
        except Exception as e:  # noqa: BLE001 - any learner error becomes feedback
            hint = _not_written_hint(e)
            if hint is not None:
                fail("`attn_inner_step` (or a function it calls) is not written yet"
                     + (f". Hint: {hint}" if hint else "."))
            message = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
            fail(f"running the kernel with your `attn_inner_step` raised {type(e).__name__}: "
                 f"{message}. It must return the triple (acc, l_i, m_i) with the same shapes it got.")
        want = F.scaled_dot_product_attention(q, k, v)
        if spread > 1 and not torch.isfinite(out).all():
            fail("with large scores the kernel's output has inf/NaN: exponentiate qk - m_new "
                 "(the new running max), never qk itself.")
        expect_close(out, want, "the kernel's output", atol=2e-4, rtol=2e-4,
                     hint="m_new = max(m_i, row max of qk); p = exp(qk - m_new[:, None]); "
                          "alpha = exp(m_i - m_new); l_i = l_i*alpha + row sum of p; "
                          "acc = acc*alpha[:, None] + tl.dot(p, v).")
    passed("triton_inner_step: the kernel built on your step matches SDPA, large scores included.")
