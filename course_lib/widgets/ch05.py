"""Chapter 05's explorer: a trained model's attention heads on one example, one head at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as widgets
import torch

from course_lib.widgets._base import Explorer


def head_explorer(weights: torch.Tensor, labels: Sequence[str],
                  scores: Mapping[str, Sequence[float]] | None = None, head: int = 0) -> Explorer:
    """Heatmap of one head's attention weights over the tokens `labels`, with a head selector.

    weights: (heads, n, n), one example's weights (e.g. `model(tokens)[1][0]`); labels: n token
    labels; scores: optional {job name: one score per head}, written in each head's title.
    """
    w = torch.as_tensor(weights).detach().to(torch.float64).cpu()
    if w.dim() != 3 or w.shape[1] != w.shape[2]:
        raise ValueError(f"weights has shape {tuple(w.shape)}, wanted (heads, n, n)")
    heads, n, _ = w.shape
    labels = [str(label) for label in labels]
    if len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries but weights cover n={n} tokens")
    scores = {name: [float(s) for s in values] for name, values in (scores or {}).items()}
    for name, values in scores.items():
        if len(values) != heads:
            raise ValueError(f"scores[{name!r}] has {len(values)} entries, "
                             f"wanted one per head ({heads})")
    if not (isinstance(head, int) and 0 <= head < heads):
        raise ValueError(f"head should be an int in 0..{heads - 1}, got {head!r}")

    def draw(fig, head):
        ax = fig.add_subplot()
        image = ax.imshow(w[head].numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(n), labels, fontsize=11)  # tokens must read at a glance
        ax.set_yticks(range(n), labels, fontsize=11)
        ax.set_xlabel("key position (attended to)")
        ax.set_ylabel("query position (attending)")
        detail = ", ".join(f"{name} {values[head]:.2f}" for name, values in scores.items())
        ax.set_title(f"head {head}" + (f"  ({detail})" if detail else ""))
        fig.colorbar(image, ax=ax, label="attention weight", fraction=0.046, pad=0.04)

    selector = widgets.Dropdown(options=[(f"head {h}", h) for h in range(heads)], value=head,
                                description="head")
    return Explorer(draw, {"head": selector}, figsize=(6.4, 5.6))

