"""FlashAttention-2 in Triton: forward and backward kernels and the autograd.Function that
launches them. Follows the structure of Triton's fused-attention tutorial.

Import this module through `course_lib.flash` (which sets TRITON_INTERPRET=1 first when there is
no GPU): Triton decides at decoration time whether a kernel is compiled or interpreted.

Layout: every tensor is viewed as (BH, n, d) with the last dim contiguous; the grid is
(BH, query or key blocks): BH on axis 0, whose limit is 2^31 - 1 (axis 1 stops at 65535). Causal
launches hand out the longest blocks first, so the short ones fill the tail of the launch.
Scores are kept in base 2: with qk_scale = scale·log2(e), exp(scale·s - m) = exp2(qk_scale·s - m'),
and exp2 is the cheaper instruction on a GPU; qk_scale·s - m' is one fused multiply-add per score.
qk_scale is multiplied once, on the host, and handed to every kernel. The saved statistic LSE2 is
the base-2 log-sum-exp of each row's scaled scores.

Two forwards, one kernel: by default each thread loads its share of a tile by address (on Hopper
Triton pipelines those loads with cp.async); `forward(..., tma=True)` builds tensor descriptors
instead and lets the copy engine (TMA) fetch whole tiles (the GPU check times one against the
other). Descriptors made inside a kernel need scratch memory, which `triton.set_allocator` gives.
Launch configurations and the shared-memory estimate that prunes them are in configs.py.

Precision: fp16 and bf16 dots run on tensor cores with fp32 accumulation. float32 inputs run
their dots in TF32 on a GPU (Triton's default: 10 mantissa bits, errors of about 1e-3 of the
values, like torch with allow_tf32=True). Triton's interpreter on a CPU computes them in full fp32.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

from course_lib.flash.configs import SM90_SHARED_BYTES, configs_for, every_config

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634  # log2(e)
LN2 = 0.6931471805599453    # ln(2)


# ------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------

@triton.jit
def _stage_range(start_m, N_KV, BLOCK_M: tl.constexpr, STAGE: tl.constexpr):
    """The key positions [lo, hi) one query block visits in one stage (see _attn_fwd_inner)."""
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
    else:
        lo, hi = 0, N_KV
    return lo, hi


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_vn,
                    start_m, qk_scale, N_KV,
                    offs_m, offs_n, offs_d,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
                    EVEN: tl.constexpr, UPCAST: tl.constexpr):
    """One block of queries against the key blocks of one stage.

    STAGE 1: causal, key blocks left of the diagonal (no mask); STAGE 2: causal, the diagonal
    block (masked); STAGE 3: non-causal, every key block.
    Ragged lengths (not EVEN): the blocks left of the diagonal are whole (they end before this
    query block starts, and n_q == n_kv), so only the diagonal and non-causal stages mask loads;
    on the diagonal the causal mask already hides every key past N_KV from every real query row.
    """
    lo, hi = _stage_range(start_m, N_KV, BLOCK_M, STAGE)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n                                              # key positions
        k_ptrs = K_base + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = V_base + cols[:, None] * stride_vn + offs_d[None, :]
        if EVEN or STAGE == 1:
            k = tl.load(k_ptrs)                                              # (BLOCK_N, D)
            v = tl.load(v_ptrs)
        else:  # ragged tail: keys past N_KV read as 0 and are masked below
            k = tl.load(k_ptrs, mask=cols[:, None] < N_KV, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < N_KV, other=0.0)
        if UPCAST:  # the interpreter's bf16 dot is wrong: do it in fp32 there
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        p, alpha, l_i, m_i = _attn_fwd_block(l_i, m_i, q, k, cols, offs_m, qk_scale, N_KV,
                                             STAGE, EVEN)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_block(l_i, m_i, q, k, cols, offs_m, qk_scale, N_KV,
                    STAGE: tl.constexpr, EVEN: tl.constexpr):
    """One key block of either forward (pointer or TMA loads): its scores, their masks and the
    online-softmax update of l_i and m_i; returns (p, alpha, l_i, m_i), and the caller adds
    p·v to acc rescaled by alpha (each forward writes that line as ptxas allocates it best)."""
    qk = tl.dot(q, tl.trans(k))                              # raw scores s, (BLOCK_M, BLOCK_N)
    if STAGE == 2:
        qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
    if STAGE == 3 and not EVEN:
        qk = tl.where(cols[None, :] < N_KV, qk, float("-inf"))
    # The online-softmax update, in base 2 with t = qk_scale·s. Before this block the row holds
    #     l_i = sum_j 2^(t_j - m_i)   and   acc = sum_j 2^(t_j - m_i) v_j
    # over the keys seen so far. With the new max m_ij = max(m_i, max_j t_j) every old term
    # must be measured against m_ij instead:  2^(t_j - m_ij) = 2^(t_j - m_i) · 2^(m_i - m_ij),
    # so both sums are multiplied by alpha = 2^(m_i - m_ij) <= 1 and the new block's terms,
    # p = 2^(t - m_ij), are added. The scale is positive, so max_j t_j = qk_scale · max_j s_j,
    # and t - m_ij = qk_scale·s - m_ij is one multiply-add per score.
    # Every row sees at least one key in its first block, so m_ij is finite and alpha is too.
    m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_ij


@triton.jit
def _attn_fwd_inner_tma(acc, l_i, m_i, q, K_desc, V_desc, start_m, qk_scale, N_KV, offs_m, offs_n,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
                        EVEN: tl.constexpr, UPCAST: tl.constexpr):
    """_attn_fwd_inner with K and V read through tensor descriptors: the copy engine (TMA) loads
    whole tiles, rows past N_KV as 0, instead of each thread computing addresses. The masks and
    the online-softmax update are _attn_fwd_block's, as in _attn_fwd_inner."""
    lo, hi = _stage_range(start_m, N_KV, BLOCK_M, STAGE)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = K_desc.load([start_n, 0])                                        # (BLOCK_N, D)
        v = V_desc.load([start_n, 0])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        p, alpha, l_i, m_i = _attn_fwd_block(l_i, m_i, q, k, cols, offs_m, qk_scale, N_KV,
                                             STAGE, EVEN)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["TUNE_N_Q", "TUNE_N_KV"])
