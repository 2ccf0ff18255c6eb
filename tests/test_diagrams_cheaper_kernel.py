"""Chapter 08's tiled-loop picture and chapter 09's ring-buffer and head-group pictures draw what
the course's code does: the labels drawn are read back and compared with the code's own state."""

import math

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

import course_lib.flash.tiled as tiled_module
from course_lib.diagrams.cheaper import (
    draw_head_groups,
    draw_ring_buffer,
    head_groups,
    ring_buffer_steps,
)
from course_lib.diagrams.kernel import draw_tiled_loop, tiled_loop_steps
from course_lib.flash import tiled_attention

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(ax, prefix):
    return {t.get_gid(): t for t in ax.texts if (t.get_gid() or "").startswith(prefix)}


# ------------------------------------------------------------------ the ring buffer (ch 09)

@pytest.mark.parametrize("window, steps", [(1, 3), (3, 8), (4, 4), (6, 13)])
def test_ring_steps_follow_the_cache(window, steps):
    rows = ring_buffer_steps(window, steps)
    assert [r["t"] for r in rows] == list(range(steps))
    for r in rows:
        t = r["t"]
        assert r["written"] == t % window and r["slots"][r["written"]] == t
        assert r["overwritten"] == (t - window if t >= window else None)
        held = [p for p in r["slots"] if p is not None]
        assert held == r["positions"]          # what RingKVCache.positions() says it holds
        assert sorted(held) == list(range(max(0, t + 1 - window), t + 1))


def test_ring_picture_labels_are_the_slot_contents():
    window, steps = 4, 9
    ax = draw_ring_buffer(window, steps)
    labels = _texts(ax, "slot ")
    assert len(labels) == window * steps
    for r in ring_buffer_steps(window, steps):
        for slot, held in enumerate(r["slots"]):
            text = labels[f"slot {slot} step {r['t']}"]
            assert text.get_text() == ("" if held is None else str(held))
            assert text.get_position() == (slot, r["t"])
    assert [t.get_text() for t in ax.get_yticklabels()][5] == "t = 5: 5 mod 4 = 1"


def test_ring_refuses_bad_arguments():
    with pytest.raises(ValueError, match="window must be a positive integer"):
        draw_ring_buffer(window=0)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        ring_buffer_steps(3, steps=2.5)


# ------------------------------------------------------------------ GQA's head groups (ch 09)

