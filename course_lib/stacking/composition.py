"""Query composition: a layer-1 QUERY that asks about what layer 0 found, and how to tell it
from key composition by patching.

Induction (`induction.py`) is key composition: layer 0 writes "the token before me" into each
key's stream, and layer 1's query is still "I am D". Chapter 06's question-first recall,

    [Q_k, x_1 .. x_16, ?]  ->  x_{17-k}        (the token k places before `?`)

looks like it needs the query side: one layer's query of `?` is the same in every sequence. Two
layers solve it, but `patch_queries_keys` shows they do it with the KEYS: every x_j comes after
Q_k, reads k in layer 0, and with rotary positions a key that knows k can be found k places back
by a query that does not (q.k depends on k through either side). `question_middle_batch` takes
that route away: the question stands among the tokens AFTER the asked one, so no key of the
asked token can have read it, and Q_k cannot fetch the answer itself (it does not know where
`?` is). Then layer 0 must bring k to `?`, and patching finds the improvement in the queries.

`patch_queries_keys` runs block `layer` with its queries, or its keys, computed from a stream
where block 0's attention was switched off, and everything else as trained.

The trained models are shipped (`course_lib/data/ch10_composition_<name>.pt` and `.json`);
remake them, one CPU thread, seeded (``--quick``: a few steps each, into --out):

    python -m course_lib.stacking.composition [--quick] [--out DIR] [NAME ...]
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn

from course_lib.masks import causal_mask
from course_lib.models import TinyTransformer
from course_lib.models.recall import recall_batch
from course_lib.stacking import shipped
from course_lib.stacking.induction import ablate_head
from course_lib.stacking.shipped import DATA, QUICK_STEPS
from course_lib.train import IGNORE_INDEX, accuracy, train
from course_lib.validate import check_choice

TASK = {"n": 16, "vocab": 8}  # chapter 06's recall task: 16 tokens of a vocabulary of 8
VOCAB_SIZE = TASK["vocab"] + TASK["n"] + 1  # 8 tokens, 16 questions Q_k, and `?` (id 8)
_MODEL = {"vocab_size": VOCAB_SIZE, "d_model": 32, "num_heads": 4, "max_len": TASK["n"] + 2}
STEPS = 1000

SPECS: dict[str, dict] = {
    "2layer": {"task": "first", "model_args": {**_MODEL, "num_layers": 2}, "steps": STEPS},
    "1layer": {"task": "first", "model_args": {**_MODEL, "num_layers": 1}, "steps": STEPS},
    # one block with as many parameters and heads as the two-layer model, trained 10x longer
    "1layer_wide": {"task": "first", "model_args": {**_MODEL, "d_model": 48, "num_heads": 8,
                                                    "num_layers": 1, "d_mlp": 154},
                    "steps": 10 * STEPS},
    # the question among the tokens, after the asked one (Q_2 .. Q_17: one more token id)
    "middle_2layer": {"task": "middle", "model_args": {**_MODEL, "vocab_size": VOCAB_SIZE + 1,
                                                       "num_layers": 2}, "steps": 3 * STEPS},
    "middle_1layer": {"task": "middle", "model_args": {**_MODEL, "vocab_size": VOCAB_SIZE + 1,
                                                       "num_layers": 1}, "steps": 3 * STEPS},
}
COMMON = {"batch": 64, "lr": 3e-3, "seed": 0, "test_seed": 99, "test_batch": 2000}
PATCHES = ("none", "queries", "keys", "both")


# ------------------------------------------------------------------ the task

def question_first_batch(generator: torch.Generator, batch: int = 64, n: int = TASK["n"],
                         vocab: int = TASK["vocab"]) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 06's recall with the question first: tokens [Q_k, x_1 .. x_n, ?] (batch, n + 2)
    and targets (batch, n + 2), -100 except at `?`, whose target is x_{n+1-k}, the token k
    places before `?` (k uniform in 1..n). Q_k is token vocab + k, `?` is token vocab."""
    tokens, targets = recall_batch(generator, batch, n=n, vocab=vocab)  # [x_1 .. x_n, Q_k]
    answer_now = torch.full((batch, 1), vocab)  # the `?` token
    tokens = torch.cat([tokens[:, -1:], tokens[:, :-1], answer_now], dim=1)  # (B, n + 2)
    targets = torch.cat([targets[:, :1], targets], dim=1)  # (B, n + 2): the answer at `?`
    return tokens, targets


