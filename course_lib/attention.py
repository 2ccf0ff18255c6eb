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

from course_lib.masks import apply_mask
from course_lib.validate import check_attention, check_float_tensor, shape_of


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
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale  # (..., n_q, n_k)
    weights = softmax(apply_mask(scores, mask), dim=-1)  # (..., n_q, n_k); masked keys get 0
    out = weights @ v  # (..., n_q, d_v)
    return out, weights
