"""Chapter 05's head explorer: choosing another head redraws that head's attention map."""

import numpy as np
import pytest
import torch

from course_lib.widgets import Explorer, head_explorer


def weights_two_heads(n=5):
    prev = torch.zeros(n, n)
    prev[0, 0] = 1
    prev[torch.arange(1, n), torch.arange(n - 1)] = 1   # head 0: the previous token
    first = torch.zeros(n, n)
    first[:, 0] = 1                                      # head 1: the first token
    return torch.stack([prev, first])                    # (2, n, n)


@pytest.fixture
def explorer():
    return head_explorer(weights_two_heads(), list("^abcd"),
                         scores={"previous": [0.8, 0.2], "first": [0.2, 1.0]})


def shown(explorer):
    return np.asarray(explorer.figure.axes[0].images[0].get_array())


def test_choosing_a_head_redraws_its_map(explorer):
    assert isinstance(explorer, Explorer) and explorer.redraws == 1
    before, png = shown(explorer).copy(), explorer.png_bytes()
    np.testing.assert_allclose(before, weights_two_heads()[0].numpy())
    title = explorer.figure.axes[0].get_title()
    assert "head 0" in title and "previous 0.80" in title
    explorer.update(head=1)
    after = shown(explorer)
    np.testing.assert_allclose(after, weights_two_heads()[1].numpy())
    assert explorer.redraws == 2 and explorer.png_bytes() != png
    assert explorer.figure.axes[0].get_title().startswith("head 1")


def test_token_labels_and_colour_bar(explorer):
    ax = explorer.figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == list("^abcd")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("^abcd")
    assert len(explorer.figure.axes) == 2  # the heatmap and its colour bar
    # readable at the saved figure's size: token labels no smaller than the axis labels' 10 pt
    assert min(t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels()) >= 10


def test_a_change_from_the_browser_side_redraws(explorer):
    explorer.controls["head"].value = 1
    assert explorer.redraws == 2


def test_bad_input():
    with pytest.raises(ValueError, match=r"weights has shape \(5, 5\), wanted \(heads, n, n\)"):
        head_explorer(torch.eye(5), list("abcde"))
    with pytest.raises(ValueError, match="labels has 3 entries but weights cover n=5"):
        head_explorer(weights_two_heads(), list("abc"))
    with pytest.raises(ValueError, match="one per head"):
        head_explorer(weights_two_heads(), list("^abcd"), scores={"previous": [1.0]})
    with pytest.raises(ValueError, match="head should be an int in 0..1"):
        head_explorer(weights_two_heads(), list("^abcd"), head=2)
    with pytest.raises(ValueError, match="unknown control"):
        head_explorer(weights_two_heads(), list("^abcd")).update(layer=1)


def test_a_causal_mask_draws_forbidden_cells_as_crosses_not_zeros():
    from course_lib.masks import causal_mask

    weights = weights_two_heads()
    explorer = head_explorer(weights, list("^abcd"), mask=causal_mask(5))
    drawn = np.ma.filled(np.ma.asarray(explorer.figure.axes[0].images[0].get_array()), np.nan)
    above = np.triu(np.ones((5, 5), dtype=bool), k=1)                   # the future: forbidden
    assert np.isnan(drawn[above]).all()                                 # not painted as weight 0
    np.testing.assert_allclose(drawn[~above], weights[0].numpy()[~above])
    crosses = explorer.figure.axes[0].collections[0].get_offsets()      # one x per forbidden cell
    assert sorted(map(tuple, np.asarray(crosses).astype(int))) == sorted(
        (int(j), int(i)) for i, j in zip(*np.nonzero(above)))
    explorer.update(head=1)                                  # the mask stays with a new head
    assert len(explorer.figure.axes[0].collections[0].get_offsets()) == 10


def test_a_mask_of_the_wrong_shape_or_dtype_is_refused():
    with pytest.raises(ValueError, match=r"mask should be a bool tensor of shape \(5, 5\)"):
        head_explorer(weights_two_heads(), list("^abcd"), mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="got torch.float32"):
        head_explorer(weights_two_heads(), list("^abcd"), mask=torch.ones(5, 5))
