"""Chapter 01's temperature explorer redraws when the slider moves."""

import numpy as np
import pytest

from course_lib.widgets import Explorer, soft_lookup_explorer


@pytest.fixture
def explorer():
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(4, 3))
    return soft_lookup_explorer(keys[0], keys, rng.normal(size=4), names=list("abcd"),
                                temperature=1.0)


def heights(explorer):
    return [bar.get_height() for bar in explorer.figure.axes[0].patches]


def test_moving_the_slider_redraws_the_weights(explorer):
    assert isinstance(explorer, Explorer) and explorer.redraws == 1
    warm, png_warm = heights(explorer), explorer.png_bytes()
    explorer.update(temperature=0.01)
    cold = heights(explorer)
    assert explorer.redraws == 2 and max(cold) > 0.99 > max(warm)
    assert explorer.png_bytes() != png_warm
    assert sum(cold) == pytest.approx(1.0)


def test_a_control_change_from_the_browser_side_redraws(explorer):
    explorer.controls["temperature"].value = 50.0   # what ipywidgets does when the slider moves
    assert explorer.redraws == 2 and max(heights(explorer)) < 0.3


def test_unknown_control_and_bad_names(explorer):
    with pytest.raises(ValueError, match="unknown control"):
        explorer.update(d_k=4)
    with pytest.raises(ValueError, match="names has 2 labels but keys has 4 rows"):
        soft_lookup_explorer(np.zeros(3), np.eye(4, 3), np.zeros(4), names=["a", "b"])


def test_the_legend_names_the_orange_bar_and_the_uniform_line(explorer):
    explorer.update(temperature=0.05)
    ax = explorer.figure.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["largest weight (the argmax key)", "other keys", "uniform, 1/n"]
    tallest = max(ax.patches, key=lambda bar: bar.get_height())
    assert tallest.get_facecolor() == ax.get_legend().get_patches()[0].get_facecolor()
