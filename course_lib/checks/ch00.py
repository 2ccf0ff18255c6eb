"""The check that notebooks/00_start_here.ipynb demonstrates: `normalise`, which is no exercise
of the course (it turns counts into frequencies), so chapter 00 shows how a check talks without
handing out an answer that a later exercise asks for."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional

from course_lib.checks._core import expect_close, fail, to_tensor
from course_lib.checks._protocol import each, function_check, hint

__all__ = ["normalise", "hint"]

SOLUTION = "notebooks/00_start_here.ipynb"


def _normalise_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([0, seed])
    cases = [np.array([3.0, 1.0, 0.0, 4.0]), rng.integers(1, 9, size=6).astype(float),
             np.array([5.0])]
    return cases + ([rng.integers(0, 99, size=40).astype(float)] if hidden else [])


@function_check(1, cases=_normalise_cases, forbid=((torch.nn.functional, "normalize"),))
def normalise(cases: list, outcomes: list) -> str:
    for counts, got in each(cases, outcomes):
        want = torch.as_tensor(counts / counts.sum())
        t = to_tensor(got, "normalise(counts)", dtype=torch.float64)
        if t.shape == want.shape and counts.size > 1 and \
                torch.allclose(t, torch.as_tensor(counts / counts.max())):
            fail(f"your frequencies sum to {float(t.sum()):.3g}, not 1: you divided by the "
                 "largest count. Divide by the total.")
        expect_close(t, want, "normalise(counts)", atol=1e-12,
                     hint="Each frequency is its count's share of the total.")
    return "normalise: every count's share of the total; they sum to 1."
