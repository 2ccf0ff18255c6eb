"""Chapter 09's window explorer: the sliders redraw, and the reach panel is right."""

import numpy as np
import pytest

from course_lib.widgets import Explorer, window_explorer
from course_lib.widgets.ch09 import window_reach


def test_window_slider_redraws_with_new_titles():
    explorer = window_explorer(window=4, layers=1)
    assert isinstance(explorer, Explorer) and explorer.redraws == 1
    png, titles = explorer.png_bytes(), [ax.get_title() for ax in explorer.figure.axes]
    explorer.update(window=6)
    assert explorer.redraws == 2 and explorer.png_bytes() != png
    assert [ax.get_title() for ax in explorer.figure.axes] != titles
    assert "W = 6" in explorer.figure.axes[0].get_title()
    explorer.controls["layers"].value = 3                   # as from the browser
    assert explorer.redraws == 3
    assert "reads 16 of 16" in explorer.figure.axes[1].get_title()   # 1 + 3·5 >= 16


def test_reach_grows_by_w_minus_one_per_layer():
    for n, w, layers in [(16, 4, 1), (16, 4, 2), (30, 3, 5), (8, 1, 3)]:
        reach = window_reach(n, w, layers)
        want = np.arange(n) >= n - 1 - layers * (w - 1)
        np.testing.assert_array_equal(reach, want)


def test_bad_inputs():
    with pytest.raises(ValueError, match="window must be an integer in 1..16"):
        window_explorer(window=0)
    with pytest.raises(ValueError, match="tokens must hold at least 2"):
        window_explorer(tokens=["a"])
