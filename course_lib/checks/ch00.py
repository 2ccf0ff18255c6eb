"""The check that notebooks/00_start_here.ipynb demonstrates: `normalise`, which is no exercise
of the course (it turns counts into frequencies), so chapter 00 shows how a check talks without
handing out an answer that a later exercise asks for."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional

from course_lib.checks._core import expect_close, to_tensor
from course_lib.checks._declare import function_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, expected, named_mistake

__all__ = ["normalise", "hint"]

SOLUTION = "notebooks/00_start_here.ipynb"


def _normalise_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([0, seed])
    cases = [np.array([3.0, 1.0, 0.0, 4.0]), rng.integers(1, 9, size=6).astype(float),
             np.array([5.0])]
    return cases + ([rng.integers(0, 99, size=40).astype(float)] if hidden else [])


def _shares(counts):
    return counts / counts.sum()


@function_check(1, cases=_normalise_cases, forbid=((torch.nn.functional, "normalize"),),
                reference=_shares, mistakes=(
    Mistake("your frequencies sum to {total:.3g}, not 1: you divided by the largest count. "
            "Divide by the total.", lambda counts: counts / counts.max(), atol=1e-8, rtol=1e-5,
            detail=lambda counts, got: {"total": float(got.sum())}),
))
def normalise(cases: list, outcomes: list) -> str:
    for counts, got in each(cases, outcomes):
        t = to_tensor(got, "normalise(counts)", dtype=torch.float64)
        named_mistake(counts, t)
        expect_close(t, expected(counts), "normalise(counts)", atol=1e-12,
                     hint="Each frequency is its count's share of the total.")
    return "normalise: every count's share of the total; they sum to 1."
