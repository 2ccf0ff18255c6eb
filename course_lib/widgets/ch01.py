"""Chapter 01's explorer: slide the temperature of a soft lookup and watch the weights move."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
from matplotlib.patches import Patch

from course_lib.lookup import soft_lookup
from course_lib.widgets._base import Explorer


def soft_lookup_explorer(query, keys, values, names, temperature: float = 1.0) -> Explorer:
    """Bar chart of the soft lookup's weights over `names`, with a log-scale temperature slider.

    query (d,), keys (n, d), values (n,) scalars, names: n labels for the keys.
    """
    query, keys = np.asarray(query, float), np.asarray(keys, float)
    values = np.asarray(values, float)
    if len(names) != len(keys):
        raise ValueError(f"names has {len(names)} labels but keys has {len(keys)} rows")

    def draw(fig, temperature):
        value, weights = soft_lookup(query, keys, values, temperature=temperature)
        ax = fig.add_subplot()
        bars = ax.bar(names, weights, color="tab:blue")
        bars[int(np.argmax(weights))].set_color("tab:orange")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("weight")
        ax.set_xlabel("stored key")
        ax.set_title(f"temperature {temperature:.3g}: blended value = {value:.2f}")
        uniform = ax.axhline(1 / len(names), color="grey", lw=0.8, ls="--", label="uniform, 1/n")
        ax.legend(handles=[Patch(color="tab:orange", label="largest weight (the argmax key)"),
                           Patch(color="tab:blue", label="other keys"), uniform],
                  loc="upper right", fontsize=8)

    slider = widgets.FloatLogSlider(value=temperature, base=10, min=-2, max=2, step=0.05,
                                    description="temperature", readout_format=".3g",
                                    continuous_update=True, style={"description_width": "initial"})
    return Explorer(draw, {"temperature": slider}, figsize=(6.5, 3.2))
