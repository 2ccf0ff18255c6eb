"""Small models and the toy tasks they learn in seconds on a CPU (chapters 05-06).

Chapter 05: `HeadsModel`, one multi-head attention layer, learns `BracketTask`, where every
position must name the token just before it AND the kind of bracket it sits inside: two jobs
that the heads share out between them without being told to.

Chapter 06: `recall_batch` asks for the token seen k steps back; `RecurrentModel` (RNN, GRU or
LSTM: a fixed-size running summary) and `AttentionRecallModel` (one attention layer over the
whole past) learn it, and `accuracy_by_distance` scores them per k.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from course_lib.masks import causal_mask
from course_lib.multihead import MultiHeadAttention
from course_lib.train import IGNORE_INDEX

# ---------------------------------------------------------------------------------------------
# Chapter 05: heads that specialise
# ---------------------------------------------------------------------------------------------


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
            raise ValueError(f"want 1 <= kinds <= 3, 1 <= letters <= 26, n >= 2; got {kinds}, {letters}, {n}")
        self.letters, self.kinds, self.n, self.p_open, self.p_close = letters, kinds, n, p_open, p_close
        self.open, self.close, self.bos = letters, letters + kinds, letters + 2 * kinds
        self.vocab_size = letters + 2 * kinds + 1
        self.num_classes = self.vocab_size * (kinds + 1)
        self.labels = ([chr(ord("a") + i) for i in range(letters)] + list("([{")[:kinds]
                       + list(")]}")[:kinds] + ["^"])

    def decode(self, tokens: torch.Tensor) -> list[str]:
        """Token ids (n,) -> their printable labels."""
        return [self.labels[int(t)] for t in tokens]

    def batch(self, generator: torch.Generator, batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
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
            state = torch.where(opens, kind + 1, torch.where(closes, torch.zeros_like(state), state))
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
        last = torch.where(is_bracket, pos, torch.zeros_like(pos)).cummax(dim=1).values  # latest bracket
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
            raise ValueError(f"weights {tuple(weights.shape)} and tokens {tuple(tokens.shape)}: wanted "
                             "weights (batch, heads, n, n) and tokens (batch, n)")
        prev = torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1)  # (B, h, n-1): weight on i-1
        target = self.enclosing_open(tokens)  # (B, n)
        inside = (target >= 0) & (target != torch.arange(tokens.shape[1], device=tokens.device))  # not the bracket itself
        index = target.clamp(min=0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1)
        on_open = weights.gather(3, index)[..., 0]  # (B, h, n): weight on the enclosing bracket
        return {"previous": prev.mean(dim=(0, 2)), "bracket": on_open.transpose(0, 1)[:, inside].mean(-1)}


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
            raise ValueError(f"tokens has shape {tuple(tokens.shape)}, wanted (batch, n <= {self.max_len})")
        n = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(n, device=tokens.device))  # (B, n, d)
        attended, weights = self.attn(x, mask=causal_mask(n, device=tokens.device))  # (B, n, d), (B, h, n, n)
        return self.readout(self.norm(x + attended)), weights  # (B, n, classes), (B, h, n, n)


# ---------------------------------------------------------------------------------------------
# Chapter 06: recall a token seen k steps back
# ---------------------------------------------------------------------------------------------


def recall_batch(generator: torch.Generator, batch: int = 64, n: int = 16, vocab: int = 8,
                 max_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens x_1..x_n, then a query token `vocab + k` that asks: which token was k back?

    Returns tokens (batch, n+1) and targets (batch, n+1): -100 everywhere except the last position,
    whose target is x_{n+1-k} for k uniform in 1..max_k (default n). Use `recall_distances` to read
    k back from a batch.
    """
    max_k = n if max_k is None else max_k
    if not 1 <= max_k <= n:
        raise ValueError(f"max_k should lie in 1..n={n}, got {max_k}")
    x = torch.randint(0, vocab, (batch, n), generator=generator)  # (B, n)
    k = torch.randint(1, max_k + 1, (batch,), generator=generator)  # (B,)
    tokens = torch.cat([x, (vocab + k)[:, None]], dim=1)  # (B, n+1)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, -1] = x[torch.arange(batch), n - k]  # the token k positions before the query
    return tokens, targets


def recall_distances(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """The distance k each sequence of a `recall_batch` asks about: (batch,)."""
    return tokens[:, -1] - vocab


class RecurrentModel(nn.Module):
    """Embedding -> a recurrent layer (a fixed-size state) -> logits at every position.

    kind: "rnn" (tanh Elman RNN: the computation of course_lib.recurrent.RunningSummaryRNN, run
    by torch.nn.RNN's compiled loop because it trains several times faster), "gru" or "lstm".
    forward(tokens (B, n)) -> logits (B, n, num_classes).
    """

    def __init__(self, vocab_size: int, num_classes: int, d_hidden: int = 32, kind: str = "rnn",
                 d_embed: int = 16):
        super().__init__()
        if kind not in ("rnn", "gru", "lstm"):
            raise ValueError(f"kind should be 'rnn', 'gru' or 'lstm', got {kind!r}")
        self.kind = kind
        self.embed = nn.Embedding(vocab_size, d_embed)
        core = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}[kind]
        self.core = core(d_embed, d_hidden, batch_first=True)
        self.readout = nn.Linear(d_hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.core(self.embed(tokens))  # (B, n, d_hidden)
        return self.readout(states)  # (B, n, classes)

    def state_numbers(self) -> int:
        """Numbers carried from step to step (an LSTM carries h and c)."""
        d = self.readout.in_features
        return 2 * d if self.kind == "lstm" else d


class AttentionRecallModel(HeadsModel):
    """Chapter 06's attention side of the recall race: the same one-layer model as chapter 05's
    HeadsModel, with one head and room for 64 tokens by default.

    forward(tokens (B, n)) -> (logits (B, n, num_classes), weights (B, heads, n, n)).
    """

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 32, num_heads: int = 1,
                 max_len: int = 64):
        super().__init__(vocab_size, num_classes, d_model=d_model, num_heads=num_heads, max_len=max_len)


@torch.no_grad()
def accuracy_by_distance(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                         vocab: int) -> dict[int, float]:
    """Accuracy of the answer at the last position, for each distance k in the batch."""
    model.eval()
    out = model(tokens)
    logits = out[0] if isinstance(out, (tuple, list)) else out
    correct = logits[:, -1].argmax(-1) == targets[:, -1]  # (B,)
    k = recall_distances(tokens, vocab)
    return {int(d): float(correct[k == d].float().mean()) for d in torch.unique(k)}
