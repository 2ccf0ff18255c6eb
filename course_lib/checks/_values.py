"""Reading the values a learner commits in predict and experiment exercises.

A prediction or a measurement is a plain value in the learner's notebook (a number, a dict of
numbers, one of a few words); these helpers turn every wrong form (None, the wrong type, a
missing entry, NaN) into feedback that says what to write, never a crash.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from course_lib.checks._core import fail, to_tensor


def read_number(got: Any, what: str) -> float:
    """One finite number, from a Python number, a NumPy scalar or a one-element tensor."""
    if got is None:
        fail(f"{what} is None: write your number into it before you run the check.")
    if isinstance(got, bool):
        fail(f"{what} should be a number, got {got!r}.")
    t = to_tensor(got, what, dtype=torch.float64)
    if t.numel() != 1:
        fail(f"{what} should be one number, got {t.numel()} (shape {tuple(t.shape)}).")
    value = float(t.reshape(()))
    if not math.isfinite(value):
        fail(f"{what} should be one finite number, got {value}.")
    return value


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
