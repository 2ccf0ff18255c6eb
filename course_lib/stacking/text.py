"""Real English offline: the reference manual CPython ships (`pydoc_data.topics`), characters
as tokens, and the measurements that name what each head of a model trained on it does.

Every Python has `pydoc_data` (it is what `help("if")` prints), so nothing is downloaded. Its
text differs a little between Python versions; a trained model therefore keeps its own
alphabet (`CharTokenizer.chars`), and text with a character outside it is refused by name.
"""

from __future__ import annotations

import string

import torch

from course_lib.stacking.induction import previous_token_score

DELIMITERS = frozenset(" \n\t" + string.punctuation + "“”‘’—–…")  # where words end


def corpus_text() -> str:
    """Every topic of the reference manual, in sorted topic order, separated by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


class CharTokenizer:
    """Characters <-> token ids, for a fixed alphabet `chars` (a string of distinct characters)."""

    def __init__(self, chars: str):
        if not chars or len(set(chars)) != len(chars):
            raise ValueError(f"chars should be a non-empty string of distinct characters, "
                             f"got {len(chars)} characters, {len(set(chars))} distinct")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    def encode(self, text: str) -> torch.Tensor:
        missing = sorted(set(text) - set(self.index))
        if missing:
            raise ValueError(f"text has characters outside this model's alphabet: {missing}")
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def delimiter_ids(self) -> torch.Tensor:
        return torch.tensor([i for i, c in enumerate(self.chars) if c in DELIMITERS])


def split(ids: torch.Tensor, held_out: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """The first 1 - held_out of the token ids to train on, the rest to measure on."""
    cut = int(len(ids) * (1 - held_out))
    return ids[:cut], ids[cut:]


def text_batch(ids: torch.Tensor, generator: torch.Generator, batch: int = 32,
               n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows of n characters, and each one shifted by one (next-char targets)."""
    if len(ids) < n + 2:
        raise ValueError(f"ids holds {len(ids)} tokens; windows of n={n} need at least {n + 2}")
    start = torch.randint(0, len(ids) - n - 1, (batch,), generator=generator)
    rows = start[:, None] + torch.arange(n + 1)  # (B, n + 1)
    window = ids[rows]
    return window[:, :-1], window[:, 1:]


def repeated_random(generator: torch.Generator, vocab_ids: torch.Tensor, batch: int = 32,
                    segment: int = 24) -> torch.Tensor:
    """(batch, 2 * segment): random characters, then the same ones again."""
    pick = vocab_ids[torch.randint(0, len(vocab_ids), (batch, segment), generator=generator)]
    return torch.cat([pick, pick], dim=1)


def repeated_text(ids: torch.Tensor, generator: torch.Generator, batch: int = 32,
                  segment: int = 40) -> torch.Tensor:
    """(batch, 2 * segment): a random stretch of real text, then the same stretch again. In the
    second copy the next character can be read off the first: an induction head does that."""
    start = torch.randint(0, len(ids) - segment, (batch,), generator=generator)
    stretch = ids[start[:, None] + torch.arange(segment)]  # (B, segment)
    return torch.cat([stretch, stretch], dim=1)


def repeat_score(weights: torch.Tensor, segment: int) -> torch.Tensor:
    """On sequences made of a segment twice: mean weight from the second copy's j-th token onto
    the FIRST copy's (j+1)-th, the token after "the earlier occurrence of me":
    (B, heads, 2 * segment, 2 * segment) -> (heads,)."""
    q = torch.arange(segment, 2 * segment - 1)  # queries in the second copy (not the last)
    return weights[:, :, q, q - segment + 1].mean(dim=(0, 2))


def delimiter_score(weights: torch.Tensor, tokens: torch.Tensor,
                    delimiter_ids: torch.Tensor) -> torch.Tensor:
    """Mean weight on the latest space, newline or punctuation mark BEFORE each query (where the
    current word began): (B, heads, n, n), tokens (B, n) -> (heads,). Queries with no delimiter
    before them do not count."""
    n = tokens.shape[1]
    pos = torch.arange(n, device=tokens.device)
    is_delim = torch.isin(tokens, delimiter_ids.to(tokens.device))  # (B, n)
    latest = torch.where(is_delim, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # <= i
    before = torch.cat([torch.full_like(latest[:, :1], -1), latest[:, :-1]], dim=1)  # < i
    has = before >= 0
    index = before.clamp(min=0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1)
    on = weights.gather(3, index)[..., 0]  # (B, heads, n)
    return on.transpose(0, 1)[:, has].mean(dim=-1)  # (heads,)


def current_token_score(weights: torch.Tensor) -> torch.Tensor:
    """Mean weight a query puts on itself: (B, heads, n, n) -> (heads,)."""
    return torch.diagonal(weights, dim1=-2, dim2=-1).mean(dim=(0, 2))


JOBS = ("previous token", "current token", "delimiter", "induction")


@torch.no_grad()
def head_jobs(model, tokenizer: CharTokenizer, text_tokens: torch.Tensor,
              repeated_tokens: torch.Tensor, threshold: float = 0.4) -> list[dict]:
    """Score every head of `model` at each job, and name its job: the best-scoring one when its
    score reaches `threshold`, else "no clear job".

    text_tokens (B, n): windows of real text (previous token, current token, delimiter);
    repeated_tokens (B, 2m): a stretch of text twice (`repeated_text`, for induction). One dict
    per head: {"layer", "head", "job", and a score per job}. Each score is the mean weight on
    ONE position per query, so a head that spreads its attention scores low on all of them.
    """
    model.eval()
    model(text_tokens)
    on_text = [block.weights for block in model.blocks]
    model(repeated_tokens)
    on_repeat = [block.weights for block in model.blocks]
    delims = tokenizer.delimiter_ids()
    rows = []
    for layer, (w, r) in enumerate(zip(on_text, on_repeat)):
        scores = {"previous token": previous_token_score(w),
                  "current token": current_token_score(w),
                  "delimiter": delimiter_score(w, text_tokens, delims),
                  "induction": repeat_score(r, repeated_tokens.shape[1] // 2)}
        for head in range(w.shape[1]):
            row = {"layer": layer, "head": head, **{job: float(scores[job][head]) for job in JOBS}}
            best = max(JOBS, key=lambda job: row[job])
            row["job"] = best if row[best] >= threshold else "no clear job"
            rows.append(row)
    return rows
