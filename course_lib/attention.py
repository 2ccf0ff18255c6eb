"""Chapters 02-04: softmax and scaled dot-product attention.

Every query scores every key, the scores become weights with a softmax, and each query's output
is the weighted blend of the values:

    weights = softmax(Q Kᵀ / √d_k + M)        out = weights V

q: (..., n_q, d_k)   k: (..., n_k, d_k)   v: (..., n_k, d_v)   ->   out: (..., n_q, d_v),
weights: (..., n_q, n_k). `...` is any leading batch/head dims (they broadcast). The √d_k keeps
the scores' variance near 1 whatever the width (chapter 03); M is a mask (chapter 04).

Masks: boolean with True = may attend (as in torch.nn.functional.scaled_dot_product_attention),
or an additive float mask of 0 / -inf (any finite bias is allowed too). A query whose keys are
all masked gets all-zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math

import torch


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_float_tensor(x, name: str, min_ndim: int = 1) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor (float32/float64/...), got dtype "
                         f"{x.dtype} with shape {_shape(x)}; convert it with {name}.float()")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims, got shape {_shape(x)}")


def softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(s - max) / sum(exp(s - max)) along `dim`: weights that are >= 0 and sum to 1.

    Subtracting each row's max changes nothing mathematically but keeps exp() from overflowing,
    so logits of ±1e4 are fine. A row that is all -inf (every key masked) has no distribution to
    give: it returns zeros there instead of the 0/0 = NaN of the textbook formula.
    """
    _check_float_tensor(scores, "scores")
    if not -scores.ndim <= dim < scores.ndim:
        raise ValueError(f"dim={dim} is out of range for scores of shape {_shape(scores)}")
    if scores.shape[dim] == 0:
        raise ValueError(f"scores of shape {_shape(scores)} have no entries along dim={dim} to normalise")
    row_max = scores.detach().amax(dim=dim, keepdim=True)
    # an all -inf row has max -inf; use 0 so that (-inf) - 0 = -inf, not (-inf) - (-inf) = NaN
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)  # each finite row has a 1 at its max, nothing overflows
    total = exp.sum(dim=dim, keepdim=True)
    # fully masked rows: exp is all 0, so dividing by 1 gives 0 (and a zero, finite gradient)
    return exp / torch.where(total > 0, total, torch.ones_like(total))


def _check_attention_inputs(q, k, v, mask, scale) -> tuple[int, ...]:
    """Validate at the boundary; return the scores' shape (..., n_q, n_k)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float_tensor(t, name, min_ndim=2)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must share one dtype: q is {q.dtype}, k is {k.dtype}, v is {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k and v must be on one device: q on {q.device}, k on {k.device}, v on {v.device}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has d_k={q.shape[-1]} but k has d_k={k.shape[-1]} "
                         f"(q {_shape(q)}, k {_shape(k)}; both want (..., n, d_k))")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k need d_k >= 1, got q {_shape(q)}, k {_shape(k)}")
    if k.shape[-2] == 0:
        raise ValueError(f"k has no keys (shape {_shape(k)}): every query needs at least one key to look at")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has n_k={k.shape[-2]} keys but v has {v.shape[-2]} values "
                         f"(k {_shape(k)}, v {_shape(v)}; want one value row per key)")
    try:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch/head) dims of q {_shape(q)}, k {_shape(k)} and "
                         f"v {_shape(v)} do not broadcast together") from None
    scores_shape = (*lead, q.shape[-2], k.shape[-2])
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
                or scale <= 0:
            raise ValueError(f"scale must be a finite number > 0 (or None for 1/sqrt(d_k)), got {scale!r}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise ValueError(f"mask must be a torch.Tensor (bool, or float 0/-inf), got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise ValueError(f"mask must be boolean (True = may attend) or an additive float mask, got "
                             f"dtype {mask.dtype} with shape {_shape(mask)}; for 0/1 integers use mask.bool()")
        try:
            ok = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"mask of shape {_shape(mask)} does not broadcast to the scores' shape "
                             f"{scores_shape} = (..., n_q, n_k) for q {_shape(q)}, k {_shape(k)}")
        if mask.device != q.device:
            raise ValueError(f"mask is on {mask.device} but q is on {q.device}")
        if mask.is_floating_point() and (torch.isnan(mask).any() or (mask == float("inf")).any()):
            raise ValueError("an additive mask may hold 0, finite biases or -inf, but this one holds NaN or +inf")
    return scores_shape


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None,
                                 scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale + M) v, returning (out, weights) so the weights can be plotted.

    q: (..., n_q, d_k)  k: (..., n_k, d_k)  v: (..., n_k, d_v)  mask: broadcastable to
    (..., n_q, n_k), bool (True = may attend) or additive float.  scale defaults to 1/√d_k.
    Returns out (..., n_q, d_v) and weights (..., n_q, n_k); fully masked rows are all zero.
    """
    _check_attention_inputs(q, k, v, mask, scale)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale  # (..., n_q, n_k)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))  # blocked keys: exp(-inf) = 0
        else:
            scores = scores + mask.to(scores.dtype)
    weights = softmax(scores, dim=-1)  # (..., n_q, n_k)
    out = weights @ v  # (..., n_q, d_v)
    return out, weights
