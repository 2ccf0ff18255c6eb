"""Chapter 10: one transformer block, built from the pieces of chapters 02-09.

    x = x + attn(ln1(x), mask)      every token gathers from the others (chapter 05's heads)
    x = x + mlp(ln2(x))             each token alone: Linear, GELU, Linear

Pre-LayerNorm ("norm first"): each sub-layer reads a normalised copy of the residual stream and
ADDS its answer back, so the stream itself is never overwritten; a later block sees the token
plus everything every earlier block added. That is what lets a layer-2 query ask a question
about what layer 1 found. Parameter names follow `torch.nn.TransformerEncoderLayer`'s roles, so
`load_torch_weights` copies one (norm_first=True, batch_first=True, activation="gelu") here.

The same block, given `positions` (rotary embeddings of chapter 07) and a `cache` (chapter 07's
KV cache), is what `course_lib.models.TinyTransformer` stacks.
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.multihead import MultiHeadAttention
from course_lib.validate import check_count, wrong_shape


class TransformerBlock(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).

    TransformerBlock(d_model, num_heads, d_mlp, num_kv_heads=None)
      forward(x, mask=None, *, positions=None, cache=None, layer=0) -> (batch, n, d_model);
      x (batch, n, d_model); mask bool, True = may attend, any shape `MultiHeadAttention`
      accepts ((n, n) for a causal mask); positions, cache, layer go to its forward as they are.
      num_kv_heads=g (chapter 09): the heads share g key/value heads (grouped-query attention).
    After each forward, `self.weights` holds the attention weights (batch, heads, n_q, n_k),
    detached, so a notebook can draw what the block looked at.
    """

    def __init__(self, d_model: int, num_heads: int, d_mlp: int, num_kv_heads: int | None = None):
        super().__init__()
        d_mlp = check_count(d_mlp, "d_mlp")
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads)
        self.d_model, self.num_heads, self.d_mlp = self.attn.d_model, self.attn.num_heads, d_mlp
        self.num_kv_heads = self.attn.num_kv_heads
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model))
        self.weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None, cache=None, layer: int = 0) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise wrong_shape("x", x, f"(batch, n, d_model={self.d_model})")
        # chapter 05's heads; with positions/cache, chapter 07's RoPE and KV cache inside them
        attended, weights = self.attn(self.ln1(x), mask=mask, positions=positions, cache=cache,
                                      layer=layer)  # (B, n, d), (B, heads, n, n_k)
        self.weights = weights.detach()
        x = x + attended                   # (B, n, d): the stream keeps x, adds what was gathered
        return x + self.mlp(self.ln2(x))   # (B, n, d): each token on its own, through the MLP

    @torch.no_grad()
    def load_torch_weights(self, layer: nn.TransformerEncoderLayer) -> TransformerBlock:
        """Copy a `torch.nn.TransformerEncoderLayer` (norm_first=True, batch_first=True,
        activation="gelu") here: norm1 -> ln1, self_attn -> attn, norm2 -> ln2,
        linear1/linear2 -> mlp. Dropout has no counterpart: compare in eval mode or dropout=0."""
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise ValueError(f"layer should be a torch.nn.TransformerEncoderLayer, "
                             f"got {type(layer).__name__}")
        if not layer.norm_first or not layer.self_attn.batch_first:
            raise ValueError(f"layer has norm_first={layer.norm_first}, batch_first="
                             f"{layer.self_attn.batch_first}: wanted both True (a pre-LN block "
                             "that takes (batch, n, d))")
        act = layer.activation
        if not (act is nn.functional.gelu or isinstance(act, nn.GELU)) or \
                getattr(act, "approximate", "none") != "none":
            raise ValueError(f"layer has activation {act!r}: wanted 'gelu' (exact, not tanh)")
        shape = (layer.linear1.in_features, layer.self_attn.num_heads, layer.linear1.out_features)
        if shape != (self.d_model, self.num_heads, self.d_mlp):
            raise ValueError(f"layer has (d_model, num_heads, dim_feedforward)={shape}; this block "
                             f"has (d_model, num_heads, d_mlp)="
                             f"{(self.d_model, self.num_heads, self.d_mlp)}")
        for ours, theirs in ((self.ln1, layer.norm1), (self.ln2, layer.norm2)):
            if ours.eps != theirs.eps:
                raise ValueError(f"layer's LayerNorm eps={theirs.eps} differs from ours "
                                 f"({ours.eps}): build it with layer_norm_eps={ours.eps}")
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        self.attn.load_torch_weights(layer.self_attn)
        for ours, theirs in ((self.mlp[0], layer.linear1), (self.mlp[2], layer.linear2)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        return self
