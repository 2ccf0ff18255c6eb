"""Reading the values a learner commits in predict and experiment exercises.

A prediction or a measurement is a plain value in the learner's notebook (a number, True or
False, a dict of numbers, one of a few words); these helpers turn every wrong form (None, the
wrong type, a missing entry, NaN) into feedback that says what to write, never a crash.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from course_lib.checks._core import fail


def read_number(got: Any, what: str, low: float = -math.inf, high: float = math.inf,
                kind: str = "a number") -> float:
    """One finite number in [low, high], from a Python or NumPy number or a one-element tensor
    or array; anything else (None, a bool, a string, a list) fails naming `what`."""
    if got is None:
        fail(f"{what} is None: write your number into it (and run that cell) before you run the "
             "check.")
    if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.dtype.is_complex:
        got = got.item()
    elif isinstance(got, np.ndarray) and got.size == 1 and got.dtype.kind in "iuf":
        got = got.item()
    elif isinstance(got, np.generic) and got.dtype.kind in "iuf":
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        fail(f"{what} should be {kind}, got a {type(got).__name__}: {str(got)[:60]}.")
    if not math.isfinite(got):
        fail(f"{what} should be one finite number, got {got}.")
    if not low <= got <= high:
        fail(f"{what} = {got:g} is outside the possible range [{low:g}, {high:g}].")
    return float(got)


def read_bool(got: Any, what: str) -> bool:
    """True or False (a one-element tensor or 0/1 also do), or feedback naming `what`."""
    if got is None:
        fail(f"{what} is None: write True or False in it (and run that cell).")
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, int) and not isinstance(got, bool) and got in (0, 1):
        got = bool(got)
    if not isinstance(got, bool):
        fail(f"{what} should be True or False, got a {type(got).__name__}: {str(got)[:60]}.")
    return got


def read_numbers(got: Any, name: str, keys: tuple) -> dict:
    """A dict {key: number} with every key of `keys` present, each a finite number."""
    wanted = ", ".join(map(repr, keys))
    if got is None:
        fail(f"{name} is None: write your numbers into it (a dict with keys {wanted}) before "
             "you run the check.")
    if not isinstance(got, dict):
        fail(f"{name} should be a dict with keys {wanted}; it is a {type(got).__name__}.")
    missing = [k for k in keys if k not in got]
    if missing:
        fail(f"{name} has no entry for {', '.join(map(repr, missing))}: fill in every case.")
    return {k: read_number(got[k], f"{name}[{k!r}]") for k in keys}


def read_choice(got: Any, name: str, choices: tuple[str, ...]) -> str:
    """One of a few words (case and surrounding spaces ignored)."""
    options = ", ".join(map(repr, choices))
    if got is None:
        fail(f"{name} is None: set it to one of {options} before you run the experiment.")
    if not isinstance(got, str) or got.strip().lower() not in choices:
        fail(f"{name} should be one of {options}; it is {got!r}.")
    return got.strip().lower()


def read_several(got: Any, n: int, what: str, usage: str) -> tuple:
    """The n values a check was called with, `check.window_reach(reach, beyond)`, as a tuple;
    called with another number of them, feedback that shows the `usage`."""
    if not (isinstance(got, (tuple, list)) and len(got) == n):
        fail(f"the check takes {what}: {usage}.")
    return tuple(got)