def _attn_fwd(Q, K, V, Out, LSE2, qk_scale,
              stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
              stride_ob, stride_on, N_Q, N_KV, TUNE_N_Q, TUNE_N_KV,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    # qk_scale = scale · log2(e), multiplied once on the host.
    # TUNE_N_Q, TUNE_N_KV: N_Q and N_KV rounded up to powers of two, only the autotuner's key.
    # TMA: load Q, K, V through tensor descriptors (Hopper's copy engine) instead of pointers.
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot needs 16+")
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal diagonal: BLOCK_M / BLOCK_N key blocks")
    off_bh = tl.program_id(0).to(tl.int64)           # which (batch, head)
    if CAUSAL:  # the last query block sees the most keys: start it first
        start_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        start_m = tl.program_id(1)                   # which block of queries
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")               # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                              # running sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)                    # running output
    if TMA:  # descriptors of this (batch, head)'s rows; rows past the end read as 0
        q = tl.make_tensor_descriptor(Q + off_bh * stride_qb, shape=[N_Q, HEAD_DIM],
                                      strides=[stride_qn, 1], block_shape=[BLOCK_M, HEAD_DIM]
                                      ).load([start_m * BLOCK_M, 0])        # (BLOCK_M, D)
        if UPCAST:
            q = q.to(tl.float32)
        K_desc = tl.make_tensor_descriptor(K + off_bh * stride_kb, shape=[N_KV, HEAD_DIM],
                                           strides=[stride_kn, 1], block_shape=[BLOCK_N, HEAD_DIM])
        V_desc = tl.make_tensor_descriptor(V + off_bh * stride_vb, shape=[N_KV, HEAD_DIM],
                                           strides=[stride_vn, 1], block_shape=[BLOCK_N, HEAD_DIM])
        if CAUSAL:
            acc, l_i, m_i = _attn_fwd_inner_tma(acc, l_i, m_i, q, K_desc, V_desc, start_m,
                                                qk_scale, N_KV, offs_m, offs_n, BLOCK_M, BLOCK_N,
                                                1, EVEN, UPCAST)
            acc, l_i, m_i = _attn_fwd_inner_tma(acc, l_i, m_i, q, K_desc, V_desc, start_m,
                                                qk_scale, N_KV, offs_m, offs_n, BLOCK_M, BLOCK_N,
                                                2, EVEN, UPCAST)
        else:
            acc, l_i, m_i = _attn_fwd_inner_tma(acc, l_i, m_i, q, K_desc, V_desc, start_m,
                                                qk_scale, N_KV, offs_m, offs_n, BLOCK_M, BLOCK_N,
                                                3, EVEN, UPCAST)
    else:
        q_ptrs = Q + off_bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :]
        if EVEN:
            q = tl.load(q_ptrs)                                              # (BLOCK_M, D)
        else:
            q = tl.load(q_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        K_base = K + off_bh * stride_kb
        V_base = V + off_bh * stride_vb
        if CAUSAL:
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn,
                                            stride_vn, start_m, qk_scale, N_KV, offs_m, offs_n,
                                            offs_d, BLOCK_M, BLOCK_N, 1, EVEN, UPCAST)
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn,
                                            stride_vn, start_m, qk_scale, N_KV, offs_m, offs_n,
                                            offs_d, BLOCK_M, BLOCK_N, 2, EVEN, UPCAST)
        else:
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn,
                                            stride_vn, start_m, qk_scale, N_KV, offs_m, offs_n,
                                            offs_d, BLOCK_M, BLOCK_N, 3, EVEN, UPCAST)
    acc = acc / l_i[:, None]
    lse2 = m_i + tl.math.log2(l_i)                   # base-2 log-sum-exp, saved for backward
    o_ptrs = Out + off_bh * stride_ob + offs_m[:, None] * stride_on + offs_d[None, :]
    if EVEN:
        tl.store(LSE2 + off_bh * N_Q + offs_m, lse2)
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty))
    else:
        tl.store(LSE2 + off_bh * N_Q + offs_m, lse2, mask=offs_m < N_Q)
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < N_Q)