@pytest.mark.parametrize("h, g", [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3), (1, 1)])
def test_head_groups_are_the_consecutive_groups_sdpa_uses(h, g):
    # enable_gqa repeats each K/V head h/g times in a row: query head i reads K/V head i // (h/g)
    want = torch.arange(g).repeat_interleave(h // g).tolist()
    assert head_groups(h, g) == want


def test_head_group_edges_join_each_query_head_to_its_kv_head():
    h, kv = 8, (8, 2, 1)
    axes = draw_head_groups(h, kv)
    assert len(axes) == len(kv)
    for ax, g in zip(axes, kv):
        queries = {t.get_position(): int(t.get_gid().split()[1]) for t in ax.texts
                   if (t.get_gid() or "").startswith("query ")}
        kvs = {t.get_position(): int(t.get_gid().split()[1]) for t in ax.texts
               if (t.get_gid() or "").startswith("kv ")}
        assert sorted(queries.values()) == list(range(h)) and sorted(kvs.values()) == list(range(g))
        edges = {}
        for line in ax.lines:                 # read from where each line starts and ends
            (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
            edges[queries[(x0, y0)]] = kvs[(x1, y1)]
        assert [edges[i] for i in range(h)] == head_groups(h, g)


def test_head_groups_refuse_bad_arguments():
    with pytest.raises(ValueError, match="num_heads=8 is not divisible by num_kv_heads=3"):
        head_groups(8, 3)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        draw_head_groups(0)
    with pytest.raises(ValueError, match="kv_heads must name at least one"):
        draw_head_groups(8, ())
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        draw_head_groups(8, (8, 3))


# ------------------------------------------------------------------ the tiled loop (ch 08)

def _qkv(n=20, d=4, d_v=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, d, generator=g), \
        torch.randn(n, d_v, generator=g)


def _blocks_tiled_attention_visits(monkeypatch, q, k, v, block, causal, query_block):
    """Run tiled_attention itself and record the key blocks its inner loop walks."""
    visited, inner = [], tiled_module._attn_fwd_inner

    def recording(acc, l_i, m_i, q_blk, k3, v3, start_m, lo, hi, block_size, *rest):
        if start_m == query_block * block_size:
            visited.extend(range(lo // block_size, math.ceil(hi / block_size)))
        return inner(acc, l_i, m_i, q_blk, k3, v3, start_m, lo, hi, block_size, *rest)

    monkeypatch.setattr(tiled_module, "_attn_fwd_inner", recording)
    out, lse = tiled_attention(q, k, v, causal=causal, block_size=block)
    return visited, out, lse


@pytest.mark.parametrize("n, block, causal, query_block",
                         [(20, 4, True, 2), (20, 4, False, 2), (18, 4, True, 4), (7, 8, True, 0)])
def test_tiled_steps_are_the_loops_tiles_and_numbers(monkeypatch, n, block, causal, query_block):
    q, k, v = _qkv(n)
    trace = tiled_loop_steps(q, k, v, query_block, block, causal)
    visited, out, lse = _blocks_tiled_attention_visits(monkeypatch, q, k, v, block, causal,
                                                       query_block)
    assert [s["key_block"] for s in trace["steps"]] == visited
    assert [s["masked"] for s in trace["steps"]] == [causal and kb == query_block
                                                    for kb in visited]
    rows = trace["rows"]
    torch.testing.assert_close(trace["out"], out[rows[0]:rows[-1] + 1])
    last = trace["steps"][-1]
    torch.testing.assert_close(last["m"] + torch.log(last["l"]), lse[rows[0]:rows[-1] + 1])


def test_tiled_picture_numbers_the_visited_tiles_in_order(monkeypatch):
    q, k, v = _qkv(20)
    fig = draw_tiled_loop(q, k, v, query_block=2, block_size=4, causal=True)
    grid_ax, table_ax = fig.axes
    visited, _, _ = _blocks_tiled_attention_visits(monkeypatch, q, k, v, 4, True, 2)
    steps = sorted(_texts(grid_ax, "step ").values(), key=lambda t: int(t.get_text()))
    assert [int(t.get_text()) for t in steps] == list(range(1, len(visited) + 1))
    assert [(math.floor(t.get_position()[1]), math.floor(t.get_position()[0])) for t in steps] \
        == [(2, kb) for kb in visited]
    skipped = [t.get_position() for t in grid_ax.texts if t.get_text() == "skipped"]
    assert sorted((math.floor(y), math.floor(x)) for x, y in skipped) == \
        [(qb, kb) for qb in range(5) for kb in range(5) if kb > qb]
    trace = tiled_loop_steps(q, k, v, 2, 4, True)
    cells = table_ax.tables[0].get_celld()
    for n, s in enumerate(trace["steps"], start=1):   # row 3 of the block (query 11), by default
        assert cells[n, 2].get_text().get_text() == f"{float(s['m'][3]):.3f}"
        assert cells[n, 4].get_text().get_text() == f"{float(s['l'][3]):.3f}"


def test_tiled_picture_refuses_bad_arguments():
    q, k, v = _qkv(20)
    with pytest.raises(ValueError, match=r"query_block must be in 0\.\.4"):
        tiled_loop_steps(q, k, v, query_block=5, block_size=4)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        tiled_loop_steps(q, k, v, query_block=0, block_size=0)
    with pytest.raises(ValueError, match=r"q has shape \(1, 20, 4\)"):
        tiled_loop_steps(q[None], k[None], v[None], query_block=0, block_size=4)
    with pytest.raises(ValueError, match="k has d_k=3"):
        tiled_loop_steps(q, k[:, :3], v, query_block=0, block_size=4)
    with pytest.raises(ValueError, match=r"row must be in 0\.\.3"):
        draw_tiled_loop(q, k, v, query_block=0, block_size=4, row=4)
