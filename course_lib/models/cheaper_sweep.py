"""Chapter 09's seeded sweeps, too slow for a lecture: `python -m course_lib.models.cheaper_sweep`.

It trains, on one CPU thread (about 8 minutes on a quiet machine, far longer on a busy one):

  linear     linear attention on recall-k-back (chapter 06) with 2 heads of width 8, 16 and 32
             (a state of 8x8 .. 32x32 numbers per head), 300 and 1000 steps, and softmax's 300;
             both on `majority_batch` (a blend suffices) at width 8; 3 seeds each;
  sharing    h = 4 query heads of width 2 with g = 4, 2, 1 key/value heads on chapter 05's
             bracket task, and of width 8 with g = 4, 1; 1000 steps, 3 seeds;
  windowed   a two-layer `WindowedTransformer` with W = 6 on recall, whose weights are kept in
             course_lib/data/ch09_window_recall.pt so the lecture can generate with them.

and writes the numbers to course_lib/data/ch09_results.json (read by `cheaper_results`).
`python -m course_lib.models.cheaper_sweep sharing` remakes one part (linear, sharing, windowed).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch

from course_lib.models.cheaper import CheaperAttentionModel, majority_batch
from course_lib.models.heads import BracketTask
from course_lib.models.recall import accuracy_by_distance, recall_batch
from course_lib.models.windowed import WindowedTransformer
from course_lib.train import cross_entropy, train

DATA = Path(__file__).parents[1] / "data"
N_TOKENS, VOCAB, WINDOW = 24, 8, 6          # the lecture's recall task and window
SEEDS = (0, 1, 2)
WIDTHS = (8, 16, 32)                        # d_head; 2 heads, so d_model = 2 * d_head
LINEAR_STEPS = (300, 1000)
WINDOW_MODEL = dict(d_model=64, num_heads=8, num_layers=2, window=WINDOW, max_len=N_TOKENS + 1)
WINDOW_STEPS, WINDOW_LR = 3000, 3e-3


def recall_data():
    """The lecture's recall task: a batch function and its 2000 test sequences (seed 99)."""
    recall = partial(recall_batch, n=N_TOKENS, vocab=VOCAB)
    return recall, recall(torch.Generator().manual_seed(99), batch=2000)


def majority_data():
    """`majority_batch` at the lecture's size and its 2000 test sequences (seed 99)."""
    majority = partial(majority_batch, n=N_TOKENS, vocab=VOCAB)
    return majority, majority(torch.Generator().manual_seed(99), batch=2000)


def recall_run(kind: str, d_head: int, steps: int, seed: int) -> dict[int, float]:
    """Accuracy by distance k of a one-layer model with 2 heads of width d_head."""
    recall, (tokens, targets) = recall_data()
    torch.manual_seed(seed)
    model = CheaperAttentionModel(VOCAB + N_TOKENS + 1, VOCAB, d_model=2 * d_head, num_heads=2,
                                  max_len=N_TOKENS + 1, kind=kind)
    train(model, recall, steps=steps, lr=1e-2, seed=seed, progress=False)
    return accuracy_by_distance(model, tokens, targets, VOCAB)


def majority_run(kind: str, d_head: int, steps: int, seed: int) -> float:
    """Test accuracy on `majority_batch` (tied sequences left out)."""
    majority, (tokens, targets) = majority_data()
    torch.manual_seed(seed)
    model = CheaperAttentionModel(VOCAB + 1, VOCAB, d_model=2 * d_head, num_heads=2,
                                  max_len=N_TOKENS + 1, kind=kind)
    train(model, majority, steps=steps, lr=1e-2, seed=seed, progress=False)
    with torch.no_grad():
        logits, _ = model(tokens)
    keep = targets[:, -1] != -100
    return float((logits[:, -1].argmax(-1) == targets[:, -1])[keep].float().mean())