# ------------------------------------------------------------------------------------------------
# backward: Delta = rowsum(dO ∘ O); then dK, dV per key block; then dQ per query block.
# With P = softmax(S), S = scale·QKᵀ:  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP - Delta),
# dQ = scale · dS K,  dK = scale · dSᵀ Q.  P is recomputed from Q, K and the saved LSE2.
# ------------------------------------------------------------------------------------------------

@triton.jit
def _attn_bwd_preprocess(O, DO, Delta, stride_ob, stride_on, stride_dob, stride_don, N_Q,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    off_bh = tl.program_id(0).to(tl.int64)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < N_Q
    o = tl.load(O + off_bh * stride_ob + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=rows, other=0.0).to(tl.float32)
    do = tl.load(DO + off_bh * stride_dob + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=rows, other=0.0).to(tl.float32)
    tl.store(Delta + off_bh * N_Q + offs_m, tl.sum(o * do, axis=1), mask=offs_m < N_Q)


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE2_base, Delta_base,
                         stride_qn, stride_don, qk_scale, N_Q, N_KV, offs_n, offs_d, lo, hi,
                         BLOCK_M: tl.constexpr, MASK: tl.constexpr, EVEN: tl.constexpr,
                         BOUNDS: tl.constexpr, UPCAST: tl.constexpr):
    """One block of keys against the query blocks [lo, hi); works with transposed tiles.

    Query rows past N_Q load as zeros (q, dO, LSE2, Delta), which makes their P·dO and dS terms
    zero; BOUNDS also masks Pᵀ past N_Q and N_KV (non-causal). Causal launches skip that mask:
    a real query never sees a key past N_KV = N_Q, and fewer selects keep registers free.
    """
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = Q_base + offs_m[:, None] * stride_qn + offs_d[None, :]
        do_ptrs = DO_base + offs_m[:, None] * stride_don + offs_d[None, :]
        if EVEN:
            q = tl.load(q_ptrs)                                              # (BLOCK_M, D)
            do = tl.load(do_ptrs)
            lse2 = tl.load(LSE2_base + offs_m)
            delta = tl.load(Delta_base + offs_m)
        else:
            q = tl.load(q_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
            do = tl.load(do_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
            lse2 = tl.load(LSE2_base + offs_m, mask=offs_m < N_Q, other=0.0)
            delta = tl.load(Delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        qkT = tl.dot(k, tl.trans(q))                                         # (BLOCK_N, BLOCK_M)
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])                    # recomputed Pᵀ
        if MASK:  # the diagonal: query m may only see key n <= m
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        if BOUNDS and not EVEN:
            pT = tl.where((offs_m[None, :] < N_Q) & (offs_n[:, None] < N_KV), pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do)                                    # dV += Pᵀ dO
        dpT = tl.dot(v, tl.trans(do))                                        # (dO Vᵀ)ᵀ
        dsT = pT * (dpT - delta[None, :])                                    # dSᵀ
        dk += tl.dot(dsT.to(q.dtype), q)                                     # dK += dSᵀ Q
    return dk, dv


@triton.jit(do_not_specialize=["TUNE_N_Q", "TUNE_N_KV"])
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, LSE2, Delta, sm_scale, qk_scale,
                   stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                   stride_dob, stride_don, N_Q, N_KV, TUNE_N_Q, TUNE_N_KV,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr):
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot needs 16+")
    tl.static_assert(BLOCK_N % BLOCK_M == 0, "the causal diagonal: BLOCK_N / BLOCK_M query blocks")
    # causal: the first key block is seen by every query, the most work; blocks go out in order
    off_bh = tl.program_id(0).to(tl.int64)
    start_n = tl.program_id(1) * BLOCK_N             # this program's block of keys
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_ptrs = K + off_bh * stride_kb + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + off_bh * stride_vb + offs_n[:, None] * stride_vn + offs_d[None, :]
    if EVEN:
        k = tl.load(k_ptrs)                                                  # (BLOCK_N, D)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=offs_n[:, None] < N_KV, other=0.0)
        v = tl.load(v_ptrs, mask=offs_n[:, None] < N_KV, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    Q_base = Q + off_bh * stride_qb
    DO_base = DO + off_bh * stride_dob
    LSE2_base = LSE2 + off_bh * N_Q
    Delta_base = Delta + off_bh * N_Q
    if CAUSAL:
        # the diagonal: query blocks overlapping this key block, masked
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE2_base, Delta_base,
                                      stride_qn, stride_don, qk_scale, N_Q, N_KV, offs_n, offs_d,
                                      start_n, start_n + BLOCK_N, BLOCK_M, True, EVEN, False,
                                      UPCAST)
        # below the diagonal: every later query sees all of these keys
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE2_base, Delta_base,
                                      stride_qn, stride_don, qk_scale, N_Q, N_KV, offs_n, offs_d,
                                      start_n + BLOCK_N, N_Q, BLOCK_M, False, EVEN, False, UPCAST)
    else:
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE2_base, Delta_base,
                                      stride_qn, stride_don, qk_scale, N_Q, N_KV, offs_n, offs_d,
                                      0, N_Q, BLOCK_M, False, EVEN, True, UPCAST)
    dk = dk * sm_scale
    # DK and DV are contiguous (BH, N_KV, D) buffers made by the wrapper: K's strides fit them
    dk_ptrs = DK + off_bh * stride_kb + offs_n[:, None] * stride_kn + offs_d[None, :]
    dv_ptrs = DV + off_bh * stride_vb + offs_n[:, None] * stride_vn + offs_d[None, :]
    if EVEN:
        tl.store(dk_ptrs, dk.to(DK.dtype.element_ty))
        tl.store(dv_ptrs, dv.to(DV.dtype.element_ty))
    else:
        tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=offs_n[:, None] < N_KV)
        tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < N_KV)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_vn,
                       qk_scale, N_Q, N_KV, offs_m, offs_d, lo, hi,
                       BLOCK_N: tl.constexpr, MASK: tl.constexpr, EVEN: tl.constexpr,
                       BOUNDS: tl.constexpr, UPCAST: tl.constexpr):
    """One block of queries against the key blocks [lo, hi).

    EVEN: every block whole (plain loads). BOUNDS: mask P past N_Q and N_KV (non-causal); causal
    launches need no such mask (see `_attn_bwd_dkdv_inner`): the key blocks left of the diagonal
    are whole, and on it the causal mask hides keys past N_KV from every real query row.
    """
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = K_base + offs_n[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = V_base + offs_n[:, None] * stride_vn + offs_d[None, :]
        if EVEN:
            k = tl.load(k_ptrs)                                              # (BLOCK_N, D)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < N_KV, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < N_KV, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k))                                          # (BLOCK_M, BLOCK_N)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])                      # recomputed P
        if MASK:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        if BOUNDS and not EVEN:
            p = tl.where((offs_m[:, None] < N_Q) & (offs_n[None, :] < N_KV), p, 0.0)
        dp = tl.dot(do, tl.trans(v))                                         # dP = dO Vᵀ
        ds = p * (dp - delta[:, None])                                       # dS
        dq += tl.dot(ds.to(k.dtype), k)                                      # dQ += dS K
    return dq


@triton.jit(do_not_specialize=["TUNE_N_Q", "TUNE_N_KV"])
def _attn_bwd_dq(Q, K, V, DO, DQ, LSE2, Delta, sm_scale, qk_scale,
                 stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                 stride_dob, stride_don, N_Q, N_KV, TUNE_N_Q, TUNE_N_KV,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr):
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot needs 16+")
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal diagonal: BLOCK_M / BLOCK_N key blocks")
    off_bh = tl.program_id(0).to(tl.int64)
    if CAUSAL:  # the last query block sees the most keys: start it first
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
    else:
        start_m = tl.program_id(1) * BLOCK_M         # this program's block of queries
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + off_bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :]
    do_ptrs = DO + off_bh * stride_dob + offs_m[:, None] * stride_don + offs_d[None, :]
    if EVEN:
        q = tl.load(q_ptrs)
        do = tl.load(do_ptrs)
        lse2 = tl.load(LSE2 + off_bh * N_Q + offs_m)
        delta = tl.load(Delta + off_bh * N_Q + offs_m)
    else:
        q = tl.load(q_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
        do = tl.load(do_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
        lse2 = tl.load(LSE2 + off_bh * N_Q + offs_m, mask=offs_m < N_Q, other=0.0)
        delta = tl.load(Delta + off_bh * N_Q + offs_m, mask=offs_m < N_Q, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    K_base = K + off_bh * stride_kb
    V_base = V + off_bh * stride_vb
    if CAUSAL:
        # the diagonal key blocks, masked; then every key block left of them, unmasked
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_vn,
                                qk_scale, N_Q, N_KV, offs_m, offs_d, start_m, start_m + BLOCK_M,
                                BLOCK_N, True, EVEN, False, UPCAST)
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_vn,
                                qk_scale, N_Q, N_KV, offs_m, offs_d, 0, start_m,
                                BLOCK_N, False, True, False, UPCAST)  # whole blocks
    else:
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_vn,
                                qk_scale, N_Q, N_KV, offs_m, offs_d, 0, N_KV,
                                BLOCK_N, False, EVEN, True, UPCAST)
    dq = dq * sm_scale
    dq_ptrs = DQ + off_bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :]
    if EVEN:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty))
    else:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=offs_m[:, None] < N_Q)


