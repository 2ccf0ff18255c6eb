"""The one mechanism behind every explorer: controls -> draw(fig, **values) -> one figure output."""

from __future__ import annotations

import io
from collections.abc import Callable

import ipywidgets as widgets
from IPython.display import Image, display
from matplotlib.figure import Figure


class Explorer:
    """A figure redrawn by `draw(fig, **values)` whenever one of `controls` changes.

    `show()` displays the controls and the figure for the current values as a PNG output with a
    display id; each change redraws and updates that same output. `update(**values)` sets
    controls from code (tests, or a notebook cell) and returns the redrawn figure.
    """

    def __init__(self, draw: Callable[..., None], controls: dict[str, widgets.ValueWidget],
                 figsize: tuple[float, float] = (7.0, 3.5)):
        self._draw = draw
        self.controls = controls
        self.figure = Figure(figsize=figsize, dpi=90)  # not pyplot: no stray auto-displayed copies
        self.redraws = 0
        self._handle = None
        self._quiet = False
        for control in controls.values():
            control.observe(self._on_change, names="value")
        self.redraw()

    @property
    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def redraw(self) -> Figure:
        self.figure.clear()
        self._draw(self.figure, **self.values)
        self.redraws += 1
        if self._handle is not None:
            self._handle.update(self.image())
        return self.figure

    def update(self, **values) -> Figure:
        """Set any controls by name (as if a learner moved them), redraw once, return the figure."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown control(s) {sorted(unknown)}; "
                             f"this explorer has {sorted(self.controls)}")
        self._quiet = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._quiet = False
        return self.redraw()

    def image(self) -> Image:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", bbox_inches="tight")
        return Image(data=buffer.getvalue(), format="png")

    def png_bytes(self) -> bytes:
        return self.image().data

    def _on_change(self, change) -> None:
        if not self._quiet:
            self.redraw()

    def show(self) -> None:
        """Display the controls, then the figure (static in the saved notebook, live in the lab).

        Where widgets cannot render (a saved notebook on a web page, a terminal), the controls'
        plain-text form is a sentence about them instead of the widget's repr
        (`HBox(children=(IntSlider(...`), which would only be noise above the figure.
        """
        bundle = widgets.HBox(list(self.controls.values()))._repr_mimebundle_()
        names = ", ".join(self.controls)
        bundle["text/plain"] = f"[explorer controls: {names}; live in JupyterLab]"
        display(bundle, raw=True)
        self._handle = display(self.image(), display_id=True)
