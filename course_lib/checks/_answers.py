"""Reading a learner's committed value (a prediction or a measured number) in a judge.

Predict and experiment checks receive a value, not a function: these helpers turn it into a
plain Python number or bool, or fail with feedback that says what was expected."""

from __future__ import annotations

import math
from typing import Any

import torch

from course_lib.checks._core import fail


def number(got: Any, name: str, low: float = -math.inf, high: float = math.inf,
           what: str = "a number") -> float:
    """`got` as a float in [low, high], or a CheckFailure naming `name`."""
    if got is None:
        fail(f"{name} is None: write your number in it (and run that cell).")
    if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.dtype.is_complex:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        fail(f"{name} should be {what}, got a {type(got).__name__}: {str(got)[:60]}.")
    if not math.isfinite(got):
        fail(f"{name} is {got}: write a finite number.")
    if not low <= got <= high:
        fail(f"{name} = {got:g} is outside the possible range [{low:g}, {high:g}].")
    return float(got)


def boolean(got: Any, name: str) -> bool:
    """`got` as True/False (a one-element tensor or 0/1 also do), or a CheckFailure."""
    if got is None:
        fail(f"{name} is None: write True or False in it (and run that cell).")
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, int) and not isinstance(got, bool) and got in (0, 1):
        got = bool(got)
    if not isinstance(got, bool):
        fail(f"{name} should be True or False, got a {type(got).__name__}: {str(got)[:60]}.")
    return got
