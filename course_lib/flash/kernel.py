"""FlashAttention-2 in Triton: forward and backward kernels and the autograd.Function that
launches them. Follows the structure of Triton's fused-attention tutorial.

Import this module through `course_lib.flash` (which sets TRITON_INTERPRET=1 first when there is
no GPU): Triton decides at decoration time whether a kernel is compiled or interpreted.

Layout: every tensor is viewed as (BH, n, d) with the last dim contiguous; the grid is
(query or key blocks, BH). Scores are kept in base 2: with qk_scale = scale·log2(e),
exp(scale·s - m) = exp2(qk_scale·s - m'), and exp2 is the cheaper instruction on a GPU. The saved
statistic LSE2 is the base-2 log-sum-exp of each row's scaled scores.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634  # log2(e)
LN2 = 0.6931471805599453    # ln(2)


# ------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------

@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_vn,
                    start_m, qk_scale, N_KV,
                    offs_m, offs_n, offs_d,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
                    EVEN: tl.constexpr, UPCAST: tl.constexpr):
    """One block of queries against the key blocks of one stage.

    STAGE 1: causal, key blocks left of the diagonal (no mask); STAGE 2: causal, the diagonal
    block (masked); STAGE 3: non-causal, every key block.
    """
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
    else:
        lo, hi = 0, N_KV
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n                                              # key positions
        k_ptrs = K_base + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = V_base + cols[:, None] * stride_vn + offs_d[None, :]
        if EVEN:
            k = tl.load(k_ptrs)                                              # (BLOCK_N, D)
            v = tl.load(v_ptrs)
        else:  # ragged tail: keys past N_KV read as 0 and are masked below
            k = tl.load(k_ptrs, mask=cols[:, None] < N_KV, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < N_KV, other=0.0)
        if UPCAST:  # the interpreter's bf16 dot is wrong: do it in fp32 there
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k)) * qk_scale                               # (BLOCK_M, BLOCK_N)
        if STAGE == 2:
            qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        if not EVEN:
            qk = tl.where(cols[None, :] < N_KV, qk, float("-inf"))
        # The online-softmax update. Before this block the row holds
        #     l_i = sum_j exp(s_j - m_i)   and   acc = sum_j exp(s_j - m_i) v_j
        # over the keys seen so far. With the new max m_ij = max(m_i, max_j s_j) every old term
        # must be measured against m_ij instead:  exp(s_j - m_ij) = exp(s_j - m_i) * exp(m_i - m_ij),
        # so both sums are multiplied by alpha = exp(m_i - m_ij) <= 1 and the new block's terms,
        # p = exp(s - m_ij), are added. (Base 2 here: exp2 with log2(e) folded into qk_scale.)
        # Every row sees at least one key in its first block, so m_ij is finite and alpha is too.
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, Out, LSE2, sm_scale,
              stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_on,
              N_Q, N_KV,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr):
    start_m = tl.program_id(0)                       # which block of queries
    off_bh = tl.program_id(1).to(tl.int64)           # which (batch, head)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + off_bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :]
    if EVEN:
        q = tl.load(q_ptrs)                                                  # (BLOCK_M, D)
    else:
        q = tl.load(q_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")               # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                              # running sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)                    # running output
    qk_scale = sm_scale * 1.4426950408889634                                 # scale · log2(e)
    K_base = K + off_bh * stride_kb
    V_base = V + off_bh * stride_vb
    if CAUSAL:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_vn,
                                        start_m, qk_scale, N_KV, offs_m, offs_n, offs_d,
                                        BLOCK_M, BLOCK_N, 1, EVEN, UPCAST)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_vn,
                                        start_m, qk_scale, N_KV, offs_m, offs_n, offs_d,
                                        BLOCK_M, BLOCK_N, 2, EVEN, UPCAST)
    else:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_base, V_base, stride_kn, stride_vn,
                                        start_m, qk_scale, N_KV, offs_m, offs_n, offs_d,
                                        BLOCK_M, BLOCK_N, 3, EVEN, UPCAST)
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
    off_bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
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
                         UPCAST: tl.constexpr):
    """One block of keys against the query blocks [lo, hi); works with transposed tiles."""
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
        if not EVEN:
            pT = tl.where((offs_m[None, :] < N_Q) & (offs_n[:, None] < N_KV), pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do)                                    # dV += Pᵀ dO
        dpT = tl.dot(v, tl.trans(do))                                        # (dO Vᵀ)ᵀ
        dsT = pT * (dpT - delta[None, :])                                    # dSᵀ
        dk += tl.dot(dsT.to(q.dtype), q)                                     # dK += dSᵀ Q
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, LSE2, Delta, sm_scale,
                   stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                   stride_dob, stride_don, N_Q, N_KV,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N             # this program's block of keys
    off_bh = tl.program_id(1).to(tl.int64)
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
    qk_scale = sm_scale * 1.4426950408889634
    Q_base = Q + off_bh * stride_qb
    DO_base = DO + off_bh * stride_dob
    LSE2_base = LSE2 + off_bh * N_Q
    Delta_base = Delta + off_bh * N_Q
    if CAUSAL:
        # the diagonal: query blocks overlapping this key block, masked
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE2_base, Delta_base,
                                      stride_qn, stride_don, qk_scale, N_Q, N_KV, offs_n, offs_d,
                                      start_n, start_n + BLOCK_N, BLOCK_M, True, EVEN, UPCAST)
        # below the diagonal: every later query sees all of these keys
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE2_base, Delta_base,
                                      stride_qn, stride_don, qk_scale, N_Q, N_KV, offs_n, offs_d,
                                      start_n + BLOCK_N, N_Q, BLOCK_M, False, EVEN, UPCAST)
    else:
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, Q_base, DO_base, LSE2_base, Delta_base,
                                      stride_qn, stride_don, qk_scale, N_Q, N_KV, offs_n, offs_d,
                                      0, N_Q, BLOCK_M, False, EVEN, UPCAST)
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
                       UPCAST: tl.constexpr):
    """One block of queries against the key blocks [lo, hi)."""
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
        if not EVEN:
            p = tl.where((offs_m[:, None] < N_Q) & (offs_n[None, :] < N_KV), p, 0.0)
        dp = tl.dot(do, tl.trans(v))                                         # dP = dO Vᵀ
        ds = p * (dp - delta[:, None])                                       # dS
        dq += tl.dot(ds.to(k.dtype), k)                                      # dQ += dS K
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, DQ, LSE2, Delta, sm_scale,
                 stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                 stride_dob, stride_don, N_Q, N_KV,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M             # this program's block of queries
    off_bh = tl.program_id(1).to(tl.int64)
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
    qk_scale = sm_scale * 1.4426950408889634
    K_base = K + off_bh * stride_kb
    V_base = V + off_bh * stride_vb
    if CAUSAL:
        # the diagonal key blocks, masked; then every key block left of them, unmasked
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_vn,
                                qk_scale, N_Q, N_KV, offs_m, offs_d, start_m, start_m + BLOCK_M,
                                BLOCK_N, True, EVEN, UPCAST)
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_vn,
                                qk_scale, N_Q, N_KV, offs_m, offs_d, 0, start_m,
                                BLOCK_N, False, EVEN, UPCAST)
    else:
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, K_base, V_base, stride_kn, stride_vn,
                                qk_scale, N_Q, N_KV, offs_m, offs_d, 0, N_KV,
                                BLOCK_N, False, EVEN, UPCAST)
    dq = dq * sm_scale
    dq_ptrs = DQ + off_bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :]
    if EVEN:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty))
    else:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=offs_m[:, None] < N_Q)


# ------------------------------------------------------------------------------------------------
# launch configurations: one fixed config in the interpreter (autotuning needs a GPU driver),
# a small autotuned list when compiled on CUDA. BLOCK_M must be a multiple of BLOCK_N (forward,
# dQ) and BLOCK_N a multiple of BLOCK_M (dK/dV) so the diagonal splits into whole blocks.
# ------------------------------------------------------------------------------------------------

def _even(args):
    blocks = (args["BLOCK_M"], args["BLOCK_N"])
    return all(n % b == 0 for n in (args["N_Q"], args["N_KV"]) for b in blocks)


if INTERPRET:
    # unequal blocks on purpose: the interpreter then checks the diagonal split as the GPU uses it
    _FWD_CONFIGS = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32})]
    _DKDV_CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64})]
    _DQ_CONFIGS = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32})]
else:
    _FWD_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                    for bm, bn, w, s in [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4)]]
    _DKDV_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                     for bm, bn, w, s in [(32, 128, 4, 3), (64, 128, 8, 3)]]
    _DQ_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                   for bm, bn, w, s in [(128, 32, 4, 3), (128, 64, 8, 3)]]
    if os.environ.get("COURSE_FLASH_AUTOTUNE", "1") == "0":  # tests: one config, fewer compiles
        _FWD_CONFIGS, _DKDV_CONFIGS, _DQ_CONFIGS = _FWD_CONFIGS[:1], _DKDV_CONFIGS[:1], _DQ_CONFIGS[:1]

_KEY = ["N_Q", "N_KV", "HEAD_DIM", "CAUSAL"]
_fwd = triton.autotune(_FWD_CONFIGS, key=_KEY)(triton.heuristics({"EVEN": _even})(_attn_fwd))
_bwd_dkdv = triton.autotune(_DKDV_CONFIGS, key=_KEY)(triton.heuristics({"EVEN": _even})(_attn_bwd_dkdv))
_bwd_dq = triton.autotune(_DQ_CONFIGS, key=_KEY)(triton.heuristics({"EVEN": _even})(_attn_bwd_dq))
_PRE_BLOCK = 64


# ------------------------------------------------------------------------------------------------
# the Python side
# ------------------------------------------------------------------------------------------------

def _upcast(dtype: torch.dtype) -> bool:
    return INTERPRET and dtype == torch.bfloat16


def forward(q3, k3, v3, causal: bool, sm_scale: float):
    """q3: (BH, n_q, d), k3, v3: (BH, n_kv, d), contiguous. Returns (out, lse2 (BH, n_q) fp32)."""
    bh, n_q, d = q3.shape
    n_kv = k3.shape[1]
    out = torch.empty_like(q3)
    lse2 = torch.empty(bh, n_q, device=q3.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), bh)  # noqa: E731
    _fwd[grid](q3, k3, v3, out, lse2, sm_scale,
               q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
               out.stride(0), out.stride(1), n_q, n_kv,
               HEAD_DIM=d, CAUSAL=causal, UPCAST=_upcast(q3.dtype))
    return out, lse2


def backward(do3, q3, k3, v3, out, lse2, causal: bool, sm_scale: float):
    """The three backward launches; returns (dq, dk, dv) shaped like q3, k3, v3."""
    bh, n_q, d = q3.shape
    n_kv = k3.shape[1]
    do3 = do3.contiguous()
    delta = torch.empty_like(lse2)
    _attn_bwd_preprocess[(triton.cdiv(n_q, _PRE_BLOCK), bh)](
        out, do3, delta, out.stride(0), out.stride(1), do3.stride(0), do3.stride(1), n_q,
        HEAD_DIM=d, BLOCK_M=_PRE_BLOCK)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    common = (sm_scale, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
              v3.stride(0), v3.stride(1), do3.stride(0), do3.stride(1), n_q, n_kv)
    _bwd_dkdv[lambda meta: (triton.cdiv(n_kv, meta["BLOCK_N"]), bh)](
        q3, k3, v3, do3, dk, dv, lse2, delta, *common,
        HEAD_DIM=d, CAUSAL=causal, UPCAST=_upcast(q3.dtype))
    _bwd_dq[lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), bh)](
        q3, k3, v3, do3, dq, lse2, delta, *common,
        HEAD_DIM=d, CAUSAL=causal, UPCAST=_upcast(q3.dtype))
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
