"""Chapter 08's backward-pass exercise: FlashAttention's backward in plain torch, block by block
from the saved log-sum-exp, judged against autograd. Re-exported by `course_lib.checks.ch08`."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from course_lib.checks._cases import generator
from course_lib.checks._core import call, expect_close, expect_pair, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, named_mistake
from course_lib.checks._routes import ATTENTION

SOLUTION = "solutions/08_efficient_kernel.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
KERNEL_HALF = ("_run",)

MEMORY_N, MEMORY_BLOCK = 1024, 64


def _case(g, n_q, n_k, d, d_v, block, dtype=torch.float64, measure=False) -> dict:
    q, k = (torch.randn(n, d, generator=g, dtype=dtype) for n in (n_q, n_k))
    v = torch.randn(n_k, d_v, generator=g, dtype=dtype)
    do = torch.randn(n_q, d_v, generator=g, dtype=dtype)
    s = q @ k.T / math.sqrt(d)
    lse = torch.logsumexp(s, dim=-1)                    # what the forward pass saved
    o = torch.exp(s - lse[:, None]) @ v
    return {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "block_size": block,
            "measure": measure}


def _cases(seed: int, hidden: bool) -> list:
    g = generator(7, seed)
    sizes = [(8, 8, 4, 4, 4), (20, 37, 8, 6, 8), (33, 16, 16, 16, 16), (5, 64, 8, 8, 32)]
    sizes += [(1, 1, 4, 3, 8), (50, 70, 8, 8, 16)] if hidden else []
    cases = [_case(g, *size) for size in sizes]
    return cases + [_case(g, MEMORY_N, MEMORY_N, 16, 16, MEMORY_BLOCK, torch.float32, True)]


def _run(fn, case):
    args = [case[key] for key in ("q", "k", "v", "o", "lse", "do", "block_size")]
    if not case["measure"]:
        return call(fn, *args, name="flash_backward")
    from course_lib.measure import peak_bytes

    box = []
    peak = peak_bytes(lambda: box.append(call(fn, *args, name="flash_backward")))
    return {"peak": peak, "out": box[0] if box else None}


def _autograd(case) -> tuple:
    q, k, v = (case[key].clone().requires_grad_() for key in "qkv")
    out = F.scaled_dot_product_attention(q, k, v)
    return torch.autograd.grad(out, (q, k, v), case["do"])


def _backward(q, k, v, o, lse, do, block_size, delta: str = "row", dq_scale: float = 1.0,
              dk_scale: float = 1.0):
    """The backward pass one key block at a time, from the log-sum-exp. The mistakes: delta
    "none" (dS = P ∘ dP, no correction term) or "block" (Δ from each key block alone,
    rowsum(P_j ∘ dP_j)); dq_scale or dk_scale sqrt(d) (the 1/sqrt(d) of the chain rule left
    out of that gradient)."""
    c = q.shape[1] ** -0.5
    row = (do * o).sum(1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.empty_like(k), torch.empty_like(v)
    for j in range(0, k.shape[0], block_size):
        keys = slice(j, j + block_size)
        p = torch.exp(q @ k[keys].T * c - lse[:, None])
        dv[keys] = p.T @ do
        dp = do @ v[keys].T
        d = row if delta == "row" else (p * dp).sum(1, keepdim=True) if delta == "block" else 0
        ds = p * (dp - d)
        dk[keys], dq = c * dk_scale * ds.T @ q, dq + c * dq_scale * ds @ k[keys]
    return dq, dk, dv


def _dq_dk(result) -> tuple:
    """dq and dk in what a flash_backward case gives (its measurement's too)."""
    if isinstance(result, dict):
        result = result.get("out")
    return tuple(result[:2])


def _dq(result):
    return _dq_dk(result)[0]


def _unscaled(q, k, v, o, lse, do, block_size, dk_only: bool = False):
    """The backward with the 1/sqrt(d) of the chain rule left out (of dK alone: dk_only)."""
    scale = q.shape[1] ** 0.5
    return _backward(q, k, v, o, lse, do, block_size, dq_scale=1.0 if dk_only else scale,
                     dk_scale=scale)


@function_check(10, run=_run, cases=_cases,
                forbid=(*ATTENTION, (torch.autograd, "grad"), (torch.Tensor, "backward"),
                        (torch.autograd, "backward"), (torch.autograd.functional, "vjp"),
                        (torch.func, "vjp"), (torch.func, "grad")),
                reference=_backward, mistakes=(
    Mistake("dq and dk miss the softmax's correction term: dS = P ∘ (dP - Δ), where Δ = "
            "rowsum(dO ∘ O) is one number per query row.",
            partial(_backward, delta="none"), atol=1e-9, rtol=1e-7, on=_dq_dk),
    Mistake("dq and dk take Δ from each key block alone, rowsum(P_j ∘ dP_j): Δ sums over ALL "
            "the keys of a query's row, so one block cannot give it. It equals rowsum(dO ∘ O), "
            "which needs no keys at all: compute it once, before the loop.",
            partial(_backward, delta="block"), atol=1e-9, rtol=1e-7, on=_dq_dk),
    Mistake("dq is sqrt(d) times too large: the scores were q kᵀ / sqrt(d), so the chain rule "
            "brings the 1/sqrt(d) into dQ and dK.", _unscaled, atol=1e-8, rtol=1e-7, on=_dq),
    Mistake("dk is sqrt(d) times too large: the scores were q kᵀ / sqrt(d), so the chain rule "
            "brings the 1/sqrt(d) into dQ and dK.", partial(_unscaled, dk_only=True),
            atol=1e-8, rtol=1e-7, on=_dq_dk),
))
def flash_backward(cases: list, outcomes: list) -> str:
    peak = None
    for case, got in each(cases, outcomes):
        if case["measure"]:
            if not isinstance(got, dict):
                fail("the memory measurement of flash_backward came back malformed.")
            peak, got = got.get("peak"), got.get("out")
        expect_pair(got, "flash_backward", "(dq, dk, dv)", n=3)
        want = _autograd(case)
        tol = 1e-9 if case["q"].dtype == torch.float64 else 1e-4
        grads = []
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            t = to_tensor(g, name, dtype=w.dtype)
            expect_shape(t, w.shape, name, f"{name} has the shape of {name[1]}.")
            grads.append(t)
        n_q, n_k, block = case["q"].shape[0], case["k"].shape[0], case["block_size"]
        expect_close(grads[2], want[2], "dv", atol=tol, rtol=tol * 100,
                     hint="dV_j = P_jᵀ dO, with P_j = exp(S_j - lse) recomputed for key block j "
                          f"(case: n_q={n_q}, n_k={n_k}, block_size={block}).")
        named_mistake(case, tuple(grads))
        for i, name in ((0, "dq"), (1, "dk")):
            expect_close(grads[i], want[i], name, atol=tol, rtol=tol * 100,
                         hint="dQ = Σ_j dS_j K_j / sqrt(d) and dK_j = dS_jᵀ Q / sqrt(d).")
    grid = MEMORY_N * MEMORY_N * 4
    if not isinstance(peak, int) or isinstance(peak, bool):
        fail("the memory measurement of flash_backward came back malformed.")
    if peak >= grid / 2:
        fail(f"with n = {MEMORY_N} and block_size = {MEMORY_BLOCK}, your backward had "
             f"{peak / 2**20:.2f} MiB allocated at its peak, about the size of the full "
             f"{MEMORY_N}x{MEMORY_N} grid ({grid / 2**20:.2f} MiB): recompute P one block of "
             "keys at a time from the log-sum-exp instead.")
    return (f"flash_backward: dQ, dK, dV equal autograd's, from the log-sum-exp alone, and the "
            f"peak ({peak / 2**20:.2f} MiB at n = {MEMORY_N}) stays below the "
            f"{grid / 2**20:.0f} MiB grid.")