# ------------------------------------------------------------------------------------------------
# launch configurations: the tables and the shared-memory estimate are in configs.py; here the
# autotuner that uses them (one fixed config in the interpreter: autotuning needs a GPU driver)
# ------------------------------------------------------------------------------------------------

@functools.cache
def _shared_limit(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", SM90_SHARED_BYTES))


def _pruner(kernel: str):
    def early_config_prune(configs, named_args, **kwargs):
        q = named_args["Q"]
        limit = _shared_limit(q.device.index or 0) if q.is_cuda else SM90_SHARED_BYTES
        keep = configs_for(kernel, kwargs["HEAD_DIM"], q.element_size(), limit,
                           tma=bool(kwargs.get("TMA", False)))
        return _configs(keep)
    return early_config_prune


def _configs(entries):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in entries]


def _even(args):
    blocks = (args["BLOCK_M"], args["BLOCK_N"])
    return all(n % b == 0 for n in (args["N_Q"], args["N_KV"]) for b in blocks)


def _tune(fn, kernel, interpreted_config):
    """autotune(heuristics(fn)): the autotuner keys on the lengths rounded up to powers of two,
    so a new length re-tunes only when it crosses a power of two."""
    fn = triton.heuristics({"EVEN": _even})(fn)
    if INTERPRET:
        return triton.autotune([triton.Config(interpreted_config)], key=[])(fn)
    key = ["TUNE_N_Q", "TUNE_N_KV", "HEAD_DIM", "CAUSAL"] + (["TMA"] if kernel == "fwd" else [])
    return triton.autotune(_configs(every_config(kernel)), key=key,
                           prune_configs_by={"early_config_prune": _pruner(kernel)})(fn)


