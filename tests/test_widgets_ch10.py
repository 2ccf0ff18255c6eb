"""Chapter 10's layer/head explorer: choosing another layer or head redraws that head's map."""

import numpy as np
import pytest
import torch

from course_lib.widgets import Explorer, layer_head_explorer


def weights(n=6):
    prev = torch.zeros(n, n)
    prev[0, 0] = 1
    prev[torch.arange(1, n), torch.arange(n - 1)] = 1  # the previous character
    first = torch.zeros(n, n)
    first[:, 0] = 1                                     # the first character
    own = torch.eye(n)                                  # itself
    uniform = torch.tril(torch.ones(n, n))
    uniform = uniform / uniform.sum(-1, keepdim=True)   # everything so far, evenly
    return torch.stack([torch.stack([prev, first]), torch.stack([own, uniform])])  # (2, 2, n, n)


JOBS = [{"layer": 0, "head": 0, "job": "previous token", "previous token": 0.9},
        {"layer": 0, "head": 1, "job": "no clear job", "previous token": 0.1},
        {"layer": 1, "head": 0, "job": "current token", "current token": 1.0},
        {"layer": 1, "head": 1, "job": "no clear job", "current token": 0.3}]


@pytest.fixture
def explorer():
    return layer_head_explorer(weights(), list("if x:\n"), jobs=JOBS)


def shown(explorer):
    """The drawn weights, with the masked cells (not-a-number: drawn as x) read as 0."""
    return np.nan_to_num(np.asarray(explorer.figure.axes[0].images[0].get_array(), dtype=float))


def test_masked_cells_are_drawn_as_x_not_as_weight_0(explorer):
    drawn = np.asarray(explorer.figure.axes[0].images[0].get_array(), dtype=float)
    n = drawn.shape[0]
    above = np.triu(np.ones((n, n), dtype=bool), 1)  # a causal map: every later key is masked
    assert np.isnan(drawn[above]).all() and not np.isnan(drawn[~above]).any()
    crosses = explorer.figure.axes[0].collections[0].get_offsets()
    assert len(crosses) == above.sum()
    assert "masked" in explorer.figure.axes[1].get_ylabel()


def test_layer_and_head_selectors_redraw_the_chosen_map(explorer):
    assert isinstance(explorer, Explorer) and explorer.redraws == 1
    np.testing.assert_allclose(shown(explorer), weights()[0, 0].numpy())
    assert explorer.figure.axes[0].get_title() == "layer 0, head 0: previous token 0.90"
    png = explorer.png_bytes()
    explorer.update(layer=1)
    np.testing.assert_allclose(shown(explorer), weights()[1, 0].numpy())
    assert explorer.figure.axes[0].get_title() == "layer 1, head 0: current token 1.00"
    explorer.update(head=1)
    np.testing.assert_allclose(shown(explorer), weights()[1, 1].numpy())
    assert explorer.figure.axes[0].get_title() == "layer 1, head 1: no clear job"
    assert explorer.redraws == 3 and explorer.png_bytes() != png


def test_a_change_from_the_browser_side_redraws(explorer):
    explorer.controls["layer"].value = 1
    explorer.controls["head"].value = 1
    assert explorer.redraws == 3
    np.testing.assert_allclose(shown(explorer), weights()[1, 1].numpy())


def test_character_labels_show_spaces_and_newlines_and_a_colour_bar(explorer):
    ax = explorer.figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["i", "f", "␣", "x", ":", "↵"]
    assert ax.get_xlabel() and ax.get_ylabel()
    assert len(explorer.figure.axes) == 2  # the heatmap and its colour bar


def test_bad_input():
    with pytest.raises(ValueError, match=r"weights has shape \(2, 6, 6\), wanted \(layers, heads"):
        layer_head_explorer(weights()[0], list("abcdef"))
    with pytest.raises(ValueError, match="labels has 3 entries but weights cover n=6"):
        layer_head_explorer(weights(), list("abc"))
    with pytest.raises(ValueError, match="head should be an int in 0..1, got 2"):
        layer_head_explorer(weights(), list("abcdef"), head=2)
    with pytest.raises(ValueError, match=r"jobs has 1 distinct \(layer, head\) rows"):
        layer_head_explorer(weights(), list("abcdef"), jobs=JOBS[:1])
