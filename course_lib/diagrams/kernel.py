"""Chapter 08's picture: the tiled loop as a grid of query blocks x key blocks.

    tiled_loop_steps(q, k, v, query_block, block_size, causal)   one query block's walk over
                                                                 the key blocks, with (m, l, acc)
                                                                 after every tile
    draw_tiled_loop(q, k, v, query_block, block_size, causal)    the grid and the numbers

The steps are the course's own tiled reference run one key block at a time: the stages of
`course_lib.flash.tiled` (which key blocks a query block visits, and which one the causal mask
cuts) and its inner loop (`_attn_fwd_inner`, the online-softmax update), so the numbers drawn are
the ones `tiled_attention` computes.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from course_lib.flash.tiled import _attn_fwd_inner, _stages
from course_lib.validate import check_attention, check_count, default_scale, wrong_shape


def tiled_loop_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_block: int,
                     block_size: int, causal: bool = False) -> dict:
    """Walk one query block over its key blocks as `tiled_attention` does, tile by tile.

    q: (n_q, d), k: (n_k, d), v: (n_k, d_v): one head. Returns a dict: `grid` (query blocks,
    key blocks), `query_block`, `rows` (the query positions of the block), `steps` (one per
    tile visited, in order: `key_block`, `masked` (the causal mask cuts it), and the running
    `m` (rows,), `l` (rows,), `acc` (rows, d_v) after it), and `out` = acc / l (rows, d_v).
    """
    check_attention(q, k, v, causal=causal)
    for name, t, wanted in (("q", q, "(n_q, d)"), ("k", k, "(n_k, d)"), ("v", v, "(n_k, d_v)")):
        if t.ndim != 2:
            raise wrong_shape(name, t, f"{wanted}: one head, no batch dims, for the picture")
    block_size = check_count(block_size, "block_size")
    n_q, n_k = q.shape[0], k.shape[0]
    grid = (math.ceil(n_q / block_size), math.ceil(n_k / block_size))
    query_block = check_count(query_block, "query_block", minimum=0)
    if query_block >= grid[0]:
        raise ValueError(f"query_block must be in 0..{grid[0] - 1} ({n_q} queries in blocks of "
                         f"{block_size}), got {query_block}")
    start_m = query_block * block_size
    q_blk = q[None, start_m:start_m + block_size] * default_scale(None, q)  # (1, rows, d)
    k3, v3 = k[None], v[None]                                               # (1, n_k, d)
    rows = q_blk.shape[1]
    m_i = torch.full((1, rows), float("-inf"), dtype=q.dtype)                # running max
    l_i = torch.zeros(1, rows, dtype=q.dtype)                                # running sum
    acc = torch.zeros(1, rows, v.shape[-1], dtype=q.dtype)                   # running output
    steps = []
    for lo, hi, diagonal, edge in _stages(start_m, rows, n_k, block_size, causal, None):
        for start_n in range(lo, hi, block_size):   # the inner loop, stopped after each tile
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q_blk, k3, v3, start_m, start_n,
                                            min(start_n + block_size, hi), block_size,
                                            diagonal, edge)
            steps.append({"key_block": start_n // block_size, "masked": diagonal,
                          "m": m_i[0].clone(), "l": l_i[0].clone(), "acc": acc[0].clone()})
    return {"grid": grid, "query_block": query_block, "causal": causal, "steps": steps,
            "rows": list(range(start_m, start_m + rows)), "out": (acc / l_i[..., None])[0]}


def _fmt(x: torch.Tensor) -> str:
    return "(" + ", ".join(f"{float(a):.2f}" for a in x) + ")"


def draw_tiled_loop(q, k, v, query_block: int, block_size: int, causal: bool = True,
                    row: int | None = None, fig=None):
    """The grid of query blocks x key blocks and one query block's walk over it.

    Left: every tile; the query block's tiles numbered in the order the loop visits them, the
    one the causal mask cuts hatched, the ones the causal loop never computes grey. Right: the
    running max m, sum l and output acc of one of the block's queries (`row`, default its last)
    after each tile, the factor alpha that rescaled what came before, then out = acc / l.
    Returns the figure.
    """
    trace = tiled_loop_steps(q, k, v, query_block, block_size, causal)
    n_rows = len(trace["rows"])
    row = n_rows - 1 if row is None else check_count(row, "row", minimum=0)
    if row >= n_rows:
        raise ValueError(f"row must be in 0..{n_rows - 1} (query block {query_block} holds "
                         f"{n_rows} queries), got {row}")
    n_qb, n_kb = trace["grid"]
    order = {s["key_block"]: i + 1 for i, s in enumerate(trace["steps"])}
    if fig is None:
        fig = plt.figure(figsize=(11, 0.5 * max(n_qb, len(order) + 3) + 1.6))
    ax, ax_t = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.5]})

    for qb in range(n_qb):
        for kb in range(n_kb):
            skipped = causal and kb > qb
            if qb == query_block and kb in order:
                masked = trace["steps"][order[kb] - 1]["masked"]
                patch = plt.Rectangle((kb, qb), 1, 1, fc="tab:orange", ec="black", lw=1.2,
                                      hatch="//" if masked else None)
                ax.add_patch(patch)
                ax.text(kb + 0.5, qb + 0.5, str(order[kb]), ha="center", va="center",
                        fontsize=12, fontweight="bold", gid=f"step {order[kb]}: tile "
                        f"({qb}, {kb})", bbox={"boxstyle": "circle,pad=0.2", "fc": "white"})
            else:
                fc = "lightgrey" if skipped else "#dbe9f6"
                ax.add_patch(plt.Rectangle((kb, qb), 1, 1, fc=fc, ec="white", lw=1.5))
                if skipped:
                    ax.text(kb + 0.5, qb + 0.5, "skipped", ha="center", va="center",
                            fontsize=7, color="dimgrey")
    ax.set_xlim(0, n_kb)
    ax.set_ylim(n_qb, 0)
    ax.set_aspect("equal")
    ax.set_xticks([b + 0.5 for b in range(n_kb)],
                  [f"{b * block_size}-{min((b + 1) * block_size, k.shape[0]) - 1}"
                   for b in range(n_kb)], fontsize=8)
    ax.set_yticks([b + 0.5 for b in range(n_qb)],
                  [f"{b * block_size}-{min((b + 1) * block_size, q.shape[0]) - 1}"
                   for b in range(n_qb)], fontsize=8)
    ax.set_xlabel("key block (positions)")
    ax.set_ylabel("query block (positions)")
    ax.tick_params(length=0)
    kind = "causal" if causal else "no mask"
    ax.set_title(f"{kind}, blocks of {block_size}: query block {query_block} visits "
                 f"{len(order)} of {n_kb} key blocks\n(orange, in order; // = masked inside; "
                 f"blue: the other query blocks' tiles)", fontsize=9)

    i = trace["rows"][row]
    cells, m_old = [], float("-inf")
    for n, s in enumerate(trace["steps"], start=1):
        m_new = float(s["m"][row])
        cells.append([str(n), f"{s['key_block']}" + (" (masked)" if s["masked"] else ""),
                      f"{m_new:.3f}", f"{math.exp(m_old - m_new):.3f}",
                      f"{float(s['l'][row]):.3f}", _fmt(s["acc"][row])])
        m_old = m_new
    cells.append(["end", "", "", "", "", f"out = acc / ℓ = {_fmt(trace['out'][row])}"])
    ax_t.axis("off")
    table = ax_t.table(cellText=cells,
                       colLabels=["step", "key block", "m", "α", "ℓ", "acc"],
                       loc="center", cellLoc="center",
                       colWidths=[0.08, 0.17, 0.13, 0.13, 0.13, 0.36])
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.5)
    ax_t.set_title(f"query {i} (row {row} of block {query_block}) after each tile", fontsize=9)
    ax_t.text(0.5, 0.3, "m: running max of the scaled scores;  α = exp(m_old - m): what rescaled"
              "\nthe old ℓ and acc;  ℓ: running sum;  acc: running output (not yet / ℓ)",
              ha="center", va="top", fontsize=8, transform=ax_t.transAxes)
    fig.tight_layout()
    return fig
