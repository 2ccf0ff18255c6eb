"""Checkers for exercises/03_scaling.ipynb: the score variance (a formula, then a measurement),
softmax entropy and a prediction of it at large d_k, and the softmax Jacobian (the thing that
carries gradients back through the weights)."""

from __future__ import annotations

import math

import torch

from course_lib.attention import softmax as _softmax
from course_lib.checks._cases import generator
from course_lib.checks._core import expect_close, expect_shape, fail, matches, to_tensor
from course_lib.checks._protocol import each, function_check, hint, value_check
from course_lib.checks._values import read_numbers

__all__ = ["predicted_variance", "measured_variance", "entropy", "entropy_prediction",
           "softmax_jacobian", "hint"]

SOLUTION = "solutions/03_scaling.ipynb"


def _number(got, what: str) -> float:
    t = to_tensor(got, what, dtype=torch.float64)
    if t.numel() != 1:
        fail(f"{what} should be one number, got shape {tuple(t.shape)}.")
    x = float(t.reshape(()))
    if not math.isfinite(x):
        fail(f"{what} is {x}, not a finite number.")
    return x


# ---------------------------------------------------------------- exercise 1

def _predict_cases(seed: int, hidden: bool) -> list:
    dims = [1, 4, 64, 1000] + ([9, 2, 4096] if hidden else [])
    return [{"d_k": d_k, "scaled": scaled} for d_k in dims for scaled in (False, True)]


@function_check(1, args=("d_k", "scaled"), grade="predict", cases=_predict_cases)
def predicted_variance(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        d_k, scaled = case["d_k"], case["scaled"]
        x = _number(got, f"predicted_variance({d_k}, scaled={scaled})")
        want = 1.0 if scaled else float(d_k)
        if abs(x - want) <= 1e-9 * max(1.0, want):
            continue
        if d_k > 1 and abs(x - math.sqrt(d_k)) < 1e-9 * d_k:
            fail(f"predicted_variance({d_k}, scaled={scaled}) = {x:.4g} = sqrt(d_k): that is the "
                 "standard deviation. The variance of a sum of d_k independent unit-variance "
                 "terms is d_k.")
        if scaled and abs(x - d_k) < 1e-9 * d_k:
            fail(f"with scaled=True you still predict {x:.4g}: dividing by sqrt(d_k) divides the "
                 "variance by (sqrt(d_k))² = d_k.")
        fail(f"predicted_variance({d_k}, scaled={scaled}) = {x:.4g}, expected {want:.4g}. Each "
             "term q_m·k_m has mean 0 and variance 1, and variances of independent terms add.")
    return "predicted_variance: d_k without scaling, 1 with it."


# ---------------------------------------------------------------- exercise 2 (experiment)

MEASURE_WIDTHS = (16, 256)
_MEASURE_RTOL = 0.15   # 300 x 300 scores: an honest estimate is within ~4% of d_k


@value_check(2, grade="measured")
def measured_variance(cases: list, outcomes: list) -> str:
    (_, got), = each(cases, outcomes)
    measured = read_numbers(got, "measured_variance", MEASURE_WIDTHS)
    for d_k in MEASURE_WIDTHS:
        x, what = measured[d_k], f"measured_variance[{d_k}]"
        if x == d_k:
            fail(f"{what} is exactly {d_k}: that is the formula from exercise 1, not a "
                 "measurement (a variance estimated from random samples is never exactly d_k). "
                 "Draw the queries and keys and measure.")
        if abs(x - d_k) <= _MEASURE_RTOL * d_k:
            continue
        if abs(x - math.sqrt(d_k)) <= _MEASURE_RTOL * math.sqrt(d_k):
            fail(f"{what} = {x:.4g}, close to sqrt(d_k) = {math.sqrt(d_k):.4g}: you measured the "
                 "standard deviation of the scores. Report their variance.")
        if abs(x - 1) <= _MEASURE_RTOL:
            fail(f"{what} = {x:.4g}, close to 1: these are the scaled scores. Measure the raw "
                 "q·k, without dividing by sqrt(d_k).")
        fail(f"{what} = {x:.4g}, but a correct run gives about {d_k} (within "
             f"{_MEASURE_RTOL:.0%}): the variance of all the entries of Q Kᵀ for 300 random "
             f"queries and 300 random keys of width {d_k}.")
    return ("measured_variance: the raw scores' variance grows like d_k "
            f"({measured[16]:.1f} at 16, {measured[256]:.0f} at 256), as predicted.")


# ---------------------------------------------------------------- exercise 3

def _entropy_cases(seed: int, hidden: bool) -> list:
    g = generator(3, seed)
    cases = [
        torch.full((1, 8), 1 / 8, dtype=torch.float64),
        torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64),
        _softmax(torch.randn(2, 3, 6, generator=g, dtype=torch.float64) * 2),
    ]
    if hidden:
        cases += [torch.full((4,), 0.25, dtype=torch.float64),
                  _softmax(torch.randn(5, 30, generator=g, dtype=torch.float64) * 8)]
    return cases


