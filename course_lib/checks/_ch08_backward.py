"""Chapter 08's backward-pass exercise: FlashAttention's backward in plain torch, block by block
from the saved log-sum-exp, judged against autograd. Re-exported by `course_lib.checks.ch08`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_lib.checks._cases import generator
from course_lib.checks._core import call, expect_close, expect_pair, expect_shape, fail, to_tensor
from course_lib.checks._protocol import each, function_check
from course_lib.checks._routes import ATTENTION

SOLUTION = "solutions/08_efficient_kernel.ipynb"
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


def _no_delta(case) -> tuple:
    """dQ and dK when dS = P * dP, the softmax's backward without the rowsum(dO * O) term."""
    q, k, v, do = case["q"], case["k"], case["v"], case["do"]
    c = q.shape[1] ** -0.5
    p = torch.exp(q @ k.T * c - case["lse"][:, None])
    ds = p * (do @ v.T)
    return c * ds @ k, c * ds.T @ q


def _partial_delta(case) -> tuple:
    """dQ and dK when Δ is taken from each key block alone, rowsum(P_j ∘ dP_j), not the row."""
    q, k, v, do, block = case["q"], case["k"], case["v"], case["do"], case["block_size"]
    c = q.shape[1] ** -0.5
    dq, dk = torch.zeros_like(q), torch.empty_like(k)
    for j in range(0, k.shape[0], block):
        keys = slice(j, j + block)
        p = torch.exp(q @ k[keys].T * c - case["lse"][:, None])
        dp = do @ v[keys].T
        ds = p * (dp - (p * dp).sum(1, keepdim=True))
        dk[keys], dq = c * ds.T @ q, dq + c * ds @ k[keys]
    return dq, dk


@function_check(10, run=_run, cases=_cases,
                forbid=(*ATTENTION, (torch.autograd, "grad"), (torch.Tensor, "backward"),
                        (torch.autograd, "backward"), (torch.autograd.functional, "vjp"),
                        (torch.func, "vjp"), (torch.func, "grad")))
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
        if n_k > 1 and all(torch.allclose(t, w, atol=tol, rtol=tol * 100)
                           for t, w in zip(grads[:2], _no_delta(case))):
            fail("dq and dk miss the softmax's correction term: dS = P ∘ (dP - Δ), where Δ = "
                 "rowsum(dO ∘ O) is one number per query row.")
        if n_k > block and all(torch.allclose(t, w, atol=tol, rtol=tol * 100)
                               for t, w in zip(grads[:2], _partial_delta(case))):
            fail("dq and dk take Δ from each key block alone, rowsum(P_j ∘ dP_j): Δ sums over "
                 "ALL the keys of a query's row, so one block cannot give it. It equals "
                 "rowsum(dO ∘ O), which needs no keys at all: compute it once, before the loop.")
        scale = case["q"].shape[1] ** 0.5
        for i, name in ((0, "dq"), (1, "dk")):
            if torch.allclose(grads[i], want[i] * scale, atol=tol * scale, rtol=tol * 100) \
                    and want[i].abs().max() > 1e-6:
                fail(f"{name} is sqrt(d) times too large: the scores were q kᵀ / sqrt(d), so "
                     "the chain rule brings the 1/sqrt(d) into dQ and dK.")
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