# in the interpreter, unequal blocks on purpose: it then checks the diagonal split as a GPU uses it
_fwd = _tune(_attn_fwd, "fwd", {"BLOCK_M": 64, "BLOCK_N": 32})
_bwd_dkdv = _tune(_attn_bwd_dkdv, "dkdv", {"BLOCK_M": 32, "BLOCK_N": 64})
_bwd_dq = _tune(_attn_bwd_dq, "dq", {"BLOCK_M": 64, "BLOCK_N": 32})
_PRE_BLOCK = 64
KERNELS = {"fwd": _attn_fwd, "dkdv": _attn_bwd_dkdv, "dq": _attn_bwd_dq}  # the jitted functions


# ------------------------------------------------------------------------------------------------
# the Python side
# ------------------------------------------------------------------------------------------------

def _upcast(dtype: torch.dtype) -> bool:
    return INTERPRET and dtype == torch.bfloat16


def _pow2(n: int) -> int:
    return triton.next_power_of_2(n)


def _check(q3, k3, v3, causal: bool, sm_scale: float, *more) -> None:
    """The kernels' own assumptions, for callers that skip `flash_attention`'s checks."""
    if q3.ndim != 3 or k3.shape != v3.shape or k3.ndim != 3 or q3.shape[::2] != k3.shape[::2]:
        raise ValueError(f"kernel: q3 must be (BH, n_q, d) and k3, v3 (BH, n_kv, d), got "
                         f"q3 {tuple(q3.shape)}, k3 {tuple(k3.shape)}, v3 {tuple(v3.shape)}")
    if causal and q3.shape[1] != k3.shape[1]:
        # the causal kernels walk key blocks up to each query block's diagonal: with fewer keys
        # than queries they would read past the end of K and V
        raise ValueError(f"kernel: causal=True needs n_q == n_kv, got q3 {tuple(q3.shape)} and "
                         f"k3 {tuple(k3.shape)}")
    if not sm_scale > 0:  # the forward folds the scale into the running max: needs scale > 0
        raise ValueError(f"kernel: sm_scale must be positive, got {sm_scale!r}")
    for name, t in (("q3", q3), ("k3", k3), ("v3", v3), *more):
        if t.stride(-1) != 1:  # the kernels step along d with no stride: offs_d, not offs_d * s
            raise ValueError(f"kernel: {name} must have stride 1 along its last dim, got strides "
                             f"{t.stride()} (shape {tuple(t.shape)}): pass t.contiguous()")
        if t.device != q3.device:
            raise ValueError(f"kernel: {name} is on {t.device} but q3 on {q3.device}: one device")


