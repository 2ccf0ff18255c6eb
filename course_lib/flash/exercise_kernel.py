"""The kernel behind exercise 3 of chapter 08: attention for one block of queries, calling a
learner's `attn_inner_step(acc, l_i, m_i, qk, v) -> (acc, l_i, m_i)` for every block of keys.

Import it after `course_lib.flash.prepare_triton(interpret=True)`: the check runs it through
Triton's interpreter, on CPU tensors, so the same check works with or without a GPU.
"""

import triton
import triton.language as tl


@triton.jit
def one_block_attention(Q, K, V, Out, N_KV, sm_scale, STEP: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])                   # (BLOCK_M, D)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")              # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                             # running sum
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)                          # running output
    for start_n in range(0, N_KV, BLOCK_N):
        k = tl.load(K + (start_n + offs_n)[:, None] * D + offs_d[None, :])  # (BLOCK_N, D)
        v = tl.load(V + (start_n + offs_n)[:, None] * D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k)) * sm_scale                              # (BLOCK_M, BLOCK_N)
        acc, l_i, m_i = STEP(acc, l_i, m_i, qk, v)
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], acc / l_i[:, None])
