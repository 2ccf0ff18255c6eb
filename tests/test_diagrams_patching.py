"""Chapter 11's pictures draw what the code does: the patching set-up's arrows are the routes
`patch_queries_keys` takes (read from a hook on block 1's attention), and the route picture's
arcs end where the given attention weights are largest."""

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.patches import FancyArrowPatch

from course_lib.diagrams.patching import draw_patching, draw_route, patching_routes, route_arcs

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _arrows(ax):
    return {p.get_gid(): p for p in ax.patches if isinstance(p, FancyArrowPatch)}


@pytest.mark.parametrize("patch,ablated", [("none", set()), ("queries", {"Q"}), ("keys", {"K"}),
                                           ("both", {"Q", "K"})])
def test_patching_routes_are_what_patch_queries_keys_does(patch, ablated):
    routes = patching_routes(patch)
    assert routes == {s: "ablated" if s in ablated else "clean" for s in "QKV"}


@pytest.mark.parametrize("patch", ["queries", "keys", "both", "none"])
def test_draw_patching_draws_one_arrow_per_side_from_its_stream_and_reds_the_patched(patch):
    ax = draw_patching(patch)
    arrows = _arrows(ax)
    routes = patching_routes(patch)
    into = {gid.split("->")[1]: gid.split("->")[0] for gid in arrows
            if gid.split("->")[1] in "QKV"}
    assert into == routes  # one arrow into each of Q, K, V, from the stream the code uses
    red = {gid for gid, a in arrows.items()
           if matplotlib.colors.same_color(a.get_edgecolor(), "tab:red")}
    assert red == {f"ablated->{s}" for s, src in routes.items() if src == "ablated"}
    assert "clean->residual" in arrows and patch in ax.get_title()


def test_route_arcs_end_at_the_largest_weight_and_keep_those_above_threshold():
    w0 = torch.tensor([0.05, 0.7, 0.0, 0.25, 0.0])  # from word 3: strongest onto word 1
    w1 = torch.tensor([0.1, 0.1, 0.4, 0.4, 0.0])  # from word 4: a tie, the lower position wins
    arcs = route_arcs([(0, 3, w0), (1, 4, w1)], 5, threshold=0.2)
    strongest = [(a["layer"], a["query"], a["key"]) for a in arcs if a["strongest"]]
    assert strongest == [(0, 3, 1), (1, 4, 2)]
    assert {(a["layer"], a["key"]) for a in arcs} == {(0, 1), (0, 3), (1, 2), (1, 3)}
    below = route_arcs([(0, 2, torch.tensor([0.01, 0.02, 0.03, 0.0]))], 4, threshold=0.5)
    assert [(a["key"], a["strongest"]) for a in below] == [(2, True)]  # always the strongest


def test_draw_route_draws_an_arrow_per_arc_between_the_words_it_names():
    words = ["box", "held", "no", "ball", ",", "too", "big", "at", "the", "box"]
    w_thing = torch.zeros(10)
    w_thing[[0, 3]] = torch.tensor([0.9, 0.1])
    w_last = torch.zeros(10)
    w_last[[3, 9]] = torch.tensor([0.97, 0.03])
    fig, ax = plt.subplots()
    arcs = draw_route(words, [(0, 3, w_thing), (1, 9, w_last)], ax, threshold=0.1,
                      labels={0: "the thing reads its container"})
    arrows = _arrows(ax)
    assert set(arrows) == {f"layer {a['layer']}: {a['query']} -> {a['key']}" for a in arcs}
    assert set(arrows) == {"layer 0: 3 -> 0", "layer 0: 3 -> 3", "layer 1: 9 -> 3"}
    path = {(a["query"], a["key"]): a["path"] for a in arcs}
    assert path[9, 3][0][0] == 9 and path[9, 3][-1][0] == 3 and path[9, 3][1][1] < 0  # below
    for a in arcs:  # the arrow drawn follows that path
        drawn_path = arrows[f"layer {a['layer']}: {a['query']} -> {a['key']}"]._path_original
        assert drawn_path.vertices.tolist() == [list(v) for v in a["path"]]
    assert path[3, 0][0][0] == 3 and path[3, 0][-1][0] == 0 and path[3, 0][1][1] > 0  # above
    drawn = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("word")]
    assert drawn == words
    assert {"0.90", "0.97"} <= {t.get_text() for t in ax.texts}
    assert "the thing reads its container" in ax.get_legend().get_texts()[0].get_text()


@pytest.mark.parametrize("call,match", [
    (lambda: patching_routes("values"), r"patch must be one of \('none', 'queries', 'keys', "),
    (lambda: draw_patching("q"), "patch must be one of"),
    (lambda: route_arcs([], 3), "hops must be a non-empty list"),
    (lambda: route_arcs([(0, 1)], 3), r"hops\[0\] must be \(layer, query, weights\)"),
    (lambda: route_arcs([(0, 1, torch.ones(4))], 3),
     r"hops\[0\]'s weights have shape \(4,\), wanted \(3,\)"),
    (lambda: route_arcs([(0, 5, torch.ones(3))], 3), r"hops\[0\]'s query is position 5"),
    (lambda: route_arcs([(-1, 0, torch.ones(3))], 3), r"hops\[0\]'s layer must be an integer"),
    (lambda: route_arcs([(0, 0, torch.tensor([1.0, float("nan"), 0]))], 3), "finite and >= 0"),
    (lambda: route_arcs([(0, 0, torch.ones(3))], 3, threshold=0), "threshold must be"),
    (lambda: draw_route(["a", 2], [(0, 0, torch.ones(2))]), "words must be a non-empty list"),
])
def test_bad_input_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()