def on_device(t: torch.Tensor):
    """Launch on `t`'s GPU, not the current one (Triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _scratch(size: int, alignment: int, stream):
    """Global memory Triton asks for at launch (the TMA forward builds its descriptors there)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _check_tma(*tensors) -> None:
    """A tensor descriptor wants a 16-byte aligned base and row stride."""
    for t in tensors:
        step = t.element_size()
        if t.data_ptr() % 16 or any(s * step % 16 for s in t.stride()[:-1]):
            raise ValueError(f"kernel: tma=True needs 16-byte aligned rows, got strides "
                             f"{t.stride()} of {t.dtype}: pass contiguous tensors")


def _launch(tuned, grid, args, kwargs, config):
    """Launch through the autotuner, or with one (BLOCK_M, BLOCK_N, warps, stages) `config`
    (the GPU check runs every table entry this way, not only the autotuner's pick)."""
    if config is None:
        tuned[grid](*args, **kwargs)
    else:
        block_m, block_n, warps, stages = config
        tuned.fn[grid](*args, **kwargs, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
                       num_stages=stages)


def forward(q3, k3, v3, causal: bool, sm_scale: float, config=None, tma: bool = False):
    """q3: (BH, n_q, d), k3, v3: (BH, n_kv, d), last dim contiguous. Returns (out, lse2 (BH, n_q)
    fp32). config: None to autotune, or one (BLOCK_M, BLOCK_N, num_warps, num_stages).
    tma=True: the forward that loads through tensor descriptors (Hopper's TMA), for comparison."""
    _check(q3, k3, v3, causal, sm_scale)
    bh, n_q, d = q3.shape
    n_kv = k3.shape[1]
    out = torch.empty_like(q3)
    lse2 = torch.empty(bh, n_q, device=q3.device, dtype=torch.float32)
    if tma:
        _check_tma(q3, k3, v3)
        if q3.is_cuda:
            triton.set_allocator(_scratch)
    grid = lambda meta: (bh, triton.cdiv(n_q, meta["BLOCK_M"]))  # noqa: E731
    with on_device(q3):
        _launch(_fwd, grid, (q3, k3, v3, out, lse2, sm_scale * LOG2E,
                             q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                             v3.stride(0), v3.stride(1), out.stride(0), out.stride(1),
                             n_q, n_kv, _pow2(n_q), _pow2(n_kv)),
                dict(HEAD_DIM=d, CAUSAL=causal, UPCAST=_upcast(q3.dtype), TMA=bool(tma)), config)
    return out, lse2