def question_middle_batch(generator: torch.Generator, batch: int = 64, n: int = TASK["n"],
                          vocab: int = TASK["vocab"]) -> tuple[torch.Tensor, torch.Tensor]:
    """The question among the tokens, AFTER the one it asks for: n tokens x with Q_k inserted
    at a random place, then `?`, whose target is the token k places before it (k uniform in
    2..n+1). No key of the asked token can have read Q_k (it comes later), and Q_k cannot
    fetch the answer itself (it does not know how far `?` is). (batch, n + 2) each.
    """
    x = torch.randint(0, vocab, (batch, n), generator=generator)  # (B, n)
    k = torch.randint(2, n + 2, (batch,), generator=generator)  # (B,)
    first = n + 2 - k  # (B,): the first column after the asked one, k places before `?`
    at = first + (torch.rand(batch, generator=generator) * (n + 1 - first)).long()  # Q's column
    col = torch.arange(n + 1)  # the columns before `?`
    body = x.gather(1, torch.where(col < at[:, None], col, col - 1).clamp(min=0))  # (B, n + 1)
    body = torch.where(col == at[:, None], (vocab + k)[:, None], body)  # Q_k at its column
    tokens = torch.cat([body, torch.full((batch, 1), vocab)], dim=1)  # (B, n + 2)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, -1] = body[torch.arange(batch), n + 1 - k]  # the token k places before `?`
    return tokens, targets


BATCHES = {"first": question_first_batch, "middle": question_middle_batch}


def asked_position(tokens: torch.Tensor, vocab: int = TASK["vocab"]) -> torch.Tensor:
    """(B,): where the asked token stands: k places before `?` (Q_k is token vocab + k)."""
    k = tokens.max(dim=1).values - vocab
    return (tokens == vocab).int().argmax(dim=1) - k


@torch.no_grad()
def accuracy_by_k(model: nn.Module, tokens: torch.Tensor,
                  targets: torch.Tensor) -> dict[int, float]:
    """Accuracy at `?` for each distance k asked about in a question-first batch."""
    model.eval()
    at = (tokens == TASK["vocab"]).int().argmax(dim=1)  # (B,): the column of `?`
    rows = torch.arange(len(tokens))
    correct = model(tokens)[rows, at].argmax(-1) == targets[rows, at]  # (B,)
    k = tokens.max(dim=1).values - TASK["vocab"]
    return {int(d): float(correct[k == d].float().mean()) for d in torch.unique(k)}


