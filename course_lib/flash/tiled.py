"""Attention two ways in plain torch: the naive one that builds the whole score grid, and the
tiled one that walks over blocks of keys with an online softmax and never holds more than one
(block x block) tile of scores.

`tiled_attention` mirrors the Triton kernel in `course_lib/flash/kernel.py` loop for loop: the
outer loop over query blocks is the kernel's grid (one program per query block), `_attn_fwd_inner`
below is the kernel's `_attn_fwd_inner`, and the causal case is split the same way, into the key
blocks left of the diagonal (no mask needed) and the one diagonal block (masked).
"""

from __future__ import annotations

import math

import torch

__all__ = ["naive_attention", "tiled_attention", "check_qkv"]


def check_qkv(q, k, v, causal: bool = False, scale=None, *, who: str = "attention") -> None:
    """Validate q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) at the boundary.

    Raises ValueError naming the argument, the shape it got and the shape it wanted.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{who}: {name} must have shape (..., n, d), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{who}: {name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{who}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{who}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(f"{who}: q, k, v must have the same number of dims, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"{who}: leading (batch, head) dims must match exactly (no broadcasting): "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{who}: q has d_k={q.shape[-1]} but k has d_k={k.shape[-1]} "
                         f"(q {tuple(q.shape)}, k {tuple(k.shape)}); they must be equal")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{who}: k has n_k={k.shape[-2]} keys but v has {v.shape[-2]} values "
                         f"(k {tuple(k.shape)}, v {tuple(v.shape)}); they must be equal")
    if q.shape[-2] < 1 or k.shape[-2] < 1 or q.shape[-1] < 1:
        raise ValueError(f"{who}: need at least one query, one key and d >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"{who}: causal=True needs as many queries as keys, got n_q={q.shape[-2]} "
                         f"(q {tuple(q.shape)}) and n_k={k.shape[-2]} (k {tuple(k.shape)})")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
                or scale <= 0:
            raise ValueError(f"{who}: scale must be a positive finite number or None, got {scale!r}")


def naive_attention(q, k, v, causal: bool = False, scale=None) -> torch.Tensor:
    """softmax(q kᵀ · scale + M) v, building the whole (n_q, n_k) score grid: the quadratic price.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> out (..., n_q, d_v).
    """
    check_qkv(q, k, v, causal, scale, who="naive_attention")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = (q @ k.transpose(-2, -1)) * scale                     # (..., n_q, n_k): the grid
    if causal:
        n = q.shape[-2]
        allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)                          # (..., n_q, n_k): a second grid
    return weights @ v                                               # (..., n_q, d_v)


def _attn_fwd_inner(acc, l_i, m_i, q_blk, k, v, start_m, lo, hi, block_size, diagonal):
    """Walk the key blocks [lo, hi) for one block of queries, updating the running statistics.

    The same loop as the kernel's `_attn_fwd_inner` (see the comment there for why `alpha`
    rescales what came before). m_i: running max, l_i: running sum, acc: running output.
    """
    rows = start_m + torch.arange(q_blk.shape[-2], device=q_blk.device)          # query positions
    for start_n in range(lo, hi, block_size):
        k_blk = k[:, start_n:start_n + block_size, :]                             # (BH, BLOCK_N, d)
        v_blk = v[:, start_n:start_n + block_size, :]                             # (BH, BLOCK_N, d_v)
        scores = q_blk @ k_blk.transpose(-2, -1)                                  # (BH, BLOCK_M, BLOCK_N)
        if diagonal:  # only the diagonal block needs the causal mask
            cols = start_n + torch.arange(k_blk.shape[-2], device=q_blk.device)
            scores = scores.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
        # new running max; detached: a shift the softmax does not depend on (and it keeps the
        # in-place exp below legal under autograd)
        m_ij = torch.maximum(m_i, scores.detach().amax(dim=-1))
        p = scores.sub_(m_ij[..., None]).exp_()                                   # exp(s - m_new), in place
        alpha = torch.exp(m_i - m_ij)                                             # exp(m_old - m_new)
        l_i = l_i * alpha + p.sum(dim=-1)
        acc = torch.baddbmm(acc * alpha[..., None], p, v_blk)                     # acc·alpha + p @ v
        m_i = m_ij
    return acc, l_i, m_i


def tiled_attention(q, k, v, causal: bool = False, scale=None, block_size: int = 64):
    """Exact attention computed block by block, never building the (n_q, n_k) grid.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v). Returns (out, logsumexp) with
    out: (..., n_q, d_v) in q's dtype and logsumexp: (..., n_q) float32, the log of each row's
    softmax denominator (what the kernel saves for its backward pass). Peak extra memory is a
    few (block_size x block_size) tiles instead of the n_q x n_k grid.
    """
    check_qkv(q, k, v, causal, scale, who="tiled_attention")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"tiled_attention: block_size must be a positive int, got {block_size!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    lead, n_q, n_k, d_v = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # accumulate wide
    q3 = q.reshape(-1, n_q, q.shape[-1])                                          # (BH, n_q, d)
    k3 = k.reshape(-1, n_k, k.shape[-1]).to(work)                                 # (BH, n_k, d)
    v3 = v.reshape(-1, n_k, d_v).to(work)                                         # (BH, n_k, d_v)
    bh = q3.shape[0]
    out = torch.empty(bh, n_q, d_v, dtype=q.dtype, device=q.device)               # (BH, n_q, d_v)
    lse = torch.empty(bh, n_q, dtype=torch.float32, device=q.device)              # (BH, n_q)

    for start_m in range(0, n_q, block_size):            # the kernel's grid: one program per block
        q_blk = q3[:, start_m:start_m + block_size, :].to(work) * scale           # (BH, BLOCK_M, d)
        rows = q_blk.shape[-2]
        m_i = torch.full((bh, rows), float("-inf"), dtype=work, device=q.device)  # running max
        l_i = torch.zeros(bh, rows, dtype=work, device=q.device)                  # running sum
        acc = torch.zeros(bh, rows, d_v, dtype=work, device=q.device)             # running output
        if causal:
            # stage 1: key blocks entirely left of the diagonal, no mask needed
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q_blk, k3, v3, start_m,
                                            0, start_m, block_size, diagonal=False)
            # stage 2: the diagonal block, where the causal mask cuts through
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q_blk, k3, v3, start_m,
                                            start_m, min(start_m + block_size, n_k), block_size,
                                            diagonal=True)
        else:
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q_blk, k3, v3, start_m,
                                            0, n_k, block_size, diagonal=False)
        out[:, start_m:start_m + rows, :] = (acc / l_i[..., None]).to(q.dtype)
        lse[:, start_m:start_m + rows] = (m_i + torch.log(l_i)).float()

    return out.reshape(*lead, n_q, d_v), lse.reshape(*lead, n_q)