def backward(do3, q3, k3, v3, out, lse2, causal: bool, sm_scale: float, configs=(None, None)):
    """The three backward launches; returns (dq, dk, dv) shaped like q3, k3, v3.
    configs: (dK/dV config, dQ config), each None to autotune (see `forward`)."""
    # dQ, dK, dV are written with q3's, k3's and v3's strides, LSE2 and Delta read as (BH, n_q):
    # make those the dense ones (no copy when they already are). Autograd may hand over an
    # expanded dout (stride 0, from out.sum()), so this comes before the stride check.
    q3, k3, v3, do3, lse2 = (t.contiguous() for t in (q3, k3, v3, do3, lse2))
    _check(q3, k3, v3, causal, sm_scale, ("do3", do3), ("out", out))
    bh, n_q, d = q3.shape
    n_kv = k3.shape[1]
    delta = torch.empty_like(lse2)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    common = (sm_scale, sm_scale * LOG2E, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
              v3.stride(0), v3.stride(1), do3.stride(0), do3.stride(1), n_q, n_kv,
              _pow2(n_q), _pow2(n_kv))
    meta = dict(HEAD_DIM=d, CAUSAL=causal, UPCAST=_upcast(q3.dtype))
    with on_device(q3):
        _attn_bwd_preprocess[(bh, triton.cdiv(n_q, _PRE_BLOCK))](
            out, do3, delta, out.stride(0), out.stride(1), do3.stride(0), do3.stride(1), n_q,
            HEAD_DIM=d, BLOCK_M=_PRE_BLOCK)
        _launch(_bwd_dkdv, lambda m: (bh, triton.cdiv(n_kv, m["BLOCK_N"])),
                (q3, k3, v3, do3, dk, dv, lse2, delta, *common), meta, configs[0])
        _launch(_bwd_dq, lambda m: (bh, triton.cdiv(n_q, m["BLOCK_M"])),
                (q3, k3, v3, do3, dq, lse2, delta, *common), meta, configs[1])
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """out = softmax(q kᵀ · scale + M) v with the Triton kernels; saves (q, k, v, out, lse2)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        lead, n_q, n_kv, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
        q3 = q.reshape(-1, n_q, d).contiguous()                          # (BH, n_q, d)
        k3 = k.reshape(-1, n_kv, d).contiguous()                         # (BH, n_kv, d)
        v3 = v.reshape(-1, n_kv, d).contiguous()                         # (BH, n_kv, d)
        out, lse2 = forward(q3, k3, v3, causal, sm_scale)
        ctx.save_for_backward(q3, k3, v3, out, lse2)
        ctx.causal, ctx.sm_scale, ctx.lead = causal, sm_scale, lead
        return out.reshape(*lead, n_q, d)

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, out, lse2 = ctx.saved_tensors
        do3 = dout.reshape(out.shape)
        dq, dk, dv = backward(do3, q3, k3, v3, out, lse2, ctx.causal, ctx.sm_scale)
        lead = ctx.lead
        return (dq.reshape(*lead, *dq.shape[1:]), dk.reshape(*lead, *dk.shape[1:]),
                dv.reshape(*lead, *dv.shape[1:]), None, None)


def logsumexp_from_lse2(lse2: torch.Tensor) -> torch.Tensor:
    """The kernel keeps base-2 statistics; ln(sum exp) = ln(2) · log2(sum 2^...)."""
    return lse2 * LN2
