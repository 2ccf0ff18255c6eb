"""The trophy and the suitcase: what does "it" refer to?

    the trophy did not fit in the suitcase because it was too big .  so it is the -> trophy
    the trophy did not fit in the suitcase because it was too small . so it is the -> suitcase
    the trophy could not hold the suitcase because it was too small . so it is the -> trophy

A small templated language. The answer is one of two earlier nouns (the candidates), and which
one depends on the property word ("big" or "small"); with both verbs ("fit in" and "hold") it
depends on the verb and the property together. Every noun plays either role, so no noun is "the
big one": the model must read the sentence. Filler words between the candidates and "because"
push them `filler` tokens further from the answer; the rest of the filler goes in front, so
every sequence has the same length.
"""

from __future__ import annotations

import torch

from course_lib.train import IGNORE_INDEX

NOUNS = ("trophy", "suitcase", "ball", "box", "book", "bag", "cup", "jar", "coin", "purse",
         "cake", "tin", "shoe", "drawer", "lamp", "basket")
FILLER = ("and", "then", "still", "yesterday", "again", "after", "lunch", "really", "sadly", "once",
          "more", "today")
FIT = ("the", "N1", "did", "not", "fit", "in", "the", "N2")
HOLD = ("the", "N1", "could", "not", "hold", "the", "N2")
TAIL = ("because", "it", "was", "too", "ADJ", ".", "so", "it", "is", "the")


class PronounTask:
    """Sentences of `n = max_filler + len(FIT) + len(TAIL)` tokens; the target sits at the end.

    batch(generator, batch, filler=None) -> tokens (batch, n), targets (batch, n): -100 except
    the last position, whose target is the noun "it" refers to. filler: the number of filler
    words between the second candidate and "because" (None: uniform in 0..max_filler).
    verbs: the templates used, ("fit",) (the answer follows the property word alone) or
    ("fit", "hold") (verb and property together decide: a harder task, an XOR).
    """

    def __init__(self, max_filler: int = 24, verbs: tuple[str, ...] = ("fit",)):
        if not isinstance(max_filler, int) or max_filler < 0:
            raise ValueError(f"max_filler should be an int >= 0, got {max_filler!r}")
        verbs = tuple(verbs)
        if not verbs or not set(verbs) <= {"fit", "hold"} or len(set(verbs)) != len(verbs):
            raise ValueError(f"verbs should be ('fit',), ('hold',) or ('fit', 'hold'), "
                             f"got {verbs!r}")
        self.max_filler, self.verbs = max_filler, verbs
        words = ["the", "did", "not", "fit", "in", "could", "hold", "because", "it", "was", "too",
                 "big", "small", ".", "so", "is", *NOUNS, *FILLER]
        self.words = list(dict.fromkeys(words))
        self.index = {w: i for i, w in enumerate(self.words)}
        self.vocab_size = len(self.words)
        self.n = max_filler + len(FIT) + len(TAIL)
        self._nouns = torch.tensor([self.index[w] for w in NOUNS])
        self._filler = torch.tensor([self.index[w] for w in FILLER])

    def decode(self, tokens: torch.Tensor) -> list[str]:
        return [self.words[int(t)] for t in tokens]

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[w] for w in text.split()])

    def sentence(self, n1: str, n2: str, verb: str, adj: str, filler: list[str] | tuple = ()):
        """One sentence as words (no front filler); the answer is `answer(verb, adj, n1, n2)`."""
        template = FIT if verb == "fit" else HOLD
        body = [n1 if w == "N1" else n2 if w == "N2" else w for w in template]
        return body + list(filler) + [adj if w == "ADJ" else w for w in TAIL]

    @staticmethod
    def answer(verb: str, adj: str, n1: str, n2: str) -> str:
        """fit in + too big: the first (it did not fit); hold + too small: the first (it could
        not hold); otherwise the second."""
        return n1 if (verb == "fit") == (adj == "big") else n2

    def batch(self, generator: torch.Generator, batch: int = 64, filler: int | None = None):
        K = self.max_filler
        if filler is not None and not 0 <= filler <= K:
            raise ValueError(f"filler should lie in 0..max_filler={K}, got {filler!r}")
        pick = torch.rand(batch, len(NOUNS), generator=generator).argsort(dim=1)[:, :2]
        n1, n2 = self._nouns[pick[:, 0]], self._nouns[pick[:, 1]]  # two different nouns
        fit = torch.rand(batch, generator=generator) < 0.5  # drawn always: one data stream
        if self.verbs != ("fit", "hold"):
            fit = torch.full_like(fit, self.verbs == ("fit",))
        big = torch.rand(batch, generator=generator) < 0.5
        k = (torch.randint(0, K + 1, (batch,), generator=generator) if filler is None
             else torch.full((batch,), filler))
        noise = self._filler[torch.randint(0, len(FILLER), (batch, self.n), generator=generator)]
        tokens = noise.clone()  # (B, n): filler everywhere, then the sentence written over it
        for b in range(batch):
            adj = "big" if big[b] else "small"
            template = FIT if fit[b] else HOLD
            front = self.n - len(template) - int(k[b]) - len(TAIL)
            words = [self.words[n1[b]] if w == "N1" else self.words[n2[b]] if w == "N2" else w
                     for w in template]
            tokens[b, front:front + len(template)] = torch.tensor([self.index[w] for w in words])
            tail = [adj if w == "ADJ" else w for w in TAIL]
            tokens[b, self.n - len(TAIL):] = torch.tensor([self.index[w] for w in tail])
        targets = torch.full_like(tokens, IGNORE_INDEX)
        first = fit == big  # fit + big, or hold + small: the first candidate
        targets[:, -1] = torch.where(first, n1, n2)
        return tokens, targets

    def candidates(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, 2): the positions of the first and the second candidate noun in each sentence."""
        is_noun = torch.isin(tokens, self._nouns.to(tokens.device))  # (B, n): exactly two
        pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        return pos[is_noun].view(tokens.shape[0], 2)

    def filler_between(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B,): how many filler words stand between the second candidate and "because"."""
        second = self.candidates(tokens)[:, 1]
        return (self.n - len(TAIL)) - second - 1

    def answer_position(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B,): the position of the candidate that is the answer (targets[:, -1])."""
        cand = self.candidates(tokens)
        return torch.where(tokens.gather(1, cand[:, :1])[:, 0] == self._target(tokens),
                           cand[:, 0], cand[:, 1])

    def _target(self, tokens):
        fit = (tokens == self.index["fit"]).any(dim=1)
        big = tokens[:, -6] == self.index["big"]
        cand = self.candidates(tokens)
        n1, n2 = tokens.gather(1, cand[:, :1])[:, 0], tokens.gather(1, cand[:, 1:])[:, 0]
        return torch.where(fit == big, n1, n2)


@torch.no_grad()
def accuracy_by_filler(model, task: PronounTask, per_distance: int = 200, seed: int = 1234,
                       fillers=None) -> dict[int, float]:
    """Accuracy of the answer for each number of filler words, on `per_distance` fresh sentences."""
    model.eval()
    fillers = range(0, task.max_filler + 1) if fillers is None else fillers
    out = {}
    for k in fillers:
        tokens, targets = task.batch(torch.Generator().manual_seed(seed + k), per_distance, k)
        result = model(tokens)
        logits = result[0] if isinstance(result, (tuple, list)) else result
        out[int(k)] = float((logits[:, -1].argmax(-1) == targets[:, -1]).float().mean())
    return out


# ------------------------------------------------------------------ m pairs: anticipation

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
