"""Chapter 11's pictures: the patching set-up, and the two-hop route on one sentence.

    patching_routes(patch)               which stream, clean or ablated, each of block 1's
                                         queries, keys and values is computed from, found by
                                         running `composition.patch_queries_keys` itself
    draw_patching(patch, ax)             the two streams feeding block 1's Q, K and V, the
                                         patched arrow in red
    route_arcs(hops, threshold)          the arcs a route picture draws: from each query to the
                                         keys it weighs at least `threshold`
    draw_route(words, hops, ax)          those arcs over the words of one sentence: layer 0 above
                                         the words, layer 1 below, the strongest arc labelled

Both are drawn from the course's own code and a trained model's attention, so a picture cannot
disagree with what the lecture measures.
"""

from __future__ import annotations

import functools
import numbers

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch
from matplotlib.path import Path

from course_lib.models import TinyTransformer
from course_lib.stacking.composition import PATCHES, patch_queries_keys, stream_before
from course_lib.validate import check_choice, check_number

SIDES = ("Q", "K", "V")
PATCHED = "tab:red"  # the arrow a patch changes
CLEAN = "0.25"


def patching_routes(patch: str = "queries") -> dict[str, str]:
    """{"Q": ..., "K": ..., "V": ...}: "clean" or "ablated", the stream each of block 1's
    attention inputs is computed from under `patch` ("none", "queries", "keys" or "both").

    Found by running `patch_queries_keys` on a tiny model with a hook on block 1's attention
    that records what it is given, and comparing that with ln1 of each stream.
    """
    return dict(_routes(check_choice(patch, "patch", PATCHES)))


@functools.cache
@torch.no_grad()
def _routes(patch: str) -> tuple[tuple[str, str], ...]:
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
        torch.manual_seed(0)
        model = TinyTransformer(5, 4, 1, 2, 4).eval()  # any weights: routes, not values
    tokens = torch.tensor([[1, 2, 3]])
    clean = stream_before(model, tokens, 1)  # (1, 3, 4)
    ablated = clean.flip(1) + 1.0  # any other stream will do
    seen = {}

    def record(module, args, kwargs):
        seen.update(zip(SIDES, args[:3]))

    block = model.blocks[1]
    handle = block.attn.register_forward_pre_hook(record, with_kwargs=True)
    try:
        patch_queries_keys(model, tokens, ablated, 1, patch)
    finally:
        handle.remove()
    streams = {"clean": block.ln1(clean), "ablated": block.ln1(ablated)}
    routes = {}
    for side in SIDES:
        found = [name for name, s in streams.items() if torch.equal(seen[side], s)]
        if len(found) != 1:
            raise RuntimeError(f"block 1's {side} input is neither ln1(clean) nor ln1(ablated)")
        routes[side] = found[0]
    return tuple(routes.items())


def _box(ax, x, y, text, colour, gid, width=2.6, height=0.62, fontsize=9):
    ax.add_patch(plt.Rectangle((x - width / 2, y - height / 2), width, height, fc=colour,
                               ec="0.3", lw=0.8, gid=gid))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, start, end, colour, lw, gid, rad=0.0, style="-|>"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=colour,
                                 lw=lw, gid=gid, connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=2, shrinkB=2))


def draw_patching(patch: str = "queries", ax=None):
    """The patching set-up for `patch`: the clean and the ablated stream entering block 1, an
    arrow from the stream each of Q, K and V is computed from (`patching_routes`), the arrows
    from the ablated stream in red, and the residual and MLP reading the clean stream.

    Arrows carry gids "clean->Q", "ablated->K", ... Returns the Axes.
    """
    routes = patching_routes(patch)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.0))
    y_of = {"clean": 2.1, "ablated": 0.2}
    _box(ax, 0, y_of["clean"], "clean stream\n(block 0 as trained)", "#cfe2f3", "clean")
    _box(ax, 0, y_of["ablated"], "ablated stream\n(block 0's heads zeroed)", "#f4cccc",
         "ablated")
    port_y = {"Q": 2.0, "K": 1.15, "V": 0.3}
    names = {"Q": "queries", "K": "keys", "V": "values"}
    for side, y in port_y.items():
        from_ablated = routes[side] == "ablated"
        _box(ax, 3.6, y, f"{side}: ln1(·) → W_{side}  ({names[side]})",
             "#fde9d9" if from_ablated else "white", f"port {side}", width=2.5, height=0.5,
             fontsize=8)
        source = routes[side]
        _arrow(ax, (1.3, y_of[source]), (2.35, y), PATCHED if from_ablated else CLEAN,
               2.6 if from_ablated else 1.1, f"{source}->{side}")
    _box(ax, 6.0, 1.15, "block 1\nattention", "#eeeeee", "attention", width=1.2, height=2.3)
    for side, y in port_y.items():
        _arrow(ax, (4.85, y), (5.4, y), "0.5", 0.8, f"{side}->attention")
    _box(ax, 6.0, 3.05, "+ residual, MLP, later blocks → logits", "#eeeeee", "rest", width=3.6,
         height=0.45, fontsize=8)
    _arrow(ax, (6.0, 2.3), (6.0, 2.82), "0.5", 0.8, "attention->rest")
    _arrow(ax, (0, 2.41), (4.2, 3.05), CLEAN, 1.1, "clean->residual", rad=-0.15)
    patched = [s for s in SIDES if routes[s] == "ablated"]
    what = (" and ".join(names[s] for s in patched) + " from the ablated stream") if patched \
        else "nothing patched: the model as trained"
    ax.set_title(f"patch={patch!r}: block 1's {what}" if patched else f"patch={patch!r}: {what}",
                 fontsize=9)
    ax.set_xlim(-1.45, 7.9)
    ax.set_ylim(-0.25, 3.4)
    ax.set_aspect("auto")
    ax.axis("off")
    return ax


