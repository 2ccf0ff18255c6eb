"""Chapter 09's pictures: the ring-buffer KV cache and grouped-query attention's head groups.

Both are drawn from the course's own code, so a picture cannot disagree with it:

    ring_buffer_steps(window, steps)        feed tokens one at a time into a real `RingKVCache`
    draw_ring_buffer(window, steps, ax)     and read its slots back after every step
    head_groups(num_heads, num_kv_heads)    the K/V head each query head reads, found by running
    draw_head_groups(num_heads, kv_heads)   `grouped_query_attention` itself
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from course_lib.attention import grouped_query_attention
from course_lib.models.windowed import RingKVCache
from course_lib.validate import check_count, check_kv_heads

EMPTY = -1  # what an unwritten slot holds in the picture's cache (positions are >= 0)


def ring_buffer_steps(window: int, steps: int) -> list[dict]:
    """Generate `steps` tokens into a `RingKVCache` of `window` slots and read it after each.

    Token t's key and value are the number t, so a slot's content is the position it holds.
    Returns one dict per step t: `slots` (window,) the positions held (None where empty),
    `written` the slot whose content changed, `overwritten` the position it held before (None
    if it was empty), and `positions` what `RingKVCache.positions()` says the slots hold.
    """
    window, steps = check_count(window, "window"), check_count(steps, "steps")
    cache = RingKVCache(num_layers=1, batch=1, num_heads=1, window=window, d_head=1,
                        dtype=torch.float64)
    cache.k.fill_(EMPTY)
    cache.v.fill_(EMPTY)
    rows = []
    for t in range(steps):
        before = cache.k[0, 0, 0, :, 0].clone()                  # (window,)
        token = torch.full((1, 1, 1, 1), float(t), dtype=torch.float64)  # (batch, heads, 1, d)
        cache.append(0, token, token)                           # writes slot t mod W
        cache.advance(1)
        after = cache.k[0, 0, 0, :, 0]                          # (window,)
        changed = (after != before).nonzero().flatten().tolist()
        if len(changed) != 1:
            raise RuntimeError(f"step {t} changed slots {changed} of the ring, not one")
        slot = changed[0]
        rows.append({"t": t, "written": slot,
                     "slots": [None if x == EMPTY else int(x) for x in after.tolist()],
                     "overwritten": None if before[slot] == EMPTY else int(before[slot]),
                     "positions": cache.positions().tolist()})
    return rows


def draw_ring_buffer(window: int = 4, steps: int = 10, ax=None):
    """The ring buffer over `steps` generation steps: a row per step, a column per slot.

    Each cell shows the position its slot holds after that step, read from the cache; the slot
    just written (t mod W) is orange, with the position it overwrote. Returns the Axes.
    """
    rows = ring_buffer_steps(window, steps)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * window + 3.2, 0.36 * steps + 1.2))
    for r in rows:
        y = r["t"]
        for slot, held in enumerate(r["slots"]):
            new = slot == r["written"]
            colour = "tab:orange" if new else ("whitesmoke" if held is None else "#cfe2f3")
            ax.add_patch(plt.Rectangle((slot - 0.46, y - 0.42), 0.92, 0.84, color=colour,
                                       ec="grey", lw=0.5))
            label = "" if held is None else str(held)
            ax.text(slot, y, label, ha="center", va="center", fontsize=9,
                    fontweight="bold" if new else "normal", gid=f"slot {slot} step {y}")
            if new and r["overwritten"] is not None:
                ax.text(slot + 0.42, y + 0.3, f"over {r['overwritten']}", ha="right",
                        va="bottom", fontsize=7, color="black")
    ax.set_xlim(-0.6, window - 0.4)
    ax.set_ylim(steps - 0.5, -0.5)
    ax.set_xticks(range(window), [f"slot {s}" for s in range(window)], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(steps), [f"t = {t}: {t} mod {window} = {t % window}" for t in range(steps)],
                  fontsize=8)
    ax.set_ylabel("generation step (token t written)")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"RingKVCache, W = {window}: the position each slot holds after step t\n"
                 f"(orange: written now, into slot t mod W, over token t - W)", fontsize=9)
    return ax


def head_groups(num_heads: int, num_kv_heads: int) -> list[int]:
    """The K/V head each of the h query heads reads, as `grouped_query_attention` computes it.

    Runs the course's function on one key whose value is its own K/V head's index: query head
    i's output is then the index of the K/V head it attended with.
    """
    h = check_count(num_heads, "num_heads")
    g = check_kv_heads(h, num_kv_heads)
    q = torch.zeros(h, 1, 1, dtype=torch.float64)                            # (h, n_q=1, d=1)
    k = torch.zeros(g, 1, 1, dtype=torch.float64)                            # (g, n_k=1, d=1)
    v = torch.arange(g, dtype=torch.float64).reshape(g, 1, 1)               # value = head index
    out, _ = grouped_query_attention(q, k, v)                               # (h, 1, 1)
    return [int(x) for x in out.flatten().tolist()]


def _draw_groups(ax, h: int, g: int) -> None:
    groups = head_groups(h, g)
    colours = plt.get_cmap("tab10" if g <= 10 else "viridis")
    colour = (lambda j: colours(j)) if g <= 10 else (lambda j: colours(j / max(g - 1, 1)))
    kv_x = [sum(i for i in range(h) if groups[i] == j) / groups.count(j) for j in range(g)]
    for i, j in enumerate(groups):
        ax.plot([i, kv_x[j]], [1, 0], "-", color=colour(j), lw=1.4, gid=f"q{i}-kv{j}")
    for i, j in enumerate(groups):
        ax.text(i, 1, f"Q{i}", ha="center", va="center", fontsize=8, gid=f"query {i}",
                bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": colour(j)})
    for j in range(g):
        ax.text(kv_x[j], 0, f"K/V {j}", ha="center", va="center", fontsize=8, gid=f"kv {j}",
                bbox={"boxstyle": "round,pad=0.3", "fc": colour(j), "ec": "black", "alpha": 0.9})
    ax.text(-0.6, 1, "query heads", ha="right", va="center", fontsize=8)
    ax.text(-0.6, 0, "K/V heads", ha="right", va="center", fontsize=8)
    name = "multi-head" if g == h else "multi-query" if g == 1 else "grouped-query"
    ax.set_title(f"{name}: h = {h} query heads read g = {g} K/V heads "
                 f"(a KV cache {h // g}x smaller than multi-head's)" if g < h else
                 f"{name}: h = {h} query heads, g = {g} K/V heads, one each", fontsize=9)
    ax.set_xlim(-2.4, h - 0.3)
    ax.set_ylim(-0.35, 1.35)
    ax.axis("off")


def draw_head_groups(num_heads: int = 8, kv_heads=(8, 2, 1), axes=None):
    """One panel per g in `kv_heads`: the h query heads (top) joined to the K/V head each reads
    (bottom), from `head_groups`. g = h is multi-head attention, g = 1 multi-query. Returns the
    list of Axes."""
    h = check_count(num_heads, "num_heads")
    kv_heads = list(kv_heads) if not isinstance(kv_heads, int) else [kv_heads]
    if not kv_heads:
        raise ValueError("kv_heads must name at least one number of K/V heads, got none")
    gs = [check_kv_heads(h, g, f" (kv_heads={kv_heads})") for g in kv_heads]
    if axes is None:
        fig, axes = plt.subplots(len(gs), 1, figsize=(0.75 * h + 2.5, 1.5 * len(gs) + 0.2),
                                 squeeze=False)
        axes = list(axes[:, 0])
        fig.subplots_adjust(hspace=0.45, left=0.02, right=0.98, top=0.92, bottom=0.04)
    elif len(axes) != len(gs):
        raise ValueError(f"axes holds {len(axes)} Axes but kv_heads asks for {len(gs)} panels")
    for ax, g in zip(axes, gs):
        _draw_groups(ax, h, g)
    return axes
