"""Chapter 05: multi-head attention — several attentions side by side, each on a slice.

    split:   (B, n, d)      -> (B, h, n, d/h)     one slice of width d/h per head
    attend:  each head runs softmax(q kᵀ/√(d/h) + M) v on its own slice
    merge:   (B, h, n, d/h) -> (B, n, d)          concatenate the heads' outputs
    mix:     out = merged W_Oᵀ + b_O              one final linear map mixes the heads

h heads of width d/h cost what one head of width d costs; what they buy is h independent
patterns of attention. Parameter names and layout match `torch.nn.MultiheadAttention`
(batch_first=True), so `load_torch_weights` can copy a trained torch module into this one.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from course_lib.attention import grouped_query_attention
from course_lib.position import apply_rope
from course_lib.validate import (
    check_count,
    check_float_tensor,
    check_kv_heads,
    check_mask,
    check_positions,
    wrong_shape,
)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, n, d) -> (B, heads, n, d/heads): head i gets features i·d/h .. (i+1)·d/h - 1."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise wrong_shape("x", x, "(batch, n, d)")
    batch, n, d = x.shape
    if d % check_count(num_heads, "num_heads"):
        raise ValueError(f"x has d={d}, which num_heads={num_heads} does not divide")
    return x.view(batch, n, num_heads, d // num_heads).transpose(1, 2)  # (B, h, n, d_head)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, heads, n, d_head) -> (B, n, heads·d_head): the inverse of `split_heads`."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise wrong_shape("x", x, "(batch, heads, n, d_head)")
    batch, heads, n, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, n, heads * d_head)  # (B, n, d)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: out = concat(head_1, ..., head_h) W_Oᵀ + b_O.

    forward(query, key=None, value=None, mask=None, *, positions=None, cache=None, layer=0)
      -> (out, weights)
      query (B, n_q, d); key, value (B, n_k, d): key defaults to query (self-attention) and
      value to key;
      mask: bool (True = may attend) or additive float, of shape (n_q, n_k), (B, n_q, n_k),
      (B, 1, n_k) (a padding mask) or (B, heads, n_q, n_k); size-1 dims broadcast.
      positions, cache (chapter 07): rotary positions for q and k, a KV cache to append to.
      out (B, n_q, d); weights (B, heads, n_q, n_k).

    num_kv_heads=g < num_heads (chapter 09): grouped-query attention. K and V get g heads of
    width d/h, so their projections map d to g·d/h columns, and each group of h/g query heads
    shares one of them (g = 1: multi-query attention).
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True,
                 num_kv_heads: int | None = None):
        super().__init__()
        d_model, num_heads = check_count(d_model, "d_model"), check_count(num_heads, "num_heads")
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}: each "
                             "head gets d_model/num_heads features, so pick a divisor of "
                             f"{d_model}")
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
        self.num_kv_heads = check_kv_heads(num_heads, num_kv_heads)
        d_kv = self.num_kv_heads * self.d_head  # = d_model unless K/V heads are shared
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W_Q: all heads' queries at once
        self.k_proj = nn.Linear(d_model, d_kv, bias=bias)
        self.v_proj = nn.Linear(d_model, d_kv, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W_O mixes the heads

    def _check(self, query, key, value, mask, positions, cache) -> None:
        wanted = f"(batch, n, d_model={self.d_model})"
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_float_tensor(t, name, wanted)
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise wrong_shape(name, t, wanted)
            if t.dtype != self.q_proj.weight.dtype:
                raise ValueError(f"{name} has dtype {t.dtype} but this module's weights are "
                                 f"{self.q_proj.weight.dtype}: convert one of them "
                                 f"(e.g. module.to({t.dtype}))")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key has shape {tuple(key.shape)} but value has "
                             f"{tuple(value.shape)}: wanted one value per key, "
                             "(batch, n_k, d_model) for both")
        if key.shape[0] != query.shape[0]:
            raise ValueError(f"query has batch {query.shape[0]} but key has batch {key.shape[0]}")
        batch, n_q, n_k = query.shape[0], query.shape[1], key.shape[1]
        if positions is not None:
            check_positions(positions, batch, n_q, "query")
            if n_k != n_q:
                raise ValueError(f"positions are the query tokens' positions, and the keys get "
                                 f"the same ones: wanted as many keys as queries, got n_q={n_q} "
                                 f"and n_k={n_k}")
            if self.d_head % 2:
                raise ValueError(f"positions rotate q and k (RoPE) in pairs of columns, but "
                                 f"d_head = d_model / num_heads = {self.d_head} is odd")
        n_k += 0 if cache is None else cache.length  # the cached keys come first
        # a 3-d mask is (batch, n_q, n_k), the same for every head: forward adds the head axis
        is_3d = isinstance(mask, torch.Tensor) and mask.dim() == 3
        scores = (batch, n_q, n_k) if is_3d else (batch, self.num_heads, n_q, n_k)
        check_mask(mask, scores, query.device, wanted=(
            f"(n_q, n_k)=({n_q}, {n_k}), (batch, n_q, n_k)=({batch}, {n_q}, {n_k}) such as a "
            f"(batch, 1, n_k) padding mask, or (batch, heads, n_q, n_k)=({batch}, "
            f"{self.num_heads}, {n_q}, {n_k}); size-1 dims broadcast"))

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None,
                value: torch.Tensor | None = None, mask: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None, cache=None, layer: int = 0):
        """softmax(q kᵀ/√d_head + M) v for every head, mixed by W_O -> (out, weights).

        positions (chapter 07): the query tokens' integer positions, (n_q,) or (B, n_q); q and k
        are then rotated by them (RoPE) after the heads are split. cache (chapter 07): a
        `KVCache`; this layer's new keys and values are appended to it (already rotated) and the
        queries attend over everything it holds, so n_k = cache.length + the new keys.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check(query, key, value, mask, positions, cache)
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]  # (B, 1, n_q or 1, n_k): the same mask for every head
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, h, n_q, d_head)
        k = split_heads(self.k_proj(key), self.num_kv_heads)    # (B, g, n_k, d_head)
        v = split_heads(self.v_proj(value), self.num_kv_heads)  # (B, g, n_k, d_head)
        if positions is not None:
            at = positions[:, None, :] if positions.dim() == 2 else positions  # (B, 1, n) or (n,)
            q, k = apply_rope(q, at), apply_rope(k, at)  # every head turned by its token's place
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, g, S, d_head): the past keys, then the new
        heads, weights = grouped_query_attention(q, k, v, mask=mask)  # (B, h, n_q, d_head)
        # weights: (B, h, n_q, n_k)
        out = self.out_proj(merge_heads(heads))  # (B, n_q, d)
        return out, weights

    @torch.no_grad()
    def load_torch_weights(self, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy a `torch.nn.MultiheadAttention`'s weights here (same math for batch_first=True).

        torch stores W_Q, W_K, W_V stacked in one `in_proj_weight` of shape (3d, d).
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise ValueError(f"mha must be a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        if self.num_kv_heads != self.num_heads:
            raise ValueError(f"this module shares keys and values (num_kv_heads="
                             f"{self.num_kv_heads} < num_heads={self.num_heads}); "
                             "torch.nn.MultiheadAttention has no such layout to load from")
        if (mha.embed_dim, mha.num_heads) != (self.d_model, self.num_heads):
            raise ValueError(f"mha has embed_dim={mha.embed_dim}, num_heads={mha.num_heads}; this "
                             f"module has d_model={self.d_model}, num_heads={self.num_heads}")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("only plain torch MultiheadAttention modules can be loaded: kdim = "
                             "vdim = embed_dim, add_bias_kv=False, add_zero_attn=False")
        has_bias = mha.in_proj_bias is not None
        if has_bias != (self.q_proj.bias is not None):
            raise ValueError(f"mha has bias={has_bias} but this module has "
                             f"bias={self.q_proj.bias is not None}")
        d = self.d_model
        for i, proj in enumerate((self.q_proj, self.k_proj, self.v_proj)):
            proj.weight.copy_(mha.in_proj_weight[i * d:(i + 1) * d])
            if has_bias:
                proj.bias.copy_(mha.in_proj_bias[i * d:(i + 1) * d])
        self.out_proj.weight.copy_(mha.out_proj.weight)
        if has_bias:
            self.out_proj.bias.copy_(mha.out_proj.bias)
        return self
