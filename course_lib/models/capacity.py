"""How much can a running summary hold? Recall accuracy over sequence length and state size.

Chapter 06's recall task asks, after n random tokens, for the token k steps back. A recurrent
model must carry all n tokens in its state until the question comes; `recall_capacity_sweep`
trains one GRU per (n, d_hidden) on it, long enough that the budget is not the limit, and scores
each on fresh sequences. Accuracy falls as n grows past what d_hidden numbers hold: the tokens
crowd each other out.

Two of its cells are also trained three times longer (`LONGER`), to see what more training
buys. The full sweep takes minutes on a CPU, so its seeded result ships in
`course_lib/data/capacity_results.json` (read by `course_lib.models.capacity_results`), written by

    python -m course_lib.models.capacity          # the recorded sweep (a few minutes)

and the lecture reruns one of its cells live to show the record reproduces.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from course_lib.models.recall import RecurrentModel, recall_batch
from course_lib.train import evaluate, train

# The recorded sweep: chapter 06 plots it (capacity_results.RESULTS).
NS = (4, 8, 16)
HIDDEN_SIZES = (8, 16, 32, 64, 128)
STEPS = 2000
VOCAB = 8
# ... and two of its cells trained three times longer (capacity_results.LONGER): is 2000 enough?
LONGER_CELLS = ((8, 32), (16, 32))
LONGER_STEPS = 3 * STEPS


def train_recall(n: int, d_hidden: int, steps: int = STEPS, vocab: int = VOCAB, kind: str = "gru",
                 seed: int = 0, test_size: int = 2000, lr: float = 1e-2) -> float:
    """Train one recurrent model on recall-k-back over n tokens; return its test accuracy."""
    if n < 1 or d_hidden < 1 or steps < 1:
        raise ValueError(f"n, d_hidden and steps should be positive, got n={n}, "
                         f"d_hidden={d_hidden}, steps={steps}")
    batch_fn = partial(recall_batch, n=n, vocab=vocab)
    torch.manual_seed(seed)
    model = RecurrentModel(vocab + n + 1, vocab, d_hidden=d_hidden, kind=kind)
    train(model, batch_fn, steps=steps, lr=lr, seed=seed, progress=False)
    test_tokens, test_targets = batch_fn(torch.Generator().manual_seed(99), batch=test_size)
    return evaluate(model, test_tokens, test_targets)


def recall_capacity_sweep(ns=NS, hidden_sizes=HIDDEN_SIZES, steps: int = STEPS, vocab: int = VOCAB,
                          kind: str = "gru", seed: int = 0) -> list[dict]:
    """One trained model per (n, d_hidden): rows {n, d_hidden, steps, kind, accuracy}."""
    return [{"n": n, "d_hidden": d, "steps": steps, "kind": kind,
             "accuracy": round(train_recall(n, d, steps, vocab, kind, seed), 4)}
            for n in ns for d in hidden_sizes]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parents[1] / "data" / "capacity_results.json")
    args = parser.parse_args(argv)
    rows = recall_capacity_sweep(steps=args.steps)
    longer_steps = 3 * args.steps
    longer = [{"n": n, "d_hidden": d, "steps": longer_steps, "kind": "gru",
               "accuracy": round(train_recall(n, d, longer_steps), 4)} for n, d in LONGER_CELLS]
    args.out.write_text(json.dumps({"results": rows, "longer": longer}, indent=1) + "\n")
    for row in rows + longer:
        print(row)


if __name__ == "__main__":
    main()
