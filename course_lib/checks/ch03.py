"""Checkers for exercises/03_scaling.ipynb: predict and measure the score variance, softmax entropy,
and the softmax Jacobian (the thing that carries gradients back through the weights)."""

from __future__ import annotations

import math

import torch

from course_lib.attention import softmax as _softmax
from course_lib.checks._core import call, expect_close, expect_shape, fail, forbid, passed, to_tensor


def _number(value, what: str) -> float:
    t = to_tensor(value, what, dtype=torch.float64)
    if t.numel() != 1:
        fail(f"{what} should be one number, got shape {tuple(t.shape)}.")
    x = float(t.reshape(()))
    if not math.isfinite(x):
        fail(f"{what} is {x}, not a finite number.")
    return x


def predicted_variance(fn) -> None:
    """Exercise 1: predicted_variance(d_k, scaled) -> Var(q·k) (or of q·k/√d_k) for unit-variance entries."""
    for d_k in (1, 4, 64, 1000):
        for scaled in (False, True):
            x = _number(call(fn, d_k, scaled, name="predicted_variance"),
                        f"predicted_variance({d_k}, scaled={scaled})")
            want = 1.0 if scaled else float(d_k)
            if abs(x - want) <= 1e-9 * max(1.0, want):
                continue
            if d_k > 1 and abs(x - math.sqrt(d_k)) < 1e-9 * d_k:
                fail(f"predicted_variance({d_k}, scaled={scaled}) = {x:.4g} = sqrt(d_k): that is the "
                     "standard deviation. The variance of a sum of d_k independent unit-variance terms is d_k.")
            if scaled and abs(x - d_k) < 1e-9 * d_k:
                fail(f"with scaled=True you still predict {x:.4g}: dividing by sqrt(d_k) divides the "
                     "variance by (sqrt(d_k))² = d_k.")
            fail(f"predicted_variance({d_k}, scaled={scaled}) = {x:.4g}, expected {want:.4g}. Each term "
                 "q_m·k_m has mean 0 and variance 1, and variances of independent terms add.")
    passed("predicted_variance: d_k without scaling, 1 with it.")


def score_variance(fn) -> None:
    """Exercise 2: score_variance(d_k, scaled, n_samples, seed) -> measured Var of q·k (·1/√d_k)."""
    n_samples = 20000
    for d_k in (4, 64, 256):
        for scaled in (False, True):
            what = f"score_variance({d_k}, scaled={scaled})"
            x = _number(call(fn, d_k, scaled, n_samples, 0, name="score_variance"), what)
            want = 1.0 if scaled else float(d_k)
            if abs(x - want) <= 0.12 * want:
                continue
            if not scaled and abs(x - math.sqrt(d_k)) <= 0.12 * math.sqrt(d_k):
                fail(f"{what} = {x:.4g}, close to sqrt(d_k) = {math.sqrt(d_k):.4g}: you measured the "
                     "standard deviation. Return the variance, scores.var().")
            if scaled and abs(x - d_k) <= 0.12 * d_k:
                fail(f"{what} = {x:.4g}: with scaled=True divide each dot product by sqrt(d_k) before "
                     "measuring the variance.")
            if not scaled and abs(x - 1) <= 0.12:
                fail(f"{what} = {x:.4g}: with scaled=False do not divide by sqrt(d_k).")
            fail(f"{what} = {x:.4g}, expected about {want:.4g} (within 12%). Draw q and k of shape "
                 "(n_samples, d_k) from torch.randn, take (q * k).sum(-1), and return its variance.")
    a = _number(call(fn, 16, False, n_samples, 0, name="score_variance"), "score_variance(..., seed=0)")
    b = _number(call(fn, 16, False, n_samples, 1, name="score_variance"), "score_variance(..., seed=1)")
    if a == b:
        fail("score_variance gives exactly the same number for seed=0 and seed=1: measure it from "
             "random samples drawn with torch.Generator().manual_seed(seed), not from the formula.")
    passed("score_variance: measured variance ≈ d_k unscaled and ≈ 1 scaled.")


def entropy(fn) -> None:
    """Exercise 3: entropy(weights) -> -sum w log w over the last axis, in nats, with 0·log 0 = 0."""
    g = torch.Generator().manual_seed(3)
    cases = [
        torch.full((1, 8), 1 / 8, dtype=torch.float64),
        torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64),
        _softmax(torch.randn(2, 3, 6, generator=g, dtype=torch.float64) * 2),
    ]
    for weights in cases:
        got = call(fn, weights.clone(), name="entropy")
        logs = torch.where(weights > 0, weights.clamp_min(1e-300).log(), torch.zeros_like(weights))
        want = -(weights * logs).sum(-1)
        t = to_tensor(got, "entropy(weights)", dtype=torch.float64)
        expect_shape(t, want.shape, "entropy(weights)", "One entropy per row: sum over the last axis only.")
        if not torch.isfinite(t).all() and (weights == 0).any():
            fail("entropy gives NaN for a row with exact zeros: 0 · log 0 is NaN in floating point but "
                 "0 in the formula. Use torch.xlogy(w, w) or torch.where(w > 0, w * w.log(), 0).")
        if _allclose(t, -want) and want.abs().max() > 0:
            fail("your entropies are negative: H = -Σ w log w, with a minus sign.")
        if _allclose(t, want / math.log(2)):
            fail("your entropy is in bits (log2); use the natural log (nats) as the chapter does.")
        expect_close(t, want, "entropy(weights)", atol=1e-8, rtol=1e-6,
                     hint="H = -Σ_j w_j log w_j over the last axis; uniform over n keys gives log n.")
    passed("entropy: -Σ w log w per row, 0 for a one-hot row, log n for a uniform one.")


def _allclose(a, b) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-8, rtol=1e-6))


def softmax_jacobian(fn) -> None:
    """Exercise 4: softmax_jacobian(scores) -> J[i, j] = ∂softmax(s)_i / ∂s_j = p_i (δ_ij - p_j)."""
    g = torch.Generator().manual_seed(4)
    cases = [torch.randn(5, generator=g, dtype=torch.float64),
             torch.randn(3, generator=g, dtype=torch.float64) * 4,
             torch.tensor([30.0, 0.0, -2.0, 1.0], dtype=torch.float64)]
    with forbid((torch.autograd.functional, "jacobian"), exercise="softmax_jacobian"):
        for scores in cases:
            got = call(fn, scores.clone(), name="softmax_jacobian")
            p = _softmax(scores)
            want = torch.diag(p) - torch.outer(p, p)
            n = scores.numel()
            t = to_tensor(got, "softmax_jacobian(scores)", dtype=torch.float64)
            expect_shape(t, (n, n), "softmax_jacobian(scores)",
                         "The Jacobian has one row per output weight and one column per score.")
            if _allclose(t, -torch.outer(p, p)):
                fail("you have only the -p_i p_j part: the diagonal also gets +p_i (∂p_i/∂s_i = p_i - p_i²).")
            if _allclose(t, torch.diag(p)):
                fail("you have only the diagonal: every weight also depends on every other score "
                     "through the normalising sum, giving -p_i p_j off the diagonal.")
            expect_close(t, want, "softmax_jacobian(scores)", atol=1e-9, rtol=1e-7,
                         hint="J = diag(p) - p pᵀ with p = softmax(scores).")
    passed("softmax_jacobian: diag(p) - p pᵀ, which shrinks to 0 as p becomes one-hot.")
