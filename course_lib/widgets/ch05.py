"""Chapter 05's explorer: a trained model's attention heads on one example, one head at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as widgets
import matplotlib
import torch

from course_lib.widgets._base import Explorer


def draw_masked_weights(ax, weights: torch.Tensor, mask: torch.Tensor | None = None):
    """imshow of weights (n_q, n_k) on [0, 1]; cells where `mask` is False: blank with a grey x.

    Returns the image (for a colour bar). The forbidden cells are not-a-number in the image, so
    the colour map never paints them as weight 0.
    """
    w = torch.as_tensor(weights).detach().to(torch.float64).cpu()
    if mask is not None:
        w = w.masked_fill(~mask, float("nan"))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#f3f4f6")
    image = ax.imshow(w.numpy(), cmap=cmap, vmin=0, vmax=1)
    if mask is not None:
        rows, cols = torch.nonzero(~mask, as_tuple=True)
        ax.scatter(cols.numpy(), rows.numpy(), marker="x", s=18, linewidths=0.8, color="#9ca3af")
    return image


def head_explorer(weights: torch.Tensor, labels: Sequence[str],
                  scores: Mapping[str, Sequence[float]] | None = None, head: int = 0,
                  mask: torch.Tensor | None = None) -> Explorer:
    """Heatmap of one head's attention weights over the tokens `labels`, with a head selector.

    weights: (heads, n, n), one example's weights (e.g. `model(tokens)[1][0]`); labels: n token
    labels; scores: optional {job name: one score per head}, written in each head's title.
    mask: optional bool (n, n), True = may attend (e.g. `causal_mask(n)`): the cells it forbids
    are drawn blank with a grey x, not as a weight of 0, so "not allowed" and "allowed but
    ignored" look different.
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
    if mask is not None:
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool or tuple(mask.shape) != (n, n):
            raise ValueError(f"mask should be a bool tensor of shape ({n}, {n}) (True = may "
                             f"attend), got {mask.dtype} of shape {tuple(mask.shape)}")

    def draw(fig, head):
        ax = fig.add_subplot()
        image = draw_masked_weights(ax, w[head], mask)
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

