"""One attention layer and its tasks: the experiments of chapters 02 and 03.

* `KindLookup` + `kind_lookup_batch` (chapter 02, keys vs values): every token has a *kind* and a
  *content*; the query names a kind and the answer is the content of the token of that kind. The
  key only needs the kind ("I am a date"), the value only the content (the date itself); with
  `tie_kv=True` one matrix serves as W_K and W_V, so one vector must do both jobs.
* `CopyPrevious` + `copy_previous_batch` (chapter 03, the scale in training): each token must
  output the word of the token before it (on a circle, as in chapter 02), through attention's
  blend of values; `scaled=False` drops the 1/sqrt(d_k).
* `Aligner` + `reverse_translate_batch` (chapter 02, where the dot product came from): a toy
  translation whose target positions must align with source positions, scored either by a dot
  product or by additive attention, the score attention was introduced with.
* `PredecessorScores` + `predecessor_batch` (chapter 02's tied-vs-separate experiment, reused in
  chapter 07): the scores themselves are the logits, and the right key is the previous token on
  a circle; `places=False` drops the place embeddings, so the model sees only which words occur.

Both models return `(logits, weights)`, so `course_lib.train.train` can train them and a notebook
can plot what they attend to. Every parameter is drawn from the model's own seeded generator.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from course_lib.validate import check_choice, check_count


def _init(generator: torch.Generator, *shape: int, std: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, generator=generator) * std)


# --- chapter 02: keys are for finding, values are for using ---------------------------------


def kind_lookup_batch(generator: torch.Generator, size: int = 64, kinds: int = 8,
                      contents: int = 8):
    """`size` examples of `kinds` tokens: each kind once, in random order, with random contents.

    Returns `((kind_ids, content_ids, asked), target)`: kind_ids, content_ids (size, kinds),
    asked (size,) the kind the query names, target (size,) the content of the token of that kind.
    """
    for name, value in (("size", size), ("kinds", kinds), ("contents", contents)):
        check_count(value, name)
    kind_ids = torch.argsort(torch.rand(size, kinds, generator=generator), dim=-1)   # (B, n)
    content_ids = torch.randint(contents, (size, kinds), generator=generator)         # (B, n)
    asked = torch.randint(kinds, (size,), generator=generator)                        # (B,)
    where = (kind_ids == asked[:, None]).int().argmax(dim=-1, keepdim=True)           # (B, 1)
    return (kind_ids, content_ids, asked), content_ids.gather(1, where).squeeze(1)


class KindLookup(nn.Module):
    """One query ("which content has the token of kind a?") against a sequence of tokens.

    x_j = kind_emb[kind_j] + content_emb[content_j];  q = ask_emb[a] W_Q;  k_j = x_j W_K;
    v_j = x_j W_V;  logits = softmax(q k^T / sqrt(width)) V W_O + b_O.  `tie_kv`: W_V is W_K.
    """

    def __init__(self, width: int, tie_kv: bool = False, kinds: int = 8, contents: int = 8,
                 d_model: int = 16, seed: int = 0):
        super().__init__()
        for name, value in (("width", width), ("kinds", kinds), ("contents", contents),
                            ("d_model", d_model)):
            check_count(value, name)
        g = torch.Generator().manual_seed(seed)
        self.kind_emb = _init(g, kinds, d_model, std=1.0)
        self.content_emb = _init(g, contents, d_model, std=1.0)
        self.ask_emb = _init(g, kinds, d_model, std=1.0)
        self.W_Q = _init(g, d_model, width, std=1 / math.sqrt(d_model))
        self.W_K = _init(g, d_model, width, std=1 / math.sqrt(d_model))
        self.W_V = self.W_K if tie_kv else _init(g, d_model, width, std=1 / math.sqrt(d_model))
        self.W_O = _init(g, width, contents, std=1 / math.sqrt(width))
        self.b_O = nn.Parameter(torch.zeros(contents))
        self.width, self.tie_kv = width, tie_kv

    def forward(self, batch):
        kind_ids, content_ids, asked = batch                            # (B, n), (B, n), (B,)
        x = self.kind_emb[kind_ids] + self.content_emb[content_ids]             # (B, n, d_model)
        q = self.ask_emb[asked] @ self.W_Q                                      # (B, width)
        k, v = x @ self.W_K, x @ self.W_V                                       # (B, n, width)
        scores = (k @ q[:, :, None]).squeeze(-1) / math.sqrt(self.width)        # (B, n)
        weights = torch.softmax(scores, dim=-1)                                 # (B, n)
        out = (weights[:, :, None] * v).sum(dim=1)                              # (B, width)
        return out @ self.W_O + self.b_O, weights                               # (B, contents)


# --- chapter 03: the scale in training -------------------------------------------------------


def copy_previous_batch(generator: torch.Generator, size: int = 32, vocab: int = 50, n: int = 6):
    """`size` sequences of `n` random words on a circle starting at a random place.

    Returns `((word_ids, places), target)`, all (size, n); target[:, i] is the word of the token
    before token i (the first token's predecessor is the last, as in chapter 02).
    """
    for name, value in (("size", size), ("vocab", vocab), ("n", n)):
        check_count(value, name)
    word_ids = torch.randint(vocab, (size, n), generator=generator)                       # (B, n)
    places = (torch.randint(n, (size, 1), generator=generator) + torch.arange(n)) % n     # (B, n)
    return (word_ids, places), word_ids[:, (torch.arange(n) - 1) % n]


class CopyPrevious(nn.Module):
    """Word + place embeddings, one attention layer of key width `d_k`, a readout to the vocabulary.

    The entries of x, q and k start with variance about 1, the regime of chapter 03's section 1,
    so without the scale the initial scores have standard deviation about sqrt(d_k).
    scaled: multiply the scores by 1/sqrt(d_k) (True) or leave them raw (False).
    """

    def __init__(self, d_k: int, scaled: bool = True, vocab: int = 50, n: int = 6,
                 d_model: int = 16, seed: int = 0):
        super().__init__()
        for name, value in (("d_k", d_k), ("vocab", vocab), ("n", n), ("d_model", d_model)):
            check_count(value, name)
        g = torch.Generator().manual_seed(seed)
        self.word_emb = _init(g, vocab, d_model, std=1 / math.sqrt(2))   # x = word + place:
        self.place_emb = _init(g, n, d_model, std=1 / math.sqrt(2))      # variance 1 per entry
        self.W_Q = _init(g, d_model, d_k, std=1 / math.sqrt(d_model))
        self.W_K = _init(g, d_model, d_k, std=1 / math.sqrt(d_model))
        self.W_V = _init(g, d_model, d_model, std=1 / math.sqrt(d_model))
        self.W_O = _init(g, d_model, vocab, std=1 / math.sqrt(d_model))
        self.b_O = nn.Parameter(torch.zeros(vocab))
        self.scale = 1 / math.sqrt(d_k) if scaled else 1.0

    def forward(self, batch):
        word_ids, places = batch                                                # (B, n) each
        x = self.word_emb[word_ids] + self.place_emb[places]                    # (B, n, d_model)
        q, k, v = x @ self.W_Q, x @ self.W_K, x @ self.W_V              # (B, n, d_k | d_model)
        weights = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)   # (B, n, n)
        return weights @ v @ self.W_O + self.b_O, weights                       # (B, n, vocab)


# --- chapter 02: where the dot product came from ---------------------------------------------


def reverse_translate_batch(generator: torch.Generator, size: int = 32, vocab: int = 20,
                            n: int = 6):
    """A toy translation: the target is the source sentence reversed, word by word translated.

    Source words are ids 0..vocab-1; the target word at position t is the translation
    `(w + 1) % vocab` of the source word at position n-1-t, so target t must align with source
    n-1-t. Returns `(source_ids, target_ids)`, both (size, n).
    """
    for name, value in (("size", size), ("vocab", vocab), ("n", n)):
        check_count(value, name)
    source = torch.randint(vocab, (size, n), generator=generator)                          # (B, n)
    return source, (source.flip(-1) + 1) % vocab


class Aligner(nn.Module):
    """Each target position asks for the source word it translates, with one of two scores.

    keys and values come from the source (word + position embeddings), the query of target
    position t is a learned embedding of t. score="dot": q . k / sqrt(d), one matrix product for
    all pairs; score="additive" (Bahdanau et al., 2014): w . tanh(W_a q + U_a k), a small network
    evaluated on every (target, source) pair.
    """

    def __init__(self, score: str = "dot", vocab: int = 20, n: int = 6, d: int = 16,
                 seed: int = 0):
        super().__init__()
        check_choice(score, "score", ("dot", "additive"))
        for name, value in (("vocab", vocab), ("n", n), ("d", d)):
            check_count(value, name)
        g = torch.Generator().manual_seed(seed)
        self.word_emb = _init(g, vocab, d, std=1.0)
        self.source_pos = _init(g, n, d, std=1.0)
        self.target_pos = _init(g, n, d, std=1.0)             # the queries
        self.W_K = _init(g, d, d, std=1 / math.sqrt(d))
        self.W_V = _init(g, d, d, std=1 / math.sqrt(d))
        if score == "additive":
            self.W_a = _init(g, d, d, std=1 / math.sqrt(d))
            self.U_a = _init(g, d, d, std=1 / math.sqrt(d))
            self.w_a = _init(g, d, std=1 / math.sqrt(d))
        self.W_O = _init(g, d, vocab, std=1 / math.sqrt(d))
        self.b_O = nn.Parameter(torch.zeros(vocab))
        self.score, self.d = score, d

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """q (n_t, d), k (B, n_s, d) -> scores (B, n_t, n_s)."""
        if self.score == "dot":
            return q @ k.transpose(-2, -1) / math.sqrt(self.d)              # one matmul
        hidden = torch.tanh((q @ self.W_a)[:, None, :] + (k @ self.U_a)[:, None, :, :])
        return hidden @ self.w_a                                # hidden: (B, n_t, n_s, d)

    def forward(self, source_ids):
        n = source_ids.shape[-1]
        x = self.word_emb[source_ids] + self.source_pos[:n]                 # (B, n_s, d)
        k, v = x @ self.W_K, x @ self.W_V                                   # (B, n_s, d)
        weights = torch.softmax(self.scores(self.target_pos[:n], k), -1)   # (B, n_t, n_s)
        return weights @ v @ self.W_O + self.b_O, weights                   # (B, n_t, vocab)


# --- chapter 02 (built inline there), chapter 07: attend to your predecessor ---------------------


def predecessor_batch(generator: torch.Generator, size: int = 32, vocab: int = 50, n: int = 6):
    """Chapter 02's predecessor task: `n` random words on a circle starting at a random place.

    Returns `((word_ids, places), target)`, all (size, n); target[:, i] = (i - 1) % n, the index
    of the token before token i (the first token's predecessor is the last).
    """
    for name, value in (("size", size), ("vocab", vocab), ("n", n)):
        check_count(value, name)
    word_ids = torch.randint(vocab, (size, n), generator=generator)                       # (B, n)
    places = (torch.randint(n, (size, 1), generator=generator) + torch.arange(n)) % n     # (B, n)
    return (word_ids, places), ((torch.arange(n) - 1) % n).expand(size, n)


class PredecessorScores(nn.Module):
    """Chapter 02's `ScoreModel`: word (+ place) embeddings, scores (x W_Q)(x W_K)^T / sqrt(d_k).

    The score row of query i is its logits over the keys (cross-entropy against its predecessor).
    tied: W_K is W_Q (the scores are symmetric). places: add a learned embedding of each token's
    place on the circle (False: x is the word embedding alone, so nothing says where a token is).
    With the defaults it is chapter 02's inline model, parameter for parameter.
    """

    def __init__(self, tied: bool = False, places: bool = True, vocab: int = 50, n: int = 6,
                 d_x: int = 16, d_k: int = 16, seed: int = 1):
        super().__init__()
        for name, value in (("vocab", vocab), ("n", n), ("d_x", d_x), ("d_k", d_k)):
            check_count(value, name)
        g = torch.Generator().manual_seed(seed)
        self.emb = _init(g, vocab, d_x, std=0.5)                         # word embeddings
        pos = _init(g, n, d_x, std=0.5)                                  # drawn either way, so the
        self.pos = pos if places else None                               # other weights match
        self.W_Q = _init(g, d_x, d_k, std=1 / math.sqrt(d_x))
        self.W_K = self.W_Q if tied else _init(g, d_x, d_k, std=1 / math.sqrt(d_x))
        self.d_k = d_k

    def forward(self, batch):
        word_ids, places = batch                                         # (B, n), (B, n)
        x = self.emb[word_ids]                                           # (B, n, d_x)
        if self.pos is not None:
            x = x + self.pos[places]
        return (x @ self.W_Q) @ (x @ self.W_K).transpose(-2, -1) / math.sqrt(self.d_k)  # (B, n, n)