def test_batch(task: str = "first") -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed test batch every record is scored on: 2000 sequences drawn with seed 99
    (for "first", chapter 06's own test sequences)."""
    check_choice(task, "task", sorted(BATCHES))
    return BATCHES[task](torch.Generator().manual_seed(COMMON["test_seed"]),
                         COMMON["test_batch"])


# ------------------------------------------------------------------ patching queries and keys

@torch.no_grad()
def stream_before(model: TinyTransformer, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """The residual stream entering block `layer`: (B, n, d_model), positions 0..n-1."""
    mask, positions = causal_mask(tokens.shape[1], device=tokens.device), _positions(tokens)
    x = model.embed(tokens)  # (B, n, d)
    for block in model.blocks[:layer]:
        x = block(x, mask, positions=positions)
    return x


@torch.no_grad()
def patch_queries_keys(model: TinyTransformer, tokens: torch.Tensor, ablated: torch.Tensor,
                       layer: int = 1, patch: str = "none"):
    """Logits (B, n, vocab) and block `layer`'s weights (B, heads, n, n) when its attention
    takes its queries ("queries"), its keys ("keys") or both ("both") from the `ablated`
    stream (B, n, d_model) instead of the model's own; "none" is the model as it is.

    Values, the residual addition and every other block read the model's own (clean) stream,
    so only WHERE block `layer` looks can change: the side whose patch breaks the answer is the
    side that carries what the earlier blocks found.
    """
    check_choice(patch, "patch", PATCHES)
    if not 0 <= layer < len(model.blocks):
        raise ValueError(f"layer should be in 0..{len(model.blocks) - 1}, got {layer!r}")
    clean = stream_before(model, tokens, layer)  # (B, n, d)
    if ablated.shape != clean.shape:
        raise ValueError(f"ablated has shape {tuple(ablated.shape)}, wanted the stream's "
                         f"{tuple(clean.shape)} (batch, n, d_model)")
    mask, positions = causal_mask(tokens.shape[1], device=tokens.device), _positions(tokens)
    block = model.blocks[layer]
    q_in = block.ln1(ablated if patch in ("queries", "both") else clean)  # (B, n, d)
    k_in = block.ln1(ablated if patch in ("keys", "both") else clean)  # (B, n, d)
    attended, weights = block.attn(q_in, k_in, block.ln1(clean), mask=mask, positions=positions)
    x = clean + attended  # (B, n, d)
    x = x + block.mlp(block.ln2(x))
    for later in model.blocks[layer + 1:]:
        x = later(x, mask, positions=positions)
    return model.lm_head(model.ln_f(x)), weights  # (B, n, vocab), (B, heads, n, n)


@torch.no_grad()
def patching_table(model: TinyTransformer, tokens: torch.Tensor, targets: torch.Tensor,
                   answer_at: torch.Tensor, layer: int = 1) -> dict[str, dict[str, float]]:
    """For each patch of block `layer` (with block 0's attention switched off in the ablated
    stream): the accuracy, and the mean weight block `layer`'s best head puts on the position
    the answer is read from, over the scored queries. answer_at: (B, n), -1 where unscored.
    Also "ablated": the whole model with block 0's attention off (every later input ablated).
    """
    model.eval()
    heads = list(range(model.blocks[0].attn.num_heads))
    with ablate_head(model, 0, heads):
        ablated = stream_before(model, tokens, layer)  # (B, n, d): layer 0 attended to nothing
        whole = accuracy(model(tokens), targets)
    scored = answer_at >= 0  # (B, n)
    table = {}
    for patch in PATCHES:
        logits, weights = patch_queries_keys(model, tokens, ablated, layer, patch)
        index = answer_at.clamp(min=0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1)
        on_answer = weights.gather(3, index)[..., 0].transpose(0, 1)[:, scored]  # (heads, m)
        table[patch] = {"accuracy": accuracy(logits, targets),
                        "weight_on_answer": float(on_answer.mean(dim=1).max())}
    table["ablated"] = {"accuracy": whole}
    return table


def recall_answer_at(tokens: torch.Tensor) -> torch.Tensor:
    """(B, n): for the question-first task, the asked position at `?`, -1 elsewhere."""
    at = torch.full_like(tokens, -1)
    at[:, -1] = asked_position(tokens)
    return at


def _positions(tokens: torch.Tensor) -> torch.Tensor:
    return torch.arange(tokens.shape[1], device=tokens.device)


# ------------------------------------------------------------------ the shipped models

def build(name: str) -> TinyTransformer:
    """The untrained model `name` (one of `SPECS`)."""
    check_choice(name, "name", sorted(SPECS))
    return TinyTransformer(**SPECS[name]["model_args"])


def make(name: str, quick: bool = False, progress: bool = True,
         seed: int = COMMON["seed"]) -> tuple[TinyTransformer, dict]:
    """Train model `name` from its spec (one thread, seeded); return (model, record)."""
    spec = {**copy.deepcopy(SPECS[name]), **COMMON, "seed": seed}
    steps = QUICK_STEPS if quick else spec["steps"]
    torch.manual_seed(seed)
    model = build(name)
    start = time.perf_counter()
    batches = BATCHES[spec["task"]]
    history = train(model, lambda g: batches(g, spec["batch"]), steps=steps, lr=spec["lr"],
                    seed=seed, progress=progress, desc=name)
    tokens, targets = test_batch(spec["task"])
    model.eval()
    with torch.no_grad():
        test_accuracy = accuracy(model(tokens), targets)
    record = {"name": name, "spec": spec, "steps_done": steps,
              "final_loss": round(history.smoothed("loss", 100)[-1], 4),
              "curve": {"every": 100, "accuracy": [round(a, 3) for a in
                                                   history.smoothed("accuracy", 100)[99::100]]},
              "test_accuracy": round(test_accuracy, 4),
              "parameters": model.num_parameters(),
              "seconds": round(time.perf_counter() - start, 1),
              "made_with": shipped.made_with(),
              "command": f"python -m course_lib.stacking.composition {name}"}
    return model, record


def save(model: nn.Module, record: dict, folder: Path = DATA) -> Path:
    return shipped.save(model, record, folder, f"ch10_composition_{record['name']}")


def record(name: str, folder: Path = DATA) -> dict:
    """The JSON record shipped with model `name`."""
    check_choice(name, "name", sorted(SPECS))
    return shipped.read_record(folder, f"ch10_composition_{name}",
                               f"python -m course_lib.stacking.composition {name}")


def load(name: str, folder: Path = DATA) -> TinyTransformer:
    """Model `name` with its shipped weights, in eval mode."""
    record(name, folder)  # a clear error if it is missing
    return shipped.load_weights(build(name), folder, f"ch10_composition_{name}")


def main(argv: list[str] | None = None) -> int:
    args = shipped.parse(shipped.parser(__name__, __doc__, SPECS), argv, SPECS)
    for name in args.names:
        model, rec = make(name, quick=args.quick, progress=sys.stderr.isatty())
        path = save(model, rec, args.out)
        print(f"{name}: {rec['steps_done']} steps in {rec['seconds']} s, test accuracy "
              f"{rec['test_accuracy']} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