def sharing_run(kv_heads: int, seed: int, steps: int = 1000, d_model: int = 8,
                num_heads: int = 4) -> dict[str, float]:
    """Bracket-task test accuracy and loss with h query heads of width d_model/h, g KV heads."""
    task = BracketTask()
    tokens, targets = task.batch(torch.Generator().manual_seed(7), batch=1000)
    torch.manual_seed(seed)
    model = CheaperAttentionModel(task.vocab_size, task.num_classes, d_model=d_model,
                                  num_heads=num_heads, max_len=task.n + 1, num_kv_heads=kv_heads)
    train(model, task.batch, steps=steps, lr=1e-2, seed=seed, progress=False)
    with torch.no_grad():
        logits, _ = model(tokens)
    keep = targets != -100
    return {"accuracy": float((logits.argmax(-1)[keep] == targets[keep]).float().mean()),
            "loss": float(cross_entropy(logits, targets))}


def train_window_recall(steps: int = WINDOW_STEPS, seed: int = 0) -> WindowedTransformer:
    """The two-layer W = 6 model on recall: it can reach 2(W - 1) = 10 positions back."""
    recall, _ = recall_data()
    torch.manual_seed(seed)
    model = WindowedTransformer(VOCAB + N_TOKENS + 1, **WINDOW_MODEL)
    train(model, recall, steps=steps, lr=WINDOW_LR, seed=seed, progress=False)
    return model.eval()


def load_window_recall() -> WindowedTransformer:
    """The shipped two-layer W = 6 recall model (made by `train_window_recall`)."""
    model = WindowedTransformer(VOCAB + N_TOKENS + 1, **WINDOW_MODEL)
    state = torch.load(DATA / "ch09_window_recall.pt", map_location="cpu", weights_only=True)
    model.load_state_dict({name: t.float() for name, t in state.items()})
    return model.eval()


def _rounded(acc: dict[int, float]) -> dict[str, float]:
    return {str(k): round(a, 4) for k, a in acc.items()}


def linear_part() -> dict:
    rows = {"linear_recall": [], "majority": []}
    for kind in ("softmax", "linear"):
        for d_head in WIDTHS:
            for steps in (300,) if kind == "softmax" else LINEAR_STEPS:
                for seed in SEEDS:
                    acc = recall_run(kind, d_head, steps, seed)
                    rows["linear_recall"].append({"kind": kind, "d_head": d_head, "steps": steps,
                                                  "seed": seed, "by_k": _rounded(acc)})
                    print(kind, d_head, steps, seed, f"{sum(acc.values()) / len(acc):.3f}",
                          flush=True)
    for kind in ("softmax", "linear"):
        for seed in SEEDS:
            acc = majority_run(kind, 8, 300, seed)
            rows["majority"].append({"kind": kind, "d_head": 8, "steps": 300, "seed": seed,
                                     "accuracy": round(acc, 4)})
            print("majority", kind, seed, f"{acc:.3f}", flush=True)
    return rows


def sharing_part(widths=((8, (4, 2, 1)), (32, (4, 1)))) -> dict:
    """4 query heads of width 2 (d_model 8) with g = 4, 2, 1; of width 8 (d_model 32), g = 4, 1."""
    rows = []
    for d_model, kv_choices in widths:
        for kv_heads in kv_choices:
            for seed in SEEDS:
                run = sharing_run(kv_heads, seed, d_model=d_model)
                rows.append({"d_head": d_model // 4, "kv_heads": kv_heads, "seed": seed,
                             **{k: round(v, 4) for k, v in run.items()}})
                print("sharing", d_model, kv_heads, seed, run, flush=True)
    return {"sharing": rows}


def windowed_part() -> dict:
    model = train_window_recall()
    _, (tokens, targets) = recall_data()
    torch.save({name: t.half() for name, t in model.state_dict().items()},
               DATA / "ch09_window_recall.pt")
    by_k = accuracy_by_distance(load_window_recall(), tokens, targets, VOCAB)  # as shipped
    return {"windowed": {"model": WINDOW_MODEL, "steps": WINDOW_STEPS, "lr": WINDOW_LR,
                         "by_k": _rounded(by_k)}}


PARTS = {"linear": linear_part, "sharing": sharing_part, "windowed": windowed_part}


def main(parts=tuple(PARTS)) -> None:
    """Run the named parts (default all) and merge them into ch09_results.json."""
    torch.set_num_threads(1)
    path = DATA / "ch09_results.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    for part in parts:
        record.update(PARTS[part]())
        path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:] or tuple(PARTS))
