"""Chapter 09: linear attention, the cheaper mechanism that behaves only approximately the same.

Softmax attention weighs key j for query i by exp(q_i·k_j / √d). Linear attention replaces that
with a product of feature maps, φ(q_i)·φ(k_j) with φ(x) = elu(x) + 1 (positive, so the weights
stay positive), and normalises the same way:

    out_i = Σ_j φ(q_i)·φ(k_j) v_j  /  Σ_j φ(q_i)·φ(k_j)
          = φ(q_i) S  /  φ(q_i)·z      with S = Σ_j φ(k_j) v_jᵀ  (d, d_v)  and  z = Σ_j φ(k_j)  (d,)

The second line is the whole trick: the sums over keys no longer depend on i, so they are
computed once, at a cost that grows like n·d·d_v instead of n²·d. Under a causal mask the sums
run over j <= i, which makes S and z a running state updated one token at a time: an RNN's
fixed-size summary (chapter 06) again, now of a known size whatever the length.

q: (..., n_q, d)   k: (..., n_k, d)   v: (..., n_k, d_v)   ->   out: (..., n_q, d_v)
"""

from __future__ import annotations

import torch

from course_lib.validate import check_count, check_float_tensor, check_qkv

__all__ = ["feature_map", "linear_attention", "linear_attention_recurrent", "state_bytes"]


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1, that is x + 1 for x > 0 and exp(x) for x <= 0: always > 0.

    Written as the two branches because elu(x) + 1 rounds to exactly 0 in float32 for x < -17
    (elu(x) = exp(x) - 1 is -1 to float32's precision there), and a zero weight row would divide
    0 by 0.
    """
    check_float_tensor(x, "x", "(..., d)", min_ndim=1)
    return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool = False) -> torch.Tensor:
    """out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j), over all j, or j <= i when causal.

    Non-causal: the keys' sums S = φ(K)ᵀ V and z = Σ_j φ(k_j) are formed once, cost ~ n·d·d_v.
    Causal (the parallel form used in training): the (n, n) grid of φ(q_i)·φ(k_j) is built and
    masked like softmax attention's, cost ~ n²·d; `linear_attention_recurrent` gives the same
    outputs from a running state instead.
    """
    check_qkv(q, k, v, causal=causal)
    fq, fk = feature_map(q), feature_map(k)                    # (..., n_q, d), (..., n_k, d)
    if causal:
        n = q.shape[-2]
        weights = fq @ fk.transpose(-2, -1)                    # (..., n, n): φ(q_i)·φ(k_j)
        keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        weights = weights * keep                               # j > i gets weight 0
        return (weights @ v) / weights.sum(-1, keepdim=True)   # (..., n, d_v)
    state = fk.transpose(-2, -1) @ v                           # S: (..., d, d_v)
    z = fk.sum(dim=-2)                                         # z: (..., d)
    return (fq @ state) / (fq @ z[..., None])                  # (..., n_q, d_v)


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               return_state: bool = False):
    """Causal linear attention as a recurrence: one token at a time, a (d, d_v) state.

        S_i = S_{i-1} + φ(k_i) v_iᵀ      z_i = z_{i-1} + φ(k_i)      out_i = φ(q_i) S_i / φ(q_i)·z_i

    Equals `linear_attention(q, k, v, causal=True)`. The state (S, z) has the same size after 10
    tokens as after 10 million; a KV cache grows by one key and one value per token. With
    return_state=True also returns the final (S, z): (..., d, d_v) and (..., d).
    """
    *lead, n, _ = check_qkv(q, k, v, causal=True)
    q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))  # shared batch/head dims
    fq, fk = feature_map(q), feature_map(k)                    # (..., n, d)
    d, d_v = q.shape[-1], v.shape[-1]
    state = q.new_zeros(*lead, d, d_v)                         # S: (..., d, d_v)
    z = q.new_zeros(*lead, d)                                  # z: (..., d)
    outs = []
    for i in range(n):
        state = state + fk[..., i, :, None] * v[..., i, None, :]   # + φ(k_i) v_iᵀ: (..., d, d_v)
        z = z + fk[..., i, :]                                       # (..., d)
        num = (fq[..., i, None, :] @ state)[..., 0, :]              # φ(q_i) S_i: (..., d_v)
        den = (fq[..., i, :] * z).sum(-1, keepdim=True)             # φ(q_i)·z_i: (..., 1)
        outs.append(num / den)
    out = torch.stack(outs, dim=-2)                            # (..., n, d_v)
    return (out, (state, z)) if return_state else out


def state_bytes(d: int, d_v: int, bytes_per_element: int = 4) -> int:
    """Bytes of one head's recurrent state (S and z): (d·d_v + d) numbers, whatever the length."""
    d, d_v = check_count(d, "d"), check_count(d_v, "d_v")
    return (d * d_v + d) * check_count(bytes_per_element, "bytes_per_element")
