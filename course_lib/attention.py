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

import torch

from course_lib.masks import apply_mask
from course_lib.validate import (
    check_attention,
    check_float_tensor,
    check_kv_heads,
    default_scale,
    shape_of,
    wrong_shape,
)


def softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(s - max) / sum(exp(s - max)) along `dim`: weights that are >= 0 and sum to 1.

    Subtracting each row's max changes nothing mathematically but keeps exp() from overflowing,
    so logits of ±1e4 are fine. A row that is all -inf (every key masked) has no distribution to
    give: it returns zeros there instead of the 0/0 = NaN of the textbook formula.
    """
    check_float_tensor(scores, "scores")
    if not -scores.ndim <= dim < scores.ndim:
        raise ValueError(f"dim={dim} is out of range for scores of shape {shape_of(scores)}")
    if scores.shape[dim] == 0:
        raise ValueError(f"scores of shape {shape_of(scores)} have no entries along dim={dim} "
                         "to normalise")
    row_max = scores.detach().amax(dim=dim, keepdim=True)
    # an all -inf row has max -inf; use 0 so that (-inf) - 0 = -inf, not (-inf) - (-inf) = NaN
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)  # each finite row has a 1 at its max, nothing overflows
    total = exp.sum(dim=dim, keepdim=True)
    # fully masked rows: exp is all 0, so dividing by 1 gives 0 (and a zero, finite gradient)
    return exp / torch.where(total > 0, total, torch.ones_like(total))


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None,
                                 scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale + M) v, returning (out, weights) so the weights can be plotted.

    q: (..., n_q, d_k)  k: (..., n_k, d_k)  v: (..., n_k, d_v)  mask: broadcastable to
    (..., n_q, n_k), bool (True = may attend) or additive float.  scale defaults to 1/√d_k.
    Returns out (..., n_q, d_v) and weights (..., n_q, n_k); fully masked rows are all zero.
    """
    check_attention(q, k, v, mask, scale)
    scale = default_scale(scale, q)
    scores = q @ k.transpose(-2, -1) * scale  # (..., n_q, n_k)
    weights = softmax(apply_mask(scores, mask), dim=-1)  # (..., n_q, n_k); masked keys get 0
    out = weights @ v  # (..., n_q, d_v)
    return out, weights


def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            mask: torch.Tensor | None = None,
                            scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with h query heads sharing g key/value heads (chapter 09), h % g == 0.

    q: (..., h, n_q, d)  k: (..., g, n_k, d)  v: (..., g, n_k, d_v). Query heads come in g groups
    of h/g consecutive heads; group j attends with K/V head j (what PyTorch's
    `scaled_dot_product_attention(..., enable_gqa=True)` computes). g = h is multi-head
    attention, g = 1 multi-query. mask broadcasts to (..., h, n_q, n_k).
    Returns out (..., h, n_q, d_v) and weights (..., h, n_q, n_k).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(t, name, "(..., heads, n, d)", min_ndim=3)
    h, g = q.shape[-3], k.shape[-3]
    if v.shape[-3] != g:
        raise ValueError(f"k has {g} heads but v has {v.shape[-3]} (k {shape_of(k)}, "
                         f"v {shape_of(v)}; want one value head per key head)")
    check_kv_heads(h, g, shapes=f" (h={h} query heads in q {shape_of(q)}, g={g} in k "
                                f"{shape_of(k)})")
    if g == h:
        return scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    if mask is not None and isinstance(mask, torch.Tensor) and mask.ndim >= 3:
        if mask.shape[-3] not in (1, h):
            raise wrong_shape("mask", mask, f"(..., 1 or h={h}, n_q, n_k)")
        # (..., h, n_q, n_k) -> (..., g, h/g, n_q, n_k); a size-1 head axis broadcasts
        mask = mask.unflatten(-3, (g, h // g)) if mask.shape[-3] == h else mask.unsqueeze(-3)
    q_groups = q.unflatten(-3, (g, h // g))              # (..., g, h/g, n_q, d)
    k_shared, v_shared = k.unsqueeze(-3), v.unsqueeze(-3)  # (..., g, 1, n_k, d): not copied
    out, weights = scaled_dot_product_attention(q_groups, k_shared, v_shared, mask=mask,
                                                scale=scale)
    return out.flatten(-4, -3), weights.flatten(-4, -3)  # (..., h, n_q, d_v), (..., h, n_q, n_k)
