"""Chapter 10's explorer: every head of a stacked model on one real sentence, layer by layer."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import torch

from course_lib.widgets._base import Explorer
from course_lib.widgets.ch05 import draw_masked_weights


def _label(c: str) -> str:
    return {" ": "␣", "\n": "↵", "\t": "⇥"}.get(c, c)


def layer_head_explorer(weights: torch.Tensor, labels: Sequence[str],
                        jobs: Sequence[dict] | None = None, layer: int = 0,
                        head: int = 0) -> Explorer:
    """Heatmap of one head's attention over `labels`, with a layer selector and a head selector.

    weights: (layers, heads, n, n), one sentence's weights from every block; labels: n token
    labels (characters: spaces are drawn as ␣, newlines as ↵); jobs: optional rows of
    `course_lib.stacking.text.head_jobs` (one per head), whose job and score go in the title.
    """
    w = torch.as_tensor(weights).detach().to(torch.float64).cpu()
    if w.dim() != 4 or w.shape[2] != w.shape[3]:
        raise ValueError(f"weights has shape {tuple(w.shape)}, wanted (layers, heads, n, n)")
    layers, heads, n, _ = w.shape
    labels = [_label(str(label)) for label in labels]
    if len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries but weights cover n={n} tokens")
    named = {(int(r["layer"]), int(r["head"])): r for r in (jobs or [])}
    if jobs is not None and len(named) != layers * heads:
        raise ValueError(f"jobs has {len(named)} distinct (layer, head) rows, wanted one per head "
                         f"({layers} x {heads})")
    for name, value, count in (("layer", layer, layers), ("head", head, heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise ValueError(f"{name} should be an int in 0..{count - 1}, got {value!r}")

    def draw(fig, layer, head):
        ax = fig.add_subplot()
        shown = w[layer, head]
        blocked = torch.ones(n, n, dtype=torch.bool).triu(1) & (shown == 0)  # the causal mask
        image = draw_masked_weights(ax, shown, ~blocked)  # masked: a grey x, not a weight of 0
        ax.set_xticks(range(n), labels, fontsize=7)
        ax.set_yticks(range(n), labels, fontsize=7)
        ax.set_xlabel("key character (attended to)")
        ax.set_ylabel("query character (attending)")
        title = f"layer {layer}, head {head}"
        row = named.get((layer, head))
        if row is not None:
            job = row["job"]
            score = f" {row[job]:.2f}" if job in row else ""
            title += f": {job}{score}"
        ax.set_title(title)
        label = "attention weight (x = masked)" if blocked.any() else "attention weight"
        fig.colorbar(image, ax=ax, label=label, fraction=0.046, pad=0.04)

    controls = {
        "layer": widgets.Dropdown(options=[(f"layer {i}", i) for i in range(layers)], value=layer,
                                  description="layer"),
        "head": widgets.Dropdown(options=[(f"head {i}", i) for i in range(heads)], value=head,
                                 description="head"),
    }
    return Explorer(draw, controls, figsize=(8.5, 8.0))
