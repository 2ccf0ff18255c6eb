"""Chapter 04's explorer: one attention map under no mask, a causal mask, or a padding mask."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import numpy as np
import torch

from course_lib.attention import scaled_dot_product_attention
from course_lib.masks import causal_mask, padding_mask
from course_lib.validate import check_choice
from course_lib.widgets._base import Explorer

SENTENCE = ("the", "cat", "sat", "on", "the", "mat")
MASK_TYPES = ("none", "causal", "padding")


def mask_explorer(tokens: Sequence[str] = SENTENCE, mask: str = "causal", length: int | None = None,
                  d_k: int = 8, seed: int = 0) -> Explorer:
    """Heatmap of self-attention weights over `tokens` with a chosen mask.

    mask: "none", "causal" or "padding"; length: how many tokens are real when padding (the rest
    are drawn as <pad> and receive no weight). Masked cells show as grey crosses, the weights of
    allowed cells are written in them; each row sums to 1.
    """
    tokens = list(tokens)
    n = len(tokens)
    check_choice(mask, "mask", MASK_TYPES)
    length = n - 2 if length is None else length
    if not (isinstance(length, int) and 1 <= length <= n):
        raise ValueError(f"length must be an integer in 1..{n} (the number of tokens), "
                         f"got {length!r}")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, d_k, generator=g, dtype=torch.float64)  # (n, d_k)
    k = torch.randn(n, d_k, generator=g, dtype=torch.float64)  # (n, d_k)
    v = torch.randn(n, d_k, generator=g, dtype=torch.float64)  # (n, d_k)

    def draw(fig, mask, length):
        labels = list(tokens)
        if mask == "none":
            allowed = torch.ones(n, n, dtype=torch.bool)
        elif mask == "causal":
            allowed = causal_mask(n)  # (n, n)
        else:
            allowed = padding_mask([length], n)[0].expand(n, n)  # (n, n): same keys for every query
            labels = labels[:length] + ["<pad>"] * (n - length)
        _, weights = scaled_dot_product_attention(q, k, v, mask=allowed)  # (n, n)
        ax = fig.add_subplot()
        shown = np.ma.masked_array(weights.numpy(), mask=~allowed.numpy())
        image = ax.imshow(shown, cmap="viridis", vmin=0, vmax=1)
        for i in range(n):
            for j in range(n):
                if allowed[i, j]:
                    w = float(weights[i, j])
                    ax.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=8,
                            color="black" if w > 0.6 else "white")
                else:
                    ax.text(j, i, "×", ha="center", va="center", fontsize=10, color="0.5")
        ax.set_xticks(range(n), labels, rotation=45)
        ax.set_yticks(range(n), labels)
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query (attending)")
        titles = {"none": "no mask: every token sees every token",
                  "causal": "causal mask: no token sees a later one",
                  "padding": f"padding mask: {n - length} <pad> key(s) get no weight"}
        ax.set_title(titles[mask])
        fig.colorbar(image, ax=ax, label="attention weight (× = masked, exactly 0)")
        fig.tight_layout()

    controls = {
        "mask": widgets.Dropdown(options=list(MASK_TYPES), value=mask, description="mask"),
        "length": widgets.IntSlider(value=length, min=1, max=n, description="real tokens",
                                    continuous_update=True),
    }
    return Explorer(draw, controls, figsize=(5.6, 4.6))
