"""Interactive explorers: ipywidgets controls that redraw a matplotlib figure.

Each explorer shows its default setting as an ordinary figure output, so the committed notebook
(and a reader on a web page) sees a picture; in JupyterLab, moving a control redraws that same
output in place. Tests drive `Explorer.update(...)` directly.

    soft_lookup_explorer      chapter 01  temperature of the soft lookup
    scaling_explorer          chapter 03  d_k, with and without 1/sqrt(d_k)
    mask_explorer             chapter 04  mask type on an attention map
    head_explorer             chapter 05  a trained model's heads, one at a time
    online_softmax_stepper    chapter 08  the online softmax, tile by tile
    window_explorer           chapter 09  a sliding window's size: its mask, reach and cost
    layer_head_explorer       chapter 10  a stacked model's heads on real text, layer by layer
"""

from importlib import import_module

from course_lib.widgets._base import Explorer

_WHERE = {
    "soft_lookup_explorer": "ch01",
    "scaling_explorer": "ch03",
    "mask_explorer": "ch04",
    "head_explorer": "ch05",
    "online_softmax_stepper": "ch08",
    "window_explorer": "ch09",
    "layer_head_explorer": "ch10",
}

__all__ = ["Explorer", *_WHERE]


def __getattr__(name):  # import each chapter's explorer only when it is asked for
    if name in _WHERE:
        return getattr(import_module(f"course_lib.widgets.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'course_lib.widgets' has no attribute {name!r}")
