"""The trophy and the suitcase: what does "it" refer to?

    suitcase held no trophy , box held no ball , too big at the box -> ball
    suitcase held no trophy , box held no ball , too small at the box -> box

A small templated language (`PairsTask`): m (thing, container) pairs, then a late clause that
picks one pair and a property. Every noun plays either role, so no noun is "the big one": the
model must read the sentence, and a running summary must keep every pair, since it cannot know
which will be asked. (An earlier two-noun version of this task, which a recurrent model solves
by keeping both nouns, is gone: it could not show the point.)
"""

from __future__ import annotations

import torch

from course_lib.train import IGNORE_INDEX

NOUNS = ("trophy", "suitcase", "ball", "box", "book", "bag", "cup", "jar", "coin", "purse",
         "cake", "tin", "shoe", "drawer", "lamp", "basket")
FILLER = ("and", "then", "still", "yesterday", "again", "after", "lunch", "really", "sadly", "once",
          "more", "today")

PAIR = ("C", "held", "no", "T", ",")  # "the suitcase held no trophy (it did not fit)"
QUESTION = ("too", "ADJ", "at", "the", "C")  # which was too big / too small at the box?
ASK = ("so", "it", "is", "the")  # closes a question-first sentence


class PairsTask:
    """m (thing, container) pairs, then a late clause that picks one pair and a property:

        suitcase held no trophy , box held no ball , jar held no cup , too big at the box -> ball

    Read: which one was too big at the box? "too small": the container itself (the box); "too
    big": the thing that did not fit in it (the ball), which only the pair clause says. The
    answer is read at the last token. A reader that keeps the text can look the pair up once it
    knows which; a running summary must keep every pair, since it cannot know which will be
    asked. question_first=True puts the late clause first and ends with "so it is the" (the
    question before the pairs, as in chapter 06's question-first recall): then a summary knows
    what to keep. Every sentence has n = 5 * max_pairs + 9 tokens (filler in front); the number
    of pairs m is uniform in 1..max_pairs unless given.

    batch(generator, batch, pairs=None) -> tokens (batch, n), targets (batch, n): -100 except
    the last position, whose target is the noun "it" refers to.
    """

    def __init__(self, max_pairs: int = 6, question_first: bool = False):
        if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or \
                not 1 <= max_pairs <= len(NOUNS) // 2:
            raise ValueError(f"max_pairs should be an int in 1..{len(NOUNS) // 2}, "
                             f"got {max_pairs!r}")
        self.max_pairs, self.question_first = max_pairs, bool(question_first)
        words = ["the", "held", "no", ",", "too", "big", "small", "at", "so", "it", "is",
                 *NOUNS, *FILLER]
        self.words = list(dict.fromkeys(words))
        self.index = {w: i for i, w in enumerate(self.words)}
        self.vocab_size = len(self.words)
        self.n = len(PAIR) * max_pairs + len(QUESTION) + len(ASK)
        self._nouns = torch.tensor([self.index[w] for w in NOUNS])
        self._filler = torch.tensor([self.index[w] for w in FILLER])

    def decode(self, tokens: torch.Tensor) -> list[str]:
        return [self.words[int(t)] for t in tokens]

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[w] for w in text.split()])

    def sentence(self, pairs: list[tuple[str, str]], pick: int, adj: str) -> list[str]:
        """One sentence as words (no front filler): pair `pick` (0-based) is asked about."""
        body = [w for thing, box in pairs for w in
                (thing if p == "T" else box if p == "C" else p for p in PAIR)]
        question = [pairs[pick][1] if w == "C" else adj if w == "ADJ" else w for w in QUESTION]
        if self.question_first:
            return question + body + list(ASK)
        return body + question

    @staticmethod
    def answer(pairs: list[tuple[str, str]], pick: int, adj: str) -> str:
        """too small: the container of pair `pick`; too big: its thing."""
        return pairs[pick][1] if adj == "small" else pairs[pick][0]

    def batch(self, generator: torch.Generator, batch: int = 64, pairs: int | None = None):
        M = self.max_pairs
        if pairs is not None and (isinstance(pairs, bool) or not 1 <= pairs <= M):
            raise ValueError(f"pairs should lie in 1..max_pairs={M}, got {pairs!r}")
        nouns = self._nouns[torch.rand(batch, len(NOUNS), generator=generator)
                            .argsort(dim=1)[:, :2 * M]]  # (B, 2M) distinct: thing, box, ...
        m = (torch.randint(1, M + 1, (batch,), generator=generator) if pairs is None
             else torch.full((batch,), pairs))
        pick = (torch.rand(batch, generator=generator) * m).long()  # (B,) in 0..m-1
        big = torch.rand(batch, generator=generator) < 0.5
        tokens = self._filler[torch.randint(0, len(FILLER), (batch, self.n), generator=generator)]
        for b in range(batch):
            words = self.sentence([(self.words[nouns[b, 2 * i]], self.words[nouns[b, 2 * i + 1]])
                                   for i in range(int(m[b]))], int(pick[b]),
                                  "big" if big[b] else "small")
            tokens[b, self.n - len(words):] = torch.tensor([self.index[w] for w in words])
        targets = torch.full_like(tokens, IGNORE_INDEX)
        rows = torch.arange(batch)
        targets[:, -1] = torch.where(big, nouns[rows, 2 * pick], nouns[rows, 2 * pick + 1])
        return tokens, targets

    def pairs_in(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B,): how many pairs each sentence lists."""
        return (tokens == self.index["held"]).sum(dim=1)

    def positions(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Where the parts of the lookup stand, each (B,): "selector" (the container the late
        clause names), "adjective" (big or small), "container" (the selector's earlier mention,
        in its pair), "thing" (that pair's thing), "answer" (where the answer noun stands)."""
        B, n = tokens.shape
        q0 = torch.full((B,), n - len(QUESTION))  # where the question starts
        if self.question_first:
            q0 = n - len(ASK) - len(PAIR) * self.pairs_in(tokens) - len(QUESTION)
        rows = torch.arange(B)
        selector = q0 + QUESTION.index("C")
        adjective = q0 + QUESTION.index("ADJ")
        pos = torch.arange(n).expand(B, n)
        in_pair = (tokens == tokens[rows, selector][:, None]) & (pos != selector[:, None])
        container = pos[in_pair].view(B)
        thing = container + PAIR.index("T") - PAIR.index("C")
        big = tokens[rows, adjective] == self.index["big"]
        return {"selector": selector, "adjective": adjective, "container": container,
                "thing": thing, "answer": torch.where(big, thing, container)}


@torch.no_grad()
def accuracy_by_pairs(model, task: PairsTask, per_m: int = 200, seed: int = 4321,
                      adj: str | None = None) -> dict[int, float]:
    """Accuracy for each number of pairs m = 1..max_pairs, on `per_m` fresh sentences each;
    adj="big" or "small" scores only the sentences with that property word."""
    model.eval()
    out = {}
    for m in range(1, task.max_pairs + 1):
        tokens, targets = task.batch(torch.Generator().manual_seed(seed + m), per_m, m)
        result = model(tokens)
        logits = result[0] if isinstance(result, (tuple, list)) else result
        right = logits[:, -1].argmax(-1) == targets[:, -1]
        if adj is not None:
            at = task.positions(tokens)["adjective"]
            right = right[tokens[torch.arange(len(tokens)), at] == task.index[adj]]
        out[m] = float(right.float().mean())
    return out
