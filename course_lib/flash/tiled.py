"""Attention two ways in plain torch: the naive one that builds the whole score grid, and the
tiled one that walks over blocks of keys with an online softmax and never holds more than a
few (block x block) tiles of scores.

`tiled_attention` mirrors the Triton kernel in `course_lib/flash/kernel.py` loop for loop: the
outer loop over query blocks is the kernel's grid (one program per query block), `_attn_fwd_inner`
below is the kernel's `_attn_fwd_inner`, and `_stages` splits the key blocks as the kernel's STAGE
argument does: the causal case into the blocks left of the diagonal (no mask needed) and the one
diagonal block (masked), one loop over the stages calling the inner loop for each.
"""

from __future__ import annotations

import torch

from course_lib.masks import causal_mask
from course_lib.validate import check_attention, check_count, default_scale

__all__ = ["naive_attention", "tiled_attention"]


def naive_attention(q, k, v, causal: bool = False, scale=None) -> torch.Tensor:
    """softmax(q kᵀ · scale + M) v, building the whole (n_q, n_k) score grid: the quadratic price.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> out (..., n_q, d_v).
    """
    check_attention(q, k, v, scale=scale, causal=causal)
    scale = default_scale(scale, q)
    scores = (q @ k.transpose(-2, -1)) * scale                     # (..., n_q, n_k): the grid
    if causal:
        allowed = causal_mask(q.shape[-2], device=q.device)        # (n, n), chapter 04's mask
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)                        # (..., n_q, n_k): a 2nd grid
    return weights @ v                                             # (..., n_q, d_v)


def _attn_fwd_inner(acc, l_i, m_i, q_blk, k, v, start_m, lo, hi, block_size, diagonal,
                    window=None):
    """Walk the key blocks [lo, hi) for one block of queries, updating the running statistics.

    The same loop as the kernel's `_attn_fwd_inner` (see the comment in its `_attn_fwd_block`
    for why `alpha` rescales what came before). m_i: running max, l_i: running sum, acc: running
    output.
    window (chapter 09): also mask keys j <= i - window, the left edge of a sliding window.
    """
    rows = start_m + torch.arange(q_blk.shape[-2], device=q_blk.device)  # query positions
    for start_n in range(lo, hi, block_size):
        k_blk = k[:, start_n:start_n + block_size, :]                  # (BH, BLOCK_N, d)
        v_blk = v[:, start_n:start_n + block_size, :]                  # (BH, BLOCK_N, d_v)
        scores = q_blk @ k_blk.transpose(-2, -1)                       # (BH, BLOCK_M, BLOCK_N)
        if diagonal or window is not None:  # only blocks a mask cuts through are masked
            cols = start_n + torch.arange(k_blk.shape[-2], device=q_blk.device)
            blocked = cols[None, :] > rows[:, None]                    # (BLOCK_M, BLOCK_N)
            if window is not None:
                blocked = blocked | (cols[None, :] <= rows[:, None] - window)
            scores = scores.masked_fill(blocked, float("-inf"))
        # the new running max; detached: a shift the softmax does not depend on
        m_ij = torch.maximum(m_i, scores.detach().amax(dim=-1))        # (BH, BLOCK_M)
        shift = m_ij
        if window is not None:
            # a row can find every key of this tile masked before it has seen any key: its max
            # is still -inf, and exp(-inf - (-inf)) would be NaN. Shift by 0 there instead, so
            # the tile adds exp(-inf) = 0 and the row's statistics stay as they were.
            shift = torch.where(torch.isinf(m_ij), torch.zeros_like(m_ij), m_ij)
        p = torch.exp(scores - shift[..., None])                       # (BH, BLOCK_M, BLOCK_N)
        alpha = torch.exp(m_i - shift)                                 # exp(m_old - m_new)
        l_i = l_i * alpha + p.sum(dim=-1)
        acc = acc * alpha[..., None] + p @ v_blk                       # rescale, add p @ v
        m_i = m_ij
    return acc, l_i, m_i


def _stages(start_m, rows, n_k, block_size, causal, window):
    """The key blocks one query block visits, stage by stage: (lo, hi, diagonal, window) each.

    The kernel's STAGE argument: 1 = causal, left of the diagonal (no mask); 2 = the diagonal
    block (masked); 3 = not causal, every key block. A window adds a stage 0 in front.
    """
    diagonal = (start_m, min(start_m + block_size, n_k))
    if window is not None:
        # the oldest key any row of this block may see, and the oldest that all rows see
        lo = max(0, start_m - window + 1) // block_size * block_size
        inside = -(-max(0, start_m + rows - window) // block_size) * block_size  # round up
        inside = min(max(inside, lo), start_m)
        return [(lo, inside, False, window),    # 0: blocks the window's left edge cuts through
                (inside, start_m, False, None),  # 1: inside every row's window, no mask needed
                (*diagonal, True, window)]       # 2: the diagonal (the window may cut it too)
    if causal:
        return [(0, start_m, False, None),       # 1: entirely left of the diagonal, no mask
                (*diagonal, True, None)]         # 2: where the causal mask cuts through
    return [(0, n_k, False, None)]               # 3: every key block, no mask

def tiled_attention(q, k, v, causal: bool = False, scale=None, block_size: int = 64,
                    window: int | None = None):
    """Exact attention computed block by block, never building the (n_q, n_k) grid.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v). Returns (out, logsumexp) with
    out: (..., n_q, d_v) in q's dtype and logsumexp: (..., n_q) float32, the log of each row's
    softmax denominator (what the kernel saves for its backward pass). Peak extra memory is a
    few (block_size x block_size) tiles instead of the n_q x n_k grid.

    window=W (chapter 09): a causal sliding window, query i sees keys i - W + 1 .. i (the mask
    `sliding_window_mask`; it implies causal=True). Key blocks entirely outside every window of
    a query block are never computed, so the work per query is about W + block_size keys
    whatever n is.
    """
    if window is not None:
        window = check_count(window, "window")
    *lead, n_q, n_k = check_attention(q, k, v, scale=scale, causal=causal or window is not None)
    block_size = check_count(block_size, "block_size")
    scale = default_scale(scale, q)
    q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))  # shared batch/head dims
    d_v = v.shape[-1]
    # accumulate in float32 at least
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
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
        for lo, hi, diagonal, edge in _stages(start_m, rows, n_k, block_size, causal, window):
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q_blk, k3, v3, start_m, lo, hi,
                                            block_size, diagonal, edge)
        out[:, start_m:start_m + rows, :] = (acc / l_i[..., None]).to(q.dtype)
        lse[:, start_m:start_m + rows] = (m_i + torch.log(l_i)).float()

    return out.reshape(*lead, n_q, d_v), lse.reshape(*lead, n_q)
