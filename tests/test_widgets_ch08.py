"""Chapter 08's online-softmax stepper redraws as the tile slider moves, and ends at softmax."""

import numpy as np
import pytest

from course_lib.widgets import Explorer, online_softmax_stepper
from course_lib.widgets.ch08 import online_softmax_steps


def test_stepping_changes_the_figure_and_the_last_step_is_exact():
    explorer = online_softmax_stepper(block_size=3)
    assert isinstance(explorer, Explorer) and explorer.redraws == 1
    first_png = explorer.png_bytes()
    first_titles = [ax.get_title() for ax in explorer.figure.axes]
    explorer.update(step=4)
    assert explorer.redraws == 2 and explorer.png_bytes() != first_png
    assert [ax.get_title() for ax in explorer.figure.axes] != first_titles
    assert "max gap 0.000" in explorer.figure.axes[2].get_title()
    assert explorer.figure.get_suptitle().startswith("online softmax after 12 of 12 keys")


def test_slider_from_the_browser_side_redraws():
    explorer = online_softmax_stepper()
    explorer.controls["step"].value = 2
    assert explorer.redraws == 2


def test_steps_match_softmax_and_attention():
    rng = np.random.default_rng(1)
    s, v = rng.normal(size=10) * 5, rng.normal(size=(10, 3))
    steps = online_softmax_steps(s, v, block_size=4)
    assert [st["seen"] for st in steps] == [4, 8, 10]
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(steps[-1]["weights"], w, rtol=1e-12)
    np.testing.assert_allclose(steps[-1]["out"], w @ v, rtol=1e-12)
    assert steps[-1]["m"] == s.max()
    np.testing.assert_allclose(steps[-1]["l"], np.exp(s - s.max()).sum())
    assert all(a["m"] <= b["m"] for a, b in zip(steps, steps[1:]))


def test_bad_inputs():
    with pytest.raises(ValueError, match="values must have shape"):
        online_softmax_stepper(scores=np.zeros(5), values=np.zeros((4, 2)))
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        online_softmax_stepper(block_size=0)
    with pytest.raises(ValueError, match="unknown control"):
        online_softmax_stepper().update(tile=2)