@function_check(3, cases=_entropy_cases)
def entropy(cases: list, outcomes: list) -> str:
    for weights, got in each(cases, outcomes):
        logs = torch.where(weights > 0, weights.clamp_min(1e-300).log(), torch.zeros_like(weights))
        want = -(weights * logs).sum(-1)
        t = to_tensor(got, "entropy(weights)", dtype=torch.float64)
        expect_shape(t, want.shape, "entropy(weights)",
                     "One entropy per row: sum over the last axis only.")
        if not torch.isfinite(t).all() and (weights == 0).any():
            fail("entropy gives NaN for a row with exact zeros: 0 · log 0 is NaN in floating "
                 "point but 0 in the formula. Make zero weights contribute exactly 0.")
        if matches(t, -want) and want.abs().max() > 0:
            fail("your entropies are negative: H = -Σ w log w, with a minus sign.")
        if matches(t, want / math.log(2)) and want.abs().max() > 0:
            fail("your entropy is in bits (log2); use the natural log (nats) as the chapter does.")
        expect_close(t, want, "entropy(weights)", atol=1e-8, rtol=1e-6,
                     hint="H = -Σ_j w_j log w_j over the last axis; uniform over n keys gives "
                          "log n.")
    return "entropy: -Σ w log w per row, 0 for a one-hot row, log n for a uniform one."


# ---------------------------------------------------------------- exercise 4

def _jacobian_cases(seed: int, hidden: bool) -> list:
    g = generator(4, seed)
    cases = [torch.randn(5, generator=g, dtype=torch.float64),
             torch.randn(3, generator=g, dtype=torch.float64) * 4,
             torch.tensor([30.0, 0.0, -2.0, 1.0], dtype=torch.float64)]
    if hidden:
        cases += [torch.tensor([100.0, 0.0, 0.0], dtype=torch.float64),
                  torch.tensor([0.7], dtype=torch.float64)]
    return cases


@function_check(5, grade="jacobian", cases=_jacobian_cases,
                forbid=((torch.autograd.functional, "jacobian"),))
def softmax_jacobian(cases: list, outcomes: list) -> str:
    for scores, got in each(cases, outcomes):
        p = _softmax(scores)
        want = torch.diag(p) - torch.outer(p, p)
        n = scores.numel()
        t = to_tensor(got, "softmax_jacobian(scores)", dtype=torch.float64)
        expect_shape(t, (n, n), "softmax_jacobian(scores)",
                     "The Jacobian has one row per output weight and one column per score.")
        if not matches(want, torch.zeros_like(want)):
            if matches(t, -torch.outer(p, p)):
                fail("you have only the -p_i p_j part: the diagonal also gets +p_i "
                     "(∂p_i/∂s_i = p_i - p_i²).")
            if matches(t, torch.diag(p)):
                fail("you have only the diagonal: every weight also depends on every other score "
                     "through the normalising sum, giving -p_i p_j off the diagonal.")
        expect_close(t, want, "softmax_jacobian(scores)", atol=1e-9, rtol=1e-7,
                     hint="∂p_i/∂s_j = p_i (δ_ij - p_j).")
    return "softmax_jacobian: diag(p) - p pᵀ, which shrinks to 0 as p becomes one-hot."


# ---------------------------------------------------------------- exercise 4 (predict)

ENTROPY_D_K, ENTROPY_KEYS = 256, 6
_ENTROPY_TOL = 0.35    # nats


def entropy_experiment(n_queries: int = 2000, seed: int = 4) -> dict:
    """The run of exercise 4: mean entropy (nats) of softmax(q·k) and of softmax(q·k / sqrt(d_k))
    over 6 random keys at d_k = 256, for random unit-variance queries and keys."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_queries, 1, ENTROPY_D_K, generator=g, dtype=torch.float64)
    k = torch.randn(n_queries, ENTROPY_KEYS, ENTROPY_D_K, generator=g, dtype=torch.float64)
    raw = (q @ k.transpose(-2, -1)).squeeze(1)
    out = {}
    for name, s in (("unscaled", raw), ("scaled", raw / math.sqrt(ENTROPY_D_K))):
        w = torch.softmax(s, dim=-1)
        out[name] = float(-torch.xlogy(w, w).sum(-1).mean())
    return out


@value_check(4)
def entropy_prediction(cases: list, outcomes: list) -> str:
    (_, got), = each(cases, outcomes)
    predicted = read_numbers(got, "predicted_entropy", ("unscaled", "scaled"))
    run, top = entropy_experiment(), math.log(ENTROPY_KEYS)
    for name, value in predicted.items():
        if not -1e-9 <= value <= top + 1e-9:
            fail(f"predicted_entropy[{name!r}] = {value:.3g} is impossible: the entropy of "
                 f"weights over {ENTROPY_KEYS} keys lies between 0 (one-hot) and "
                 f"log {ENTROPY_KEYS} = {top:.3f} (uniform).")
    gaps = []
    if abs(predicted["unscaled"] - run["unscaled"]) > _ENTROPY_TOL:
        gaps.append(f"unscaled, the run gives {run['unscaled']:.3f} nats and you predicted "
                    f"{predicted['unscaled']:.3f}: raw scores at d_k = {ENTROPY_D_K} have a "
                    f"standard deviation of sqrt({ENTROPY_D_K}) = {math.sqrt(ENTROPY_D_K):.0f}, "
                    "so the best key beats the next by several units and the softmax is "
                    "nearly one-hot (entropy near 0)")
    if abs(predicted["scaled"] - run["scaled"]) > _ENTROPY_TOL:
        gaps.append(f"scaled, the run gives {run['scaled']:.3f} nats and you predicted "
                    f"{predicted['scaled']:.3f}: divided by sqrt(d_k) the scores have standard "
                    "deviation 1 at any width, so the weights stay spread (below but not far "
                    f"from the uniform log {ENTROPY_KEYS} = {top:.3f})")
    if gaps:
        fail("your prediction is off: " + "; ".join(gaps) + ".")
    return (f"predicted_entropy: unscaled {run['unscaled']:.2f} nats (nearly one-hot), scaled "
            f"{run['scaled']:.2f} nats (spread), against log {ENTROPY_KEYS} = {top:.2f} for "
            "uniform weights.")

