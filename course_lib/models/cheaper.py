"""Chapter 09: one small model, four ways of paying less for its attention.

`CheaperAttentionModel` is chapter 05's one-layer model (token + position embeddings, one causal
attention layer with a residual, LayerNorm, a linear readout) with its attention swapped:

    CheaperAttentionModel(vocab, classes)                     full causal softmax attention
    CheaperAttentionModel(vocab, classes, window=W)           each query sees its last W keys
    CheaperAttentionModel(vocab, classes, num_kv_heads=g)     g key/value heads shared by groups
    CheaperAttentionModel(vocab, classes, kind="linear")      linear attention, φ = elu + 1

so that trained on the same task for the same steps, what each shortcut costs in accuracy is the
only difference. Tasks: chapter 06's recall-k-back (a window of W can answer k < W, never more),
chapter 05's bracket task (two jobs for the heads, to see what sharing K and V costs) and
`majority_batch` (the most frequent token: a task an even blend of the past answers).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from course_lib.linear_attention import linear_attention
from course_lib.masks import causal_mask, sliding_window_mask
from course_lib.multihead import MultiHeadAttention, merge_heads, split_heads
from course_lib.train import IGNORE_INDEX
from course_lib.validate import check_choice, check_count

KINDS = ("softmax", "linear")


def majority_batch(generator: torch.Generator, batch: int = 64, n: int = 24, vocab: int = 8,
                   boost: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """n tokens, then a query token `vocab` that asks: which token was the most frequent?

    Each sequence draws a favourite token and takes it at each position with probability
    `boost`, else a uniform token, so the favourite usually, not always, wins. Returns tokens
    (batch, n+1) and targets (batch, n+1): -100 except the last position, whose target is the
    most frequent token (-100 there too when two tokens tie). The answer needs no position
    picked out: an even blend of all n tokens' identities holds it.
    """
    n, vocab = check_count(n, "n"), check_count(vocab, "vocab", minimum=2)
    favourite = torch.randint(0, vocab, (batch, 1), generator=generator)        # (B, 1)
    uniform = torch.randint(0, vocab, (batch, n), generator=generator)          # (B, n)
    x = torch.where(torch.rand(batch, n, generator=generator) < boost, favourite, uniform)
    counts = nn.functional.one_hot(x, vocab).sum(1)                             # (B, vocab)
    top = counts.topk(2, dim=-1).values                                         # (B, 2)
    answer = counts.argmax(-1).masked_fill(top[:, 0] == top[:, 1], IGNORE_INDEX)
    tokens = torch.cat([x, torch.full((batch, 1), vocab)], dim=1)               # (B, n+1)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, -1] = answer
    return tokens, targets


class LinearMultiHeadAttention(nn.Module):
    """Chapter 05's multi-head attention with causal linear attention inside each head.

    forward(x (B, n, d)) -> (out (B, n, d), None): there is no weight grid to return.
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor):
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, h, n, d_head)
        k = split_heads(self.k_proj(x), self.num_heads)  # (B, h, n, d_head)
        v = split_heads(self.v_proj(x), self.num_heads)  # (B, h, n, d_head)
        heads = linear_attention(q, k, v, causal=True)   # (B, h, n, d_head)
        return self.out_proj(merge_heads(heads)), None   # (B, n, d)


class CheaperAttentionModel(nn.Module):
    """tokens (B, n) -> (logits (B, n, num_classes), weights (B, heads, n, n) or None).

    kind: "softmax" or "linear"; window: a sliding window of W keys (softmax only);
    num_kv_heads: grouped-query attention with that many K/V heads (softmax only).
    """

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 32, num_heads: int = 2,
                 max_len: int = 64, kind: str = "softmax", window: int | None = None,
                 num_kv_heads: int | None = None):
        super().__init__()
        check_choice(kind, "kind", KINDS)
        if kind == "linear" and (window is not None or num_kv_heads is not None):
            raise ValueError("window and num_kv_heads apply to softmax attention (kind='softmax')")
        self.kind, self.window, self.max_len = kind, window, max_len
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        if kind == "linear":
            self.attn = LinearMultiHeadAttention(d_model, num_heads)
        else:
            self.attn = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads)
        self.norm = nn.LayerNorm(d_model)
        self.readout = nn.Linear(d_model, num_classes)

    def mask(self, n: int, device=None) -> torch.Tensor:
        """Who may see whom: (n, n), causal, cut to the window when there is one."""
        if self.window is None:
            return causal_mask(n, device=device)
        return sliding_window_mask(n, self.window, device=device)

    def forward(self, tokens: torch.Tensor):
        if tokens.dim() != 2 or tokens.shape[1] > self.max_len:
            raise ValueError(f"tokens has shape {tuple(tokens.shape)}, "
                             f"wanted (batch, n <= {self.max_len})")
        n = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(n, device=tokens.device))  # (B, n, d)
        if self.kind == "linear":
            attended, weights = self.attn(x)                                     # (B, n, d)
        else:
            attended, weights = self.attn(x, mask=self.mask(n, tokens.device))  # (B, h, n, n)
        return self.readout(self.norm(x + attended)), weights


def kv_parameters(model: CheaperAttentionModel) -> int:
    """Weights of the key and value projections (what grouped-query attention shrinks)."""
    return sum(p.numel() for name, p in model.attn.named_parameters()
               if name.startswith(("k_proj", "v_proj")))
