"""Chapter 04: masks say which keys each query may look at.

Convention (the one `torch.nn.functional.scaled_dot_product_attention` uses): a boolean mask is
True where a query MAY attend and False where it may not. Attention turns a boolean mask into an
additive one, M = 0 where allowed and -inf where not, and computes softmax(QKᵀ/√d_k + M) V, so a
blocked key gets exp(-inf) = 0 weight, exactly.

    causal_mask(4)                 padding_mask([3, 1], n_keys=4)
    [[T, F, F, F],                 [[[T, T, T, F]],
     [T, T, F, F],                  [[T, F, F, F]]]      shape (batch, 1, n_keys)
     [T, T, T, F],
     [T, T, T, T]]                 query i sees keys 0..i; sequence b sees its first lengths[b] keys

This module imports only the shared input checks (`validate`); attention imports masks, not back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from course_lib.validate import check_count, check_lengths


def causal_mask(n_queries: int, n_keys: int | None = None, device=None) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True on and below the diagonal: query i sees keys 0..i.

    A model that writes text left to right may not peek at later tokens; this mask forbids it.
    n_keys defaults to n_queries. When n_keys != n_queries the diagonal starts at the TOP-LEFT
    corner (mask[i, j] = j <= i), exactly like `scaled_dot_product_attention(..., is_causal=True)`.
    Note: for queries that are the LAST n_queries of n_keys positions (decoding with a KV cache)
    you want the bottom-right alignment instead, `torch.ones(n_q, n_k).tril(n_k - n_q).bool()`.
    """
    n_queries = check_count(n_queries, "n_queries")
    n_keys = n_queries if n_keys is None else check_count(n_keys, "n_keys")
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()  # (n_q, n_k)


def sliding_window_mask(n_queries: int, window: int, n_keys: int | None = None,
                        device=None) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where 0 <= i - j < window (chapter 09).

    A causal mask cut to the last `window` keys: query i sees itself and the window - 1 tokens
    before it, so every row holds at most `window` True entries whatever the length.
    window >= n_keys is the causal mask. Top-left aligned like `causal_mask`.
    """
    n_queries = check_count(n_queries, "n_queries")
    window = check_count(window, "window")
    n_keys = n_queries if n_keys is None else check_count(n_keys, "n_keys")
    offset = torch.arange(n_queries, device=device)[:, None] - torch.arange(n_keys, device=device)
    return (offset >= 0) & (offset < window)  # (n_q, n_k): i - j in 0 .. window - 1


def padding_mask(lengths: Sequence[int] | torch.Tensor, n_keys: int) -> torch.Tensor:
    """Boolean (batch, 1, n_keys) mask, True for the first lengths[b] keys of sequence b.

    Ragged sequences are padded to a common length n_keys; the padding must receive no weight.
    The middle axis of size 1 broadcasts over queries, so the mask applies to scores of shape
    (batch, n_q, n_keys); for (batch, heads, n_q, n_keys) scores use `padding_mask(...)[:, None]`.
    A length of 0 is allowed: every query of that sequence is then fully masked (attention gives
    it zero weights and a zero output, not NaN).
    """
    n_keys = check_count(n_keys, "n_keys")
    t = check_lengths(lengths, n_keys, bound=f"n_keys={n_keys}")  # (batch,)
    positions = torch.arange(n_keys, device=t.device)  # (n_keys,)
    return (positions[None, :] < t[:, None])[:, None, :]  # (batch, 1, n_keys)


def as_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive form of a boolean mask: 0.0 where True (may attend), -inf where False."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a boolean tensor, got {got}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


def apply_mask(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """scores + M: blocked keys (False, or -inf) get a score of -inf, so exp() gives them 0.

    mask: None (nothing blocked), bool (True = may attend) or additive float (0 / bias / -inf),
    broadcastable to scores (..., n_q, n_k). Attention checks the mask before calling this.
    """
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))  # (..., n_q, n_k)
    return scores + mask.to(scores.dtype)  # (..., n_q, n_k)
