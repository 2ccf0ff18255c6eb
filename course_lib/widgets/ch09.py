"""Chapter 09's explorer: a sliding window's size against what it sees and what it costs."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np

from course_lib.masks import sliding_window_mask
from course_lib.widgets._base import Explorer


def window_reach(n: int, window: int, layers: int) -> np.ndarray:
    """(n,) bool: the positions whose token can reach the LAST position through `layers` stacked
    sliding-window layers (each hop moves at most window - 1 positions back)."""
    step = sliding_window_mask(n, window).numpy().astype(np.int64)  # (n, n): one layer's reads
    reach = np.zeros(n, dtype=np.int64)
    reach[-1] = 1
    for _ in range(layers):
        reach = (reach + reach @ step).clip(max=1)  # whatever a reached position reads is reached
    return reach.astype(bool)


def window_explorer(tokens=None, window: int = 4, layers: int = 1,
                    lengths=(256, 1024, 4096, 16384, 65536, 131072)) -> Explorer:
    """Sliders for the window W and the number of stacked layers. Three panels: the mask
    (query x key), which earlier tokens reach the last one through `layers` windowed layers, and
    the score entries one layer computes against the sequence length, full causal vs window.

    tokens: the labels of the positions (default: 16 letters).
    """
    tokens = list("the cat sat on a mat".replace(" ", "_")[:16]) if tokens is None else list(tokens)
    n = len(tokens)
    if n < 2:
        raise ValueError(f"tokens must hold at least 2 labels, got {len(tokens)}")
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= n:
        raise ValueError(f"window must be an integer in 1..{n} (the number of tokens), "
                         f"got {window!r}")
    ns = np.asarray(lengths, dtype=float)

    def draw(fig, window, layers):
        ax_m, ax_r, ax_c = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.1, 1.2, 1.1]})
        mask = sliding_window_mask(n, window).numpy()
        image = ax_m.imshow(mask, cmap="Blues", vmin=0, vmax=1)
        ax_m.set_xticks(range(n), tokens, fontsize=9)
        ax_m.set_yticks(range(n), tokens, fontsize=9)
        ax_m.set_xlabel("key (position j)")
        ax_m.set_ylabel("query (position i)")
        ax_m.set_title(f"mask: 0 <= i - j < W = {window}", fontsize=10)
        bar = fig.colorbar(image, ax=ax_m, fraction=0.046, ticks=[0, 1])
        bar.ax.set_yticklabels(["blocked", "may attend"], fontsize=8)

        reach = window_reach(n, window, layers)
        colours = ["tab:orange" if i == n - 1 else "tab:blue" if r else "lightgrey"
                   for i, r in enumerate(reach)]
        ax_r.bar(range(n), np.ones(n), color=colours)
        ax_r.set_xticks(range(n), tokens, fontsize=9)
        ax_r.set_yticks([])
        ax_r.set_ylabel("blue: its token reaches the last one")
        ax_r.set_xlabel("position (orange: the last token)")
        first = int(np.argmax(reach))
        ax_r.set_title(f"{layers} layer(s) of W = {window}: the last token reads "
                       f"{n - first} of {n}", fontsize=10)

        full = ns * (ns + 1) / 2                                  # causal: i + 1 keys for query i
        windowed = np.minimum(ns, window) * (ns - window + 1) + window * (window - 1) / 2
        windowed = np.where(ns >= window, windowed, full)
        ax_c.loglog(ns, full, "o-", label="full causal: n(n+1)/2")
        ax_c.loglog(ns, windowed, "s-", label=f"window W = {window}: about n·W")
        ax_c.set_xlabel("sequence length n (tokens)")
        ax_c.set_ylabel("score entries per head and layer")
        ax_c.set_title(f"at n = {int(ns[-1])}: {full[-1] / windowed[-1]:.0f}x fewer", fontsize=10)
        ax_c.legend(fontsize=8)
        fig.suptitle("a sliding window: who sees whom, how far information travels, what it costs",
                     fontsize=11)
        fig.tight_layout()

    w_slider = widgets.IntSlider(value=window, min=1, max=n, step=1, description="window W",
                                 continuous_update=False)
    l_slider = widgets.IntSlider(value=layers, min=1, max=6, step=1, description="layers",
                                 continuous_update=False)
    return Explorer(draw, {"window": w_slider, "layers": l_slider}, figsize=(13, 4.0))
