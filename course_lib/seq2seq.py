"""Chapter 06: cross-attention, where attention began: an encoder-decoder that translates.

Attention was first built for translation (Bahdanau, Cho and Bengio, 2015). An encoder RNN reads
the source sentence; a decoder RNN writes the target one word at a time. Without attention the
decoder starts from the encoder's last state and sees nothing else: the whole sentence has to fit
in one running summary. With attention it also looks back at every encoder state at every step:

    weights_ij = softmax_j(score(s_i, h_j))        context_i = sum_j weights_ij h_j

with the decoder state s_i as the query and the encoder states h_j as keys and values. Two scores:
Bahdanau's additive one, vᵀ tanh(W s_i + U h_j), and the scaled dot product of chapter 03,
(s_i W_q)·(h_j W_k)/√d.

The task is a toy translation whose word order differs from the source's, so the alignment
crosses: adjectives move behind their noun, the verb to the very end,

    the big red dog sees a cat and the fox   ->   THE DOG BIG RED A CAT AND THE FOX SEES

and sentences come in lengths 5 to 24 words (1 to 4 objects), so accuracy can be drawn against
the source length, as in Bahdanau et al.'s Figure 2. The sweep (no attention, additive, dot
product; several seeds and budgets) takes minutes on a CPU, so its seeded record ships in
`course_lib/data/ch06_seq2seq.json`, written by

    python -m course_lib.seq2seq                  # the recorded sweep (one CPU thread)
    python -m course_lib.seq2seq --steps 2 --seeds 0 --out DIR   # a short version (the test)

and the lecture trains one of its runs again live.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import time
from pathlib import Path

import torch
import torch.nn as nn

from course_lib.attention import scaled_dot_product_attention, softmax
from course_lib.masks import apply_mask
from course_lib.measure import threads
from course_lib.train import IGNORE_INDEX, train
from course_lib.validate import check_choice, check_count, check_token_ids, shape_of, wrong_shape

# ---------------------------------------------------------------- the toy language and its rule
DETERMINERS = ("the", "a")
ADJECTIVES = ("big", "small", "red", "blue", "old", "young", "happy", "sad")
NOUNS = ("dog", "cat", "bird", "fish", "fox", "cow", "bee", "owl")
VERBS = ("sees", "likes", "finds", "hears")
AND = "and"
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
WORDS = DETERMINERS + ADJECTIVES + NOUNS + VERBS + (AND,)
SOURCE_VOCAB = (PAD,) + WORDS                                  # source ids; 0 is padding
TARGET_VOCAB = (PAD, BOS, EOS) + tuple(w.upper() for w in WORDS)
_SOURCE_ID = {w: i for i, w in enumerate(SOURCE_VOCAB)}
_TARGET_ID = {w: i for i, w in enumerate(TARGET_VOCAB)}
_TAG = {**{w: "D" for w in DETERMINERS}, **{w: "A" for w in ADJECTIVES},
        **{w: "N" for w in NOUNS}, **{w: "V" for w in VERBS}, AND: "C"}
_GRAMMAR = re.compile(r"DA*NVDA*N(CDA*N)*")  # subject, verb, objects joined by "and"

MAX_OBJECTS, MAX_ADJECTIVES = 4, 2


def alignment(words: list[str]) -> list[int]:
    """Which source word each target word translates: target[i] = words[alignment[i]].upper().

    The rule: every noun phrase "det adj* noun" becomes "DET NOUN ADJ*" (the adjectives follow
    their noun, in order), "and" stays where it is, and the verb goes to the end of the sentence.
    """
    tags = "".join(_TAG.get(w, "?") for w in words)
    if not _GRAMMAR.fullmatch(tags):
        raise ValueError(f"words must form a sentence 'det adj* noun verb det adj* noun "
                         f"(and det adj* noun)*' of the toy language, got {' '.join(words)!r}")
    order, phrase, verb = [], [], 0
    for j, tag in enumerate(tags):
        if tag in "DA":
            phrase.append(j)                         # the determiner, then any adjectives
        elif tag == "N":
            order += [phrase[0], j] + phrase[1:]     # DET NOUN ADJ*
            phrase = []
        elif tag == "V":
            verb = j
        else:
            order.append(j)                          # "and"
    return order + [verb]


def translate_words(words: list[str]) -> list[str]:
    """The reference translation of a source sentence (a list of words), by the rule above."""
    return [words[j].upper() for j in alignment(words)]


def sentences(generator: torch.Generator, count: int, max_objects: int = MAX_OBJECTS,
              max_adjectives: int = MAX_ADJECTIVES, objects: int | None = None) -> list[list[str]]:
    """`count` random source sentences: a subject, a verb and 1..max_objects objects (or exactly
    `objects`), each noun phrase with 0..max_adjectives adjectives, drawn from `generator`."""
    count = check_count(count, "count")
    max_objects = check_count(max_objects, "max_objects")
    max_adjectives = check_count(max_adjectives, "max_adjectives", minimum=0)
    if objects is not None and not 1 <= check_count(objects, "objects") <= max_objects:
        raise ValueError(f"objects must lie in 1..max_objects={max_objects}, got {objects}")
    g, phrases = generator, 1 + max_objects
    n_objects = (torch.randint(1, max_objects + 1, (count,), generator=g) if objects is None
                 else torch.full((count,), objects)).tolist()
    n_adjectives = torch.randint(0, max_adjectives + 1, (count, phrases), generator=g).tolist()
    dets = torch.randint(0, len(DETERMINERS), (count, phrases), generator=g).tolist()
    adjs = torch.randint(0, len(ADJECTIVES), (count, phrases, max(max_adjectives, 1)),
                         generator=g).tolist()
    nouns = torch.randint(0, len(NOUNS), (count, phrases), generator=g).tolist()
    verbs = torch.randint(0, len(VERBS), (count,), generator=g).tolist()
    out = []
    for b in range(count):
        phrases = [[DETERMINERS[dets[b][p]]]
                   + [ADJECTIVES[a] for a in adjs[b][p][:n_adjectives[b][p]]]
                   + [NOUNS[nouns[b][p]]] for p in range(n_objects[b] + 1)]
        words = phrases[0] + [VERBS[verbs[b]]] + phrases[1]
        for phrase in phrases[2:]:
            words += [AND] + phrase
        out.append(words)
    return out


def encode(batch_of_sentences: list[list[str]]):
    """Token ids for training: ((source, target_in), target_out), right-padded.

    source (B, n): source ids, 0 = padding. target_in (B, m): <bos> then the translation (what
    the decoder has already written); target_out (B, m): the translation then <eos>, -100 on
    padding (not scored). m = the longest translation + 1.
    """
    if not batch_of_sentences:
        raise ValueError("batch_of_sentences must hold at least one sentence, got none")
    targets = [[_TARGET_ID[w] for w in translate_words(s)] for s in batch_of_sentences]
    count = len(batch_of_sentences)
    n = max(len(s) for s in batch_of_sentences)
    m = max(len(t) for t in targets) + 1
    source = torch.zeros(count, n, dtype=torch.long)
    target_in = torch.zeros(count, m, dtype=torch.long)
    target_out = torch.full((count, m), IGNORE_INDEX, dtype=torch.long)
    for b, (words, ids) in enumerate(zip(batch_of_sentences, targets)):
        source[b, :len(words)] = torch.tensor([_SOURCE_ID[w] for w in words])
        target_in[b, :len(ids) + 1] = torch.tensor([_TARGET_ID[BOS]] + ids)
        target_out[b, :len(ids) + 1] = torch.tensor(ids + [_TARGET_ID[EOS]])
    return (source, target_in), target_out


def translation_batch(generator: torch.Generator, batch: int = 64, max_objects: int = MAX_OBJECTS,
                      max_adjectives: int = MAX_ADJECTIVES):
    """A training batch for `course_lib.train.train`: encode(sentences(generator, batch, ...))."""
    return encode(sentences(generator, batch, max_objects, max_adjectives))


# ---------------------------------------------------------------- cross-attention
class CrossAttention(nn.Module):
    """The decoder looks back at the encoder: each query (a decoder state s_i) scores every key
    (an encoder state h_j), the scores become weights over the source, and the context is the
    weighted blend of the encoder states themselves.

    score="dot":      (s_i W_qᵀ)·(h_j W_kᵀ) / √d_attn     (chapter 03's scaled dot product)
    score="additive": vᵀ tanh(W s_i + U h_j + b)          (Bahdanau et al. 2015)

    forward(query (B, m, d_query), keys (B, n, d_key), key_mask (B, n) bool, True = a real
    source word) -> (context (B, m, d_key), weights (B, m, n)); weights are 0 on padding.
    """

    def __init__(self, d_query: int, d_key: int, d_attn: int | None = None, score: str = "dot"):
        super().__init__()
        self.d_query, self.d_key = check_count(d_query, "d_query"), check_count(d_key, "d_key")
        d_attn = d_key if d_attn is None else check_count(d_attn, "d_attn")
        self.score = check_choice(score, "score", ("dot", "additive"))
        if score == "dot":
            self.W_q = nn.Linear(d_query, d_attn, bias=False)
            self.W_k = nn.Linear(d_key, d_attn, bias=False)
        else:
            self.W = nn.Linear(d_query, d_attn, bias=False)
            self.U = nn.Linear(d_key, d_attn)
            self.v = nn.Linear(d_attn, 1, bias=False)

    def _check(self, query, keys, key_mask) -> None:
        if not isinstance(query, torch.Tensor) or query.dim() != 3 \
                or query.shape[-1] != self.d_query:
            raise wrong_shape("query", query, f"(batch, m, d_query={self.d_query})")
        if not isinstance(keys, torch.Tensor) or keys.dim() != 3 or keys.shape[-1] != self.d_key \
                or keys.shape[0] != query.shape[0]:
            raise wrong_shape("keys", keys, f"(batch={query.shape[0]}, n, d_key={self.d_key})")
        if key_mask is not None and (not isinstance(key_mask, torch.Tensor)
                                     or key_mask.dtype != torch.bool
                                     or key_mask.shape != keys.shape[:2]):
            raise ValueError(f"key_mask must be a bool tensor of shape {tuple(keys.shape[:2])} "
                             f"(batch, n) like keys {tuple(keys.shape)}, got "
                             f"{getattr(key_mask, 'dtype', type(key_mask).__name__)} of shape "
                             f"{shape_of(key_mask)}")

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores (B, m, n) of every query against every key."""
        if self.score == "dot":
            q, k = self.W_q(query), self.W_k(keys)                 # (B, m, d_attn), (B, n, d_attn)
            return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, m, n)
        mixed = self.W(query)[:, :, None, :] + self.U(keys)[:, None, :, :]  # (B, m, n, d_attn)
        return self.v(torch.tanh(mixed)).squeeze(-1)                        # (B, m, n)

    def forward(self, query: torch.Tensor, keys: torch.Tensor,
                key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(query, keys, key_mask)
        mask = None if key_mask is None else key_mask[:, None, :]   # (B, 1, n): over queries
        if self.score == "dot":   # chapter 02-04's function, values = the encoder states
            return scaled_dot_product_attention(self.W_q(query), self.W_k(keys), keys, mask=mask)
        weights = softmax(apply_mask(self.scores(query, keys), mask), dim=-1)  # (B, m, n)
        return weights @ keys, weights                                        # (B, m, d_key)


# ---------------------------------------------------------------- the encoder-decoder
class Seq2Seq(nn.Module):
    """A GRU encoder and a GRU decoder (Cho et al. 2014), with or without cross-attention.

    attention=None: the decoder starts from the encoder's last state and sees nothing else of
    the source (Bahdanau et al.'s "RNNenc"). attention="dot" or "additive": the same network,
    and after each decoder step the state s_i also looks back at every encoder state; the
    output reads [s_i; context_i]. (The query is the state after the step, as in Luong et al.
    2015, so training runs the decoder over the whole target in one call; Bahdanau et al.
    fed the context into the next step instead.)

    forward((source (B, n), target_in (B, m))) -> (logits (B, m, target vocab),
    weights (B, m, n) or None).
    """

    def __init__(self, d_hidden: int = 64, d_embed: int = 32, attention: str | None = None):
        super().__init__()
        self.attention = check_choice(attention, "attention", (None, "dot", "additive"))
        d_hidden, d_embed = check_count(d_hidden, "d_hidden"), check_count(d_embed, "d_embed")
        self.embed_source = nn.Embedding(len(SOURCE_VOCAB), d_embed, padding_idx=0)
        self.embed_target = nn.Embedding(len(TARGET_VOCAB), d_embed)
        self.encoder = nn.GRU(d_embed, d_hidden, batch_first=True)
        self.decoder = nn.GRU(d_embed, d_hidden, batch_first=True)
        self.cross = None if attention is None else CrossAttention(d_hidden, d_hidden,
                                                                   score=attention)
        self.combine = nn.Linear(2 * d_hidden, d_hidden)   # reads [s_i; context_i]
        self.readout = nn.Linear(d_hidden, len(TARGET_VOCAB))

    def encode(self, source: torch.Tensor):
        """Encoder states H (B, n, d), the last real state of each sentence (1, B, d), the mask.
        """
        source = check_token_ids(source, len(SOURCE_VOCAB), "source")
        mask = source != 0                                             # (B, n) real words
        lengths = mask.sum(1)
        if (lengths == 0).any() or (mask[:, 1:] & ~mask[:, :-1]).any():
            raise ValueError(f"source of shape {tuple(source.shape)} must hold right-padded "
                             "sentences: at least one word, then padding (id 0) only at the end")
        states, _ = self.encoder(self.embed_source(source))            # (B, n, d)
        last = states[torch.arange(len(source)), lengths - 1][None]    # (1, B, d): after the end
        return states, last, mask

    def _read(self, s, states, last, mask):
        if self.cross is None:   # the same context at every step: the encoder's last state
            context, weights = last.transpose(0, 1).expand_as(s), None  # (B, m, d)
        else:                    # a fresh blend of all encoder states at every step
            context, weights = self.cross(s, states, mask)             # (B, m, d), (B, m, n)
        return self.readout(torch.tanh(self.combine(torch.cat([s, context], -1)))), weights

    def forward(self, inputs):
        source, target_in = inputs
        target_in = check_token_ids(target_in, len(TARGET_VOCAB), "target_in")
        if len(target_in) != len(source):
            raise ValueError(f"source has batch {shape_of(source)[:1]} but target_in has "
                             f"{tuple(target_in.shape[:1])}: one translation per sentence")
        states, last, mask = self.encode(source)
        s, _ = self.decoder(self.embed_target(target_in), last)       # (B, m, d), teacher forcing
        return self._read(s, states, last, mask)

    @torch.no_grad()
    def translate(self, source: torch.Tensor, steps: int):
        """Greedy decoding for `steps` words: (tokens (B, steps), weights (B, steps, n) or None).
        """
        steps = check_count(steps, "steps")
        states, last, mask = self.encode(source)
        h = last
        y = torch.full((len(source), 1), _TARGET_ID[BOS])
        tokens, weights = [], []
        for _ in range(steps):               # one word at a time: each needs the one before
            s, h = self.decoder(self.embed_target(y), h)               # (B, 1, d)
            logits, w = self._read(s, states, last, mask)
            y = logits.argmax(-1)                                      # (B, 1)
            tokens.append(y)
            weights.append(w)
        return torch.cat(tokens, 1), None if self.cross is None else torch.cat(weights, 1)


# ---------------------------------------------------------------- measuring it
LENGTH_BINS = ((5, 8), (9, 12), (13, 16), (17, 20), (21, 24))   # source lengths, in words
TEST_SEED, TEST_SIZE = 99, 2000


def test_sentences(size: int = TEST_SIZE, seed: int = TEST_SEED) -> list[list[str]]:
    """The fixed test set every record is scored on."""
    return sentences(torch.Generator().manual_seed(seed), size)


@torch.no_grad()
def score(model: Seq2Seq, batch_of_sentences: list[list[str]]) -> dict:
    """Greedy translations scored against the reference, per length bin of the source.

    word_accuracy: the fraction of the reference's words (and its <eos>) that the model writes at
    the right place; sentence_accuracy: the fraction of sentences entirely right; on_source_word:
    the fraction of target words whose largest attention weight falls on the source word they
    translate (None without attention). Lists run over LENGTH_BINS; `where_it_looks` (over the
    whole batch, None without attention) says where the decoder looks for each kind of word.
    """
    model.eval()
    (source, _), target_out = encode(batch_of_sentences)
    tokens, weights = model.translate(source, target_out.shape[1])
    keep = target_out != IGNORE_INDEX                                   # (B, m)
    right = (tokens == target_out) & keep
    words = keep.sum(1)
    per_sentence = right.sum(1) / words                                 # (B,)
    whole = right.sum(1) == words
    on_word = looks = None
    if weights is not None:
        looked = weights.argmax(-1).tolist()                            # (B, m) source positions
        on_word = torch.tensor([sum(looked[b][i] == j for i, j in enumerate(alignment(s)))
                                / len(s) for b, s in enumerate(batch_of_sentences)])
        looks = where_it_looks(weights, batch_of_sentences)
    lengths = (source != 0).sum(1)
    out = {"bins": [list(b) for b in LENGTH_BINS], "count": [], "word_accuracy": [],
           "sentence_accuracy": [], "on_source_word": None if on_word is None else []}
    for lo, hi in LENGTH_BINS:
        sel = (lengths >= lo) & (lengths <= hi)
        out["count"].append(int(sel.sum()))
        out["word_accuracy"].append(round(float(per_sentence[sel].mean()), 4))
        out["sentence_accuracy"].append(round(float(whole[sel].float().mean()), 4))
        if on_word is not None:
            out["on_source_word"].append(round(float(on_word[sel].mean()), 4))
    out["where_it_looks"] = looks
    return out


ROLES = {"D": "determiner", "A": "adjective", "N": "noun", "C": "and", "V": "verb"}


def where_it_looks(weights: torch.Tensor, batch_of_sentences: list[list[str]]) -> dict:
    """Where the decoder looks while writing each kind of word, over a batch of translations.

    weights: (B, m, n) cross-attention weights of the decoder steps that write the reference
    translation (m >= its length). Returns `on_own_word`, per role (determiner, adjective, noun,
    and, verb), the fraction of target words whose largest weight falls on the source word they
    translate, and `verb_weight`, the verb's mean weight on its own source word, on the words
    before it and on the words after it.
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() != 3 \
            or len(weights) != len(batch_of_sentences):
        raise wrong_shape("weights", weights, f"(batch={len(batch_of_sentences)}, m, n)")
    looked = weights.argmax(-1).tolist()                                # (B, m)
    hits: dict[str, list[bool]] = {role: [] for role in ROLES.values()}
    verb = {"on_itself": 0.0, "before": 0.0, "after": 0.0}
    for b, words in enumerate(batch_of_sentences):
        for i, j in enumerate(alignment(words)):
            hits[ROLES[_TAG[words[j]]]].append(looked[b][i] == j)
        i, j = len(words) - 1, next(j for j, w in enumerate(words) if w in VERBS)  # verb: last
        row = weights[b, i]                                             # (n,)
        verb["on_itself"] += float(row[j])
        verb["before"] += float(row[:j].sum())
        verb["after"] += float(row[j + 1:].sum())
    count = len(batch_of_sentences)
    return {"on_own_word": {role: round(sum(h) / len(h), 4) for role, h in hits.items()},
            "verb_weight": {key: round(value / count, 4) for key, value in verb.items()}}


# ---------------------------------------------------------------- the recorded sweep
SPEC = {"task": {"max_objects": MAX_OBJECTS, "max_adjectives": MAX_ADJECTIVES},
        "model": {"d_hidden": 64, "d_embed": 32}, "batch": 64, "lr": 1e-2,
        "test": {"seed": TEST_SEED, "size": TEST_SIZE}}
ATTENTIONS = (None, "additive", "dot")
SEEDS = (0, 1, 2)
STEPS = (150, 1500)      # a short budget (the lecture retrains one) and a ten times longer one
LIVE = {"attention": "dot", "seed": 0, "steps": STEPS[0]}   # the run chapter 06 trains again
DATA = Path(__file__).resolve().parent / "data"
RECORD = DATA / "ch06_seq2seq.json"
COMMAND = "python -m course_lib.seq2seq"


def train_translator(attention: str | None, seed: int = 0, steps: int = STEPS[0],
                     spec: dict = SPEC) -> tuple[Seq2Seq, list[float]]:
    """Train one encoder-decoder from the spec, seeded; return (model, per-step losses)."""
    torch.manual_seed(seed)
    model = Seq2Seq(**spec["model"], attention=attention)

    def batch_fn(generator):
        return translation_batch(generator, spec["batch"], **spec["task"])

    history = train(model, batch_fn, steps=steps, lr=spec["lr"], seed=seed, progress=False)
    return model, history.loss


def run(attention: str | None, seed: int, steps: int, test=None) -> dict:
    """One row of the record: train, then score on the test set."""
    test = test_sentences() if test is None else test
    start = time.process_time()
    with threads(1):
        model, losses = train_translator(attention, seed, steps)
        seconds = time.process_time() - start
        result = score(model, test)
    return {"attention": attention or "none", "seed": seed, "steps": steps,
            "cpu_seconds": round(seconds, 1), "final_loss": round(sum(losses[-20:]) / 20, 4),
            **result}


def record(path: Path = RECORD) -> dict:
    """The shipped record, or FileNotFoundError naming the command that makes it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: make it with `{COMMAND}`")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=list(STEPS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--test-size", type=int, default=TEST_SIZE)
    parser.add_argument("--out", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    test = test_sentences(args.test_size)
    runs = []
    for steps in args.steps:
        for attention in ATTENTIONS:
            for seed in args.seeds:
                runs.append(run(attention, seed, steps, test))
                r = runs[-1]
                print(f"{r['attention']:>8} seed {seed} {steps:>5} steps {r['cpu_seconds']:>6} s "
                      f"word accuracy by length {r['word_accuracy']}", flush=True)
    made_with = {"torch": torch.__version__, "python": platform.python_version(), "threads": 1,
                 "device": "cpu"}
    out = {"command": COMMAND, "spec": SPEC, "steps": args.steps, "seeds": args.seeds,
           "test_size": args.test_size, "made_with": made_with, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
