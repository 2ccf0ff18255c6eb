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

__all__ = ["feature_map", "linear_attention", "linear_attention_recurrent", "state_bytes"]


def _check_float(x, name: str, min_ndim: int = 1) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (..., n, d), "
                         f"got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype} with shape "
                         f"{tuple(x.shape)}; convert it with {name}.float()")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, wanted at least {min_ndim} dims "
                         f"(..., n, d)")


def _check_qkv(q, k, v, causal: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(t, name, min_ndim=2)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype: q is {q.dtype}, k is {k.dtype}, "
                         f"v is {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has d={q.shape[-1]} but k has d={k.shape[-1]} "
                         f"(q {tuple(q.shape)}, k {tuple(k.shape)}; both want (..., n, d))")
    if k.shape[-2] != v.shape[-2] or k.shape[-2] < 1:
        raise ValueError(f"k has n_k={k.shape[-2]} keys but v has {v.shape[-2]} values "
                         f"(k {tuple(k.shape)}, v {tuple(v.shape)}; want one value per key, >= 1)")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"the leading (batch, head) dims must match: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs as many queries as keys, got "
                         f"q {tuple(q.shape)} and k {tuple(k.shape)}")


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1, that is x + 1 for x > 0 and exp(x) for x <= 0: always > 0.

    Written as the two branches because elu(x) + 1 rounds to exactly 0 in float32 for x < -17
    (elu(x) = exp(x) - 1 is -1 to float32's precision there), and a zero weight row would divide
    0 by 0.
    """
    _check_float(x, "x")
    return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool = False) -> torch.Tensor:
    """out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j), over all j, or j <= i when causal.

    Non-causal: the keys' sums S = φ(K)ᵀ V and z = Σ_j φ(k_j) are formed once, cost ~ n·d·d_v.
    Causal (the parallel form used in training): the (n, n) grid of φ(q_i)·φ(k_j) is built and
    masked like softmax attention's, cost ~ n²·d; `linear_attention_recurrent` gives the same
    outputs from a running state instead.
    """
    _check_qkv(q, k, v, causal)
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
    _check_qkv(q, k, v, causal=True)
    fq, fk = feature_map(q), feature_map(k)                    # (..., n, d)
    lead, n, d, d_v = q.shape[:-2], q.shape[-2], q.shape[-1], v.shape[-1]
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
    for name, value in (("d", d), ("d_v", d_v), ("bytes_per_element", bytes_per_element)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return (d * d_v + d) * bytes_per_element
