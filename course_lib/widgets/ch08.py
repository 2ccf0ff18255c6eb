"""Chapter 08's explorer: step through the online softmax one tile of keys at a time."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np

from course_lib.validate import check_count
from course_lib.widgets._base import Explorer


def online_softmax_steps(scores, values, block_size: int):
    """The running statistics after each tile: a list of dicts with m, l, the partial weights
    (over the keys seen so far, as they stand after that tile) and the partial output acc / l.

    scores: (n,) one query's scores; values: (n, d_v). Plain NumPy, the same update as the kernel.
    """
    scores, values = np.asarray(scores, float), np.asarray(values, float)
    m, l, acc = -np.inf, 0.0, np.zeros(values.shape[1])
    steps = []
    for start in range(0, len(scores), block_size):
        s, v = scores[start:start + block_size], values[start:start + block_size]
        m_new = max(m, s.max())
        alpha = np.exp(m - m_new)                  # rescale what came before
        p = np.exp(s - m_new)
        l = l * alpha + p.sum()
        acc = acc * alpha + p @ v
        m = m_new
        seen = start + len(s)
        steps.append({"m": m, "l": l, "seen": seen, "alpha": alpha,
                      "weights": np.exp(scores[:seen] - m) / l, "out": acc / l})
    return steps


def online_softmax_stepper(scores=None, values=None, block_size: int = 3, step: int = 1,
                           seed: int = 0) -> Explorer:
    """A slider over the tile index: after tile t, the running max m, the running sum l, the
    weights as they stand, and the partial output next to the final answer.

    scores: (n,) one query's scores (default: 12 seeded random scores), values: (n, d_v)
    (default 4 columns), block_size: keys per tile.
    """
    rng = np.random.default_rng(seed)
    scores = rng.normal(0, 2, size=12) if scores is None else np.asarray(scores, float)
    values = rng.normal(size=(len(scores), 4)) if values is None else np.asarray(values, float)
    if scores.ndim != 1 or len(scores) < 1:
        raise ValueError(f"scores must have shape (n,) with n >= 1, got {scores.shape}")
    if values.ndim != 2 or values.shape[0] != len(scores):
        raise ValueError(f"values must have shape (n, d_v) = ({len(scores)}, d_v), "
                         f"got {values.shape}")
    block_size = check_count(block_size, "block_size")
    steps = online_softmax_steps(scores, values, block_size)
    final_w = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    final_out = final_w @ values
    n, n_tiles = len(scores), len(steps)
    # fixed axes for every step, so moving the slider changes the bars, not the scale
    w_top = 1.15 * max(final_w.max(), *(st["weights"].max() for st in steps))
    outs = np.concatenate([final_out, *(st["out"] for st in steps), [0.0]])
    span = max(outs.max() - outs.min(), 1e-6)
    out_limits = (outs.min() - 0.1 * span, outs.max() + 0.55 * span)

    def draw(fig, step):
        st = steps[step - 1]
        seen, lo = st["seen"], (step - 1) * block_size
        ax_s, ax_w, ax_o = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.2, 1.2, 0.9]})
        colours = ["tab:blue" if j < lo else "tab:orange" if j < seen else "lightgrey"
                   for j in range(n)]
        ax_s.bar(range(n), scores, color=colours)
        ax_s.axhline(st["m"], color="tab:red", ls="--", lw=1.2,
                     label=f"running max m = {st['m']:.2f}")
        for edge in range(block_size, n, block_size):
            ax_s.axvline(edge - 0.5, color="k", lw=0.5, alpha=0.4)
        ax_s.set_title(f"scores: tile {step} of {n_tiles} (orange) just read")
        ax_s.set_xlabel("key position j")
        ax_s.set_ylabel("score s_j")
        ax_s.legend(fontsize=8, loc="lower left")

        ax_w.bar(range(seen), st["weights"], color="tab:blue", label="exp(s_j − m) / l, so far")
        ax_w.step(range(n), final_w, where="mid", color="k", lw=1.2, label="final softmax")
        ax_w.set_xlim(-0.6, n - 0.4)
        ax_w.set_ylim(0, w_top)
        ax_w.set_title(f"weights so far: l = {st['l']:.3f}")
        ax_w.set_xlabel("key position j")
        ax_w.set_ylabel("weight")
        ax_w.legend(fontsize=8, loc="upper left")

        dims = np.arange(values.shape[1])
        ax_o.bar(dims - 0.2, st["out"], width=0.4, color="tab:blue", label="partial acc / l")
        ax_o.bar(dims + 0.2, final_out, width=0.4, color="k", alpha=0.35, label="final output")
        gap = np.abs(st["out"] - final_out).max()
        ax_o.set_title(f"output: max gap {gap:.3f}")
        ax_o.set_xticks(dims, [f"v[{i}]" for i in dims])
        ax_o.set_xlabel("output component")
        ax_o.set_ylabel("value")
        ax_o.axhline(0, color="k", lw=0.5)
        ax_o.set_ylim(*out_limits)
        ax_o.legend(fontsize=8, loc="upper left", ncol=2)
        fig.suptitle(f"online softmax after {seen} of {n} keys (tiles of {block_size})",
                     fontsize=11)
        fig.tight_layout()

    slider = widgets.IntSlider(value=min(max(int(step), 1), n_tiles), min=1, max=n_tiles, step=1,
                               description="tile", continuous_update=True)
    return Explorer(draw, {"step": slider}, figsize=(12, 3.6))
