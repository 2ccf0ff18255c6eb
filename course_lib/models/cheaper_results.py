"""Recorded by `python -m course_lib.models.cheaper_sweep` (seeded; see cheaper_sweep.py): chapter
09's sweeps, kept as data in course_lib/data/ch09_results.json.

    LINEAR_RECALL  one row per (kind, d_head, steps, seed): accuracy by distance k on recall
    MAJORITY       one row per (kind, d_head, steps, seed): accuracy on `majority_batch`
    SHARING        one row per (kv_heads, seed): bracket-task accuracy and loss, heads of width 2
    WINDOWED       the shipped two-layer W = 6 recall model: accuracy by distance k
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

_RECORD = json.loads((Path(__file__).parents[1] / "data" / "ch09_results.json").read_text())
LINEAR_RECALL: list[dict] = _RECORD["linear_recall"]
MAJORITY: list[dict] = _RECORD["majority"]
SHARING: list[dict] = _RECORD["sharing"]
WINDOWED: dict = _RECORD["windowed"]


def by_k(row: dict) -> dict[int, float]:
    """A row's accuracy by distance, with integer keys."""
    return {int(k): a for k, a in row["by_k"].items()}


def recall_summary(window: int = 6) -> list[dict]:
    """Per (kind, d_head, steps): the seeds' whole-task accuracies (mean over k), their mean,
    min and max, and the mean over seeds of the window part (k < window) and of k = 1."""
    groups: dict[tuple, list[dict]] = {}
    for row in LINEAR_RECALL:
        groups.setdefault((row["kind"], row["d_head"], row["steps"]), []).append(row)
    out = []
    for (kind, d_head, steps), rows in groups.items():
        whole = [mean(by_k(r).values()) for r in rows]
        near = [mean(a for k, a in by_k(r).items() if k < window) for r in rows]
        out.append({"kind": kind, "d_head": d_head, "steps": steps, "seeds": len(rows),
                    "whole": mean(whole), "whole_min": min(whole), "whole_max": max(whole),
                    "near": mean(near), "k1": mean(by_k(r)[1] for r in rows)})
    return out


def mean_by_k(kind: str, d_head: int, steps: int) -> dict[int, float]:
    """Accuracy by distance, averaged over the seeds of one (kind, d_head, steps)."""
    rows = [by_k(r) for r in LINEAR_RECALL
            if (r["kind"], r["d_head"], r["steps"]) == (kind, d_head, steps)]
    return {k: mean(r[k] for r in rows) for k in rows[0]}


def mean_by_k_seed(kind: str, d_head: int, steps: int, seed: int) -> float:
    """One run's whole-task accuracy: its accuracy by distance, averaged over k."""
    row = next(r for r in LINEAR_RECALL
               if (r["kind"], r["d_head"], r["steps"], r["seed"]) == (kind, d_head, steps, seed))
    return mean(by_k(row).values())
