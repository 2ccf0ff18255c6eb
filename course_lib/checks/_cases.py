"""Making a check's inputs: one seeded random stream per exercise and seed, float64 normals.

Cases are drawn afresh for every seed the grader passes (seed 0 in the notebook), so a judge
sees inputs no answer was tuned to; float64 keeps the reference comparisons tight.
"""

from __future__ import annotations

import torch


def generator(exercise: int, seed: int) -> torch.Generator:
    """The random stream of one exercise's cases: a fresh one for every (exercise, seed)."""
    return torch.Generator().manual_seed((seed * 1009 + exercise) % 2**63)


def randn(g: torch.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    """Standard normal float64 numbers (times `scale`) from the case generator g."""
    return scale * torch.randn(*shape, generator=g, dtype=torch.float64)
