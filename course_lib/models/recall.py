"""Chapter 06: recall a token seen k steps back, a race between recurrence and attention.

`recall_batch` asks for the token seen k steps back; `RecurrentModel` (RNN, GRU or LSTM: a
fixed-size running summary) and `AttentionRecallModel` (one attention layer over the whole past,
chapter 05's `HeadsModel`) learn it, and `accuracy_by_distance` scores them per k.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from course_lib.models.heads import HeadsModel
from course_lib.train import IGNORE_INDEX
from course_lib.validate import check_choice


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
        self.kind = check_choice(kind, "kind", ("rnn", "gru", "lstm"))
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
        super().__init__(vocab_size, num_classes, d_model=d_model, num_heads=num_heads,
                         max_len=max_len)


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
