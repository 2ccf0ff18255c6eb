"""The explorers of chapters 03 and 04 redraw their figure when a control moves."""

import matplotlib
import pytest

matplotlib.use("Agg")

from course_lib.widgets import mask_explorer, scaling_explorer  # noqa: E402


def bar_heights(fig, axis_index):
    return [round(p.get_height(), 6) for p in fig.axes[axis_index].patches]


def test_scaling_explorer_redraws_for_d_k_and_scaling():
    explorer = scaling_explorer(d_k=16, scaled=True)
    before_png, before = explorer.png_bytes(), bar_heights(explorer.figure, 1)
    assert abs(sum(before) - 1) < 1e-6  # the right panel shows a distribution
    explorer.update(d_k=1024)
    wide_scaled = bar_heights(explorer.figure, 1)
    assert wide_scaled != before and explorer.png_bytes() != before_png
    explorer.update(scaled=False)
    wide_unscaled = bar_heights(explorer.figure, 1)
    # without 1/sqrt(d_k) at d_k = 1024 the softmax saturates: one weight takes (almost) everything
    assert max(wide_unscaled) > 0.99 > max(wide_scaled)
    assert explorer.figure.get_suptitle() == "d_k = 1024, unscaled"
    assert explorer.redraws == 3


def test_scaling_explorer_gives_both_thes_one_key_and_names_its_marks():
    explorer = scaling_explorer(d_k=64, scaled=True)
    scores = bar_heights(explorer.figure, 0)                  # the, cat, sat, on, the, mat
    assert scores[0] == scores[4] and len(set(scores)) == 5
    ax_w = explorer.figure.axes[1]
    labels = [t.get_text() for t in ax_w.get_legend().get_texts()]
    assert labels == ["largest weight", "other keys", "uniform, 1/n"]
    orange = ax_w.get_legend().get_patches()[0].get_facecolor()
    explorer.update(d_k=256, scaled=False)      # seed 0: the two "the"s win and split the weight
    weights = bar_heights(explorer.figure, 1)
    assert weights[0] == weights[4] == max(weights) > 0.49
    winners = [i for i, bar in enumerate(explorer.figure.axes[1].patches)
               if bar.get_facecolor() == orange]
    assert winners == [0, 4]


def test_scaling_explorer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="d_k must be one of"):
        scaling_explorer(d_k=10)
    with pytest.raises(ValueError, match="query_index"):
        scaling_explorer(query_index=6)
    with pytest.raises(ValueError, match="unknown control"):
        scaling_explorer().update(temperature=2.0)


def shown_weights(fig):
    return fig.axes[0].images[0].get_array()


def test_mask_explorer_redraws_for_each_mask_type():
    explorer = mask_explorer(mask="none")
    none = shown_weights(explorer.figure)
    assert none.mask.sum() == 0 if hasattr(none.mask, "sum") else not none.mask
    png = explorer.png_bytes()
    explorer.update(mask="causal")
    causal = shown_weights(explorer.figure)
    assert causal.mask.sum() == 15  # 6 tokens: 15 cells above the diagonal are masked
    assert explorer.png_bytes() != png
    explorer.update(mask="padding", length=4)
    padded = shown_weights(explorer.figure)
    assert padded.mask.sum() == 6 * 2
    labels = [t.get_text() for t in explorer.figure.axes[0].get_xticklabels()]
    assert labels == ["the", "cat", "sat", "on", "<pad>", "<pad>"]
    assert abs(padded.sum(axis=1) - 1).max() < 1e-9  # rows still sum to 1 over the real tokens
    explorer.update(length=2)
    assert shown_weights(explorer.figure).mask.sum() == 6 * 4


def test_mask_explorer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mask must be one of"):
        mask_explorer(mask="future")
    with pytest.raises(ValueError, match="length must be an integer"):
        mask_explorer(length=0)