# ---------------------------------------------------------------------- the route on a sentence

def _check_hops(hops, n: int) -> list[tuple[int, int, torch.Tensor]]:
    if not isinstance(hops, (list, tuple)) or not hops:
        raise ValueError(f"hops must be a non-empty list of (layer, query, weights), got {hops!r}")
    checked = []
    for i, hop in enumerate(hops):
        if not isinstance(hop, (list, tuple)) or len(hop) != 3:
            raise ValueError(f"hops[{i}] must be (layer, query, weights), got {hop!r}")
        layer, query, weights = hop
        for name, v in (("layer", layer), ("query", query)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"hops[{i}]'s {name} must be an integer >= 0, got {v!r}")
        weights = torch.as_tensor(weights, dtype=torch.float64)
        if weights.shape != (n,):
            raise ValueError(f"hops[{i}]'s weights have shape {tuple(weights.shape)}, wanted "
                             f"({n},): one weight per word")
        if query >= n:
            raise ValueError(f"hops[{i}]'s query is position {query}, but there are {n} words")
        if not torch.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"hops[{i}]'s weights must be finite and >= 0 (attention weights)")
        checked.append((int(layer), int(query), weights))
    return checked


def route_arcs(hops, n: int, threshold: float = 0.1) -> list[dict]:
    """The arcs of a route picture over n words. hops: (layer, query, weights (n,)) each, the
    attention weights of one head from the word at `query` onto every word.

    One arc from the query to each word it gives at least `threshold`, and always one to the
    word it weighs most (`strongest`; the lowest position among ties). Returns dicts with
    layer, query, key, weight, strongest.
    """
    threshold = check_number(threshold, "threshold", above=0)
    arcs = []
    for layer, query, weights in _check_hops(hops, n):
        best = int(weights.argmax())
        for key in range(n):
            if key == best or weights[key] >= threshold:
                arcs.append({"layer": layer, "query": query, "key": key,
                             "weight": float(weights[key]), "strongest": key == best})
    return arcs


def draw_route(words, hops, ax=None, threshold: float = 0.1, labels: dict | None = None):
    """Attention's route over one sentence: the words in a row, an arrow from each hop's query
    to every word it weighs at least `threshold` (line width by weight, the strongest labelled
    with its weight), even layers above the words, odd layers below.

    words: the sentence's tokens as strings; hops: (layer, query, weights (len(words),)) each;
    labels: {layer: text} for the legend (e.g. "head 3: the thing reads its container").
    Arrows carry gids "layer L: q -> k". Returns the list of arcs drawn (`route_arcs`), each
    with the `path` it was drawn along: (start, control point, end) in data coordinates.
    """
    words = list(words)
    if not words or not all(isinstance(w, str) for w in words):
        raise ValueError(f"words must be a non-empty list of strings, got {words!r}")
    arcs = route_arcs(hops, len(words), threshold)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.62 * len(words) + 1, 3.4))
    layers = sorted({a["layer"] for a in arcs})
    colour = {layer: f"C{i}" for i, layer in enumerate(layers)}
    queries = {(a["layer"], a["query"]) for a in arcs}
    for x, word in enumerate(words):
        is_query = any(q == x for _, q in queries)
        ax.text(x, 0, word, ha="center", va="center", fontsize=9, gid=f"word {x}",
                fontweight="bold" if is_query else "normal")
    peaks = []
    for a in arcs:
        above = a["layer"] % 2 == 0
        sign = 1 if above else -1
        y = 0.25 * sign
        lift = sign * (0.4 + 0.3 * abs(a["query"] - a["key"]))  # the control point's height
        a["path"] = [(a["query"], y), ((a["query"] + a["key"]) / 2, y + lift), (a["key"], y)]
        path = Path(a["path"], [Path.MOVETO, Path.CURVE3, Path.CURVE3])  # a parabola, data coords
        ax.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=10,
                                     lw=0.6 + 3.5 * a["weight"], color=colour[a["layer"]],
                                     alpha=1.0 if a["strongest"] else 0.45,
                                     gid=f"layer {a['layer']}: {a['query']} -> {a['key']}"))
        peak = y + lift / 2  # a quadratic Bezier reaches half its control point's height
        peaks.append(peak)
        if a["strongest"]:
            ax.text((a["query"] + a["key"]) / 2, peak + 0.12 * sign, f"{a['weight']:.2f}",
                    ha="center", va="bottom" if above else "top", fontsize=9,
                    color=colour[a["layer"]])
    for layer in layers:
        text = f", {labels[layer]}" if labels and layer in labels else ""
        ax.plot([], [], color=colour[layer], lw=2.5,
                label=f"layer {layer}{text} ({'above' if layer % 2 == 0 else 'below'})")
    top, bottom = max(peaks + [0.3]) + 0.6, min(peaks + [-0.3]) - 0.6
    ax.set_xlim(-0.7, len(words) - 0.3)
    ax.set_ylim(bottom, top)
    ax.legend(fontsize=8, loc="lower left", frameon=False)
    ax.axis("off")
    return arcs
