"""Chapter 03's explorer: widen the keys (d_k) and watch one query's weights collapse, or not."""

from __future__ import annotations

import math
from collections.abc import Sequence

import ipywidgets as widgets
import torch
from matplotlib.patches import Patch

from course_lib.attention import softmax
from course_lib.validate import check_choice
from course_lib.widgets._base import Explorer

D_K_CHOICES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
SENTENCE = ("the", "cat", "sat", "on", "the", "mat")


def scaling_explorer(d_k: int = 64, scaled: bool = False, tokens: Sequence[str] = SENTENCE,
                     query_index: int = 2, seed: int = 0) -> Explorer:
    """Scores and softmax weights of one query against every token's key, for a chosen d_k.

    The query and the keys have independent unit-variance entries, drawn once (seeded) at the
    widest d_k; a narrower d_k uses their first d_k entries, so moving the slider widens the same
    vectors. Each distinct token has one key (the two "the"s of the sentence share it, as they
    share an embedding in chapter 02). Controls: d_k (4 ... 1024) and whether the scores are
    divided by sqrt(d_k).
    """
    tokens = list(tokens)
    check_choice(d_k, "d_k", D_K_CHOICES)
    if not 0 <= query_index < len(tokens):
        raise ValueError(f"query_index must lie in 0..{len(tokens) - 1} for {len(tokens)} "
                         f"tokens, got {query_index}")
    vocab = sorted(set(tokens))
    d_max = max(D_K_CHOICES)
    g = torch.Generator().manual_seed(seed)
    q_full = torch.randn(d_max, generator=g, dtype=torch.float64)                 # (d_max,)
    key_of_word = torch.randn(len(vocab), d_max, generator=g, dtype=torch.float64)
    word_of_token = [vocab.index(t) for t in tokens]                              # (n,)

    def draw(fig, d_k, scaled):
        scores = (key_of_word[:, :d_k] @ q_full[:d_k])[word_of_token]  # (n,): equal for equal words
        if scaled:
            scores = scores / math.sqrt(d_k)
        weights = softmax(scores)  # (n,)
        entropy = float(-torch.xlogy(weights, weights).sum())
        ax_s, ax_w = fig.subplots(1, 2)
        x = range(len(tokens))
        ax_s.bar(x, scores.numpy(), color="tab:gray")
        ax_s.axhline(0, color="black", lw=0.6)
        ax_s.set_xticks(list(x), tokens)
        ax_s.set_xlabel("key token")
        ax_s.set_ylabel("score" + (" q·k/√d_k" if scaled else " q·k"))
        ax_s.set_title(f"scores of query '{tokens[query_index]}' (std {float(scores.std()):.1f})")
        bars = ax_w.bar(x, weights.numpy(), color="tab:blue")
        for bar, w in zip(bars, weights.tolist()):
            if w == float(weights.max()):  # ties too: the two "the"s share a key and a weight
                bar.set_color("tab:orange")
        uniform = ax_w.axhline(1 / len(tokens), color="grey", ls="--", lw=0.8,
                               label="uniform, 1/n")
        ax_w.legend(handles=[Patch(color="tab:orange", label="largest weight"),
                             Patch(color="tab:blue", label="other keys"), uniform],
                    loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        ax_w.set_ylim(0, 1.05)
        ax_w.set_xticks(list(x), tokens)
        ax_w.set_xlabel("key token")
        ax_w.set_ylabel("attention weight")
        ax_w.set_title(f"weights: max {float(weights.max()):.2f}, entropy {entropy:.2f} nats")
        fig.suptitle(f"d_k = {d_k}, " + ("scaled by 1/√d_k" if scaled else "unscaled"))
        fig.tight_layout()

    controls = {
        "d_k": widgets.SelectionSlider(options=list(D_K_CHOICES), value=d_k, description="d_k",
                                       continuous_update=True),
        "scaled": widgets.Checkbox(value=scaled, description="divide by √d_k"),
    }
    return Explorer(draw, controls, figsize=(9.0, 3.4))
