"""Chapter 05: heads that specialise, on a task with two jobs for them to share out.

`HeadsModel`, one multi-head attention layer, learns `BracketTask`, where every position must
name the token just before it AND the kind of bracket it sits inside; `BracketTask.head_scores`
measures which head took which job from the attention weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from course_lib.masks import causal_mask
from course_lib.multihead import MultiHeadAttention
from course_lib.train import IGNORE_INDEX
from course_lib.validate import wrong_shape


class BracketTask:
    """Letters with non-nested brackets, e.g. `a ( b c ) d [ e ] b`, after a start token `^`.

    At every position i >= 1 the model must name two things, packed into one class:

        target_i = (token at i-1) · (kinds+1) + (kind of bracket enclosing i, or 0 if outside)

    The first needs a look at the previous position, the second a look back at the open bracket
    that encloses i (possibly many positions back): two jobs for the heads to share out.
    """

    def __init__(self, letters: int = 5, kinds: int = 3, n: int = 16, p_open: float = 0.25,
                 p_close: float = 0.3):
        if not 1 <= kinds <= 3 or not 1 <= letters <= 26 or n < 2:
            raise ValueError(f"want 1 <= kinds <= 3, 1 <= letters <= 26, n >= 2; "
                             f"got {kinds}, {letters}, {n}")
        self.letters, self.kinds, self.n = letters, kinds, n
        self.p_open, self.p_close = p_open, p_close
        self.open, self.close, self.bos = letters, letters + kinds, letters + 2 * kinds
        self.vocab_size = letters + 2 * kinds + 1
        self.num_classes = self.vocab_size * (kinds + 1)
        self.labels = ([chr(ord("a") + i) for i in range(letters)] + list("([{")[:kinds]
                       + list(")]}")[:kinds] + ["^"])

    def decode(self, tokens: torch.Tensor) -> list[str]:
        """Token ids (n,) -> their printable labels."""
        return [self.labels[int(t)] for t in tokens]

    def batch(self, generator: torch.Generator,
              batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (batch, n+1) starting with `^`, and targets (batch, n+1), -100 at position 0."""
        n = self.n
        tokens = torch.empty(batch, n, dtype=torch.long)
        enclosing = torch.zeros(batch, n, dtype=torch.long)  # 0 outside, else kind + 1
        state = torch.zeros(batch, dtype=torch.long)
        for t in range(n):  # a tiny grammar: outside, maybe open; inside, maybe close
            u = torch.rand(batch, generator=generator)
            letter = torch.randint(0, self.letters, (batch,), generator=generator)
            kind = torch.randint(0, self.kinds, (batch,), generator=generator)
            opens = (state == 0) & (u < self.p_open)
            closes = (state > 0) & (u < self.p_close)
            tokens[:, t] = torch.where(opens, self.open + kind,
                                       torch.where(closes, self.close + state - 1, letter))
            state = torch.where(opens, kind + 1,
                                torch.where(closes, torch.zeros_like(state), state))
            enclosing[:, t] = state
        tokens = torch.cat([torch.full((batch, 1), self.bos), tokens], dim=1)  # (B, n+1)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, 1:] = tokens[:, :-1] * (self.kinds + 1) + enclosing
        return tokens, targets

    def enclosing_open(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, n): position of the open bracket enclosing each position, or -1 when outside."""
        n = tokens.shape[1]
        is_bracket = (tokens >= self.open) & (tokens < self.bos)
        pos = torch.arange(n, device=tokens.device).expand_as(tokens)
        # the latest bracket at or before each position
        last = torch.where(is_bracket, pos, torch.zeros_like(pos)).cummax(dim=1).values
        inside = (tokens.gather(1, last) >= self.open) & (tokens.gather(1, last) < self.close)
        return torch.where(inside, last, torch.full_like(last, -1))

    def head_scores(self, weights: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Score each head's job from its weights (B, heads, n, n) on tokens (B, n).

        previous: mean weight a query puts on the position just before it (queries i >= 1);
        bracket: mean weight a query strictly inside brackets puts on its enclosing open bracket.
        Each is a tensor (heads,) of fractions in [0, 1].
        """
        if weights.dim() != 4 or tokens.shape != (weights.shape[0], weights.shape[2]) \
                or weights.shape[2] != weights.shape[3]:
            raise ValueError(f"weights {tuple(weights.shape)} and tokens {tuple(tokens.shape)}: "
                             "wanted weights (batch, heads, n, n) and tokens (batch, n)")
        prev = torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1)  # (B, h, n-1): weight on i-1
        target = self.enclosing_open(tokens)  # (B, n)
        itself = torch.arange(tokens.shape[1], device=tokens.device)
        inside = (target >= 0) & (target != itself)  # inside, and not the bracket itself
        index = target.clamp(min=0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1)
        on_open = weights.gather(3, index)[..., 0]  # (B, h, n): weight on the enclosing bracket
        return {"previous": prev.mean(dim=(0, 2)),
                "bracket": on_open.transpose(0, 1)[:, inside].mean(-1)}


class HeadsModel(nn.Module):
    """token + position embeddings -> one causal MultiHeadAttention layer (+ residual) -> classes.

    No MLP: whatever the model learns about other positions has to come through the heads.
    forward(tokens (B, n)) -> (logits (B, n, num_classes), weights (B, heads, n, n)).
    """

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 32, num_heads: int = 2,
                 max_len: int = 32):
        super().__init__()
        self.max_len = max_len
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.norm = nn.LayerNorm(d_model)
        self.readout = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor):
        if tokens.dim() != 2 or tokens.shape[1] > self.max_len:
            raise wrong_shape("tokens", tokens, f"(batch, n <= {self.max_len})")
        n = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(n, device=tokens.device))  # (B, n, d)
        # attended (B, n, d), weights (B, h, n, n)
        attended, weights = self.attn(x, mask=causal_mask(n, device=tokens.device))
        return self.readout(self.norm(x + attended)), weights  # (B, n, classes), (B, h, n, n)
