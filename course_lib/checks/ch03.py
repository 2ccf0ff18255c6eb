"""Checkers for exercises/03_scaling.ipynb: predict and measure the score variance, softmax entropy,
and the softmax Jacobian (the thing that carries gradients back through the weights)."""

from __future__ import annotations

import math

import torch

from course_lib.attention import softmax as _softmax
from course_lib.checks._core import call, expect_close, expect_shape, fail, to_tensor
from course_lib.checks._protocol import Check, each, hint

__all__ = ["predicted_variance", "score_variance", "entropy", "softmax_jacobian", "hint"]

SOLUTION = "solutions/03_scaling.ipynb"


def _generator(exercise: int, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1009 + exercise) % 2**63)


def _number(got, what: str) -> float:
    t = to_tensor(got, what, dtype=torch.float64)
    if t.numel() != 1:
        fail(f"{what} should be one number, got shape {tuple(t.shape)}.")
    x = float(t.reshape(()))
    if not math.isfinite(x):
        fail(f"{what} is {x}, not a finite number.")
    return x


def _allclose(a, b) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-8, rtol=1e-6))


# ---------------------------------------------------------------- exercise 1

def _predict_cases(seed: int, hidden: bool) -> list:
    dims = [1, 4, 64, 1000] + ([9, 2, 4096] if hidden else [])
    return [{"d_k": d_k, "scaled": scaled} for d_k in dims for scaled in (False, True)]


def _predict_judge(cases: list, outcomes: list) -> str:
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


predicted_variance = Check(
    id="ch03.predicted_variance",
    cases=_predict_cases,
    run=lambda fn, case: call(fn, case["d_k"], case["scaled"], name="predicted_variance"),
    judge=_predict_judge,
    hints=(
        "Variances of independent terms add, and multiplying a quantity by c multiplies its "
        "variance by c squared.",
        "q·k is a sum of d_k products q_m k_m; each product of two independent unit-variance, "
        "zero-mean numbers has variance 1.",
        "Var(q·k) = d_k; Var(q·k / sqrt(d_k)) = d_k / d_k = 1.",
        f"The worked answer is exercise 1 of {SOLUTION}.",
    ),
    grade_ids=("ch03_predict_test",),
)


# ---------------------------------------------------------------- exercise 2

N_SAMPLES = 20000


def _measure_cases(seed: int, hidden: bool) -> list:
    dims = [4, 64, 256] + ([100] if hidden else [])
    base = seed % 10_000
    cases = [{"d_k": d_k, "scaled": scaled, "seed": base + i}
             for i, d_k in enumerate(dims) for scaled in (False, True)]
    # the same question twice with two seeds: a measurement must differ, a formula would not
    cases += [{"d_k": 16, "scaled": False, "seed": base}, {"d_k": 16, "scaled": False,
                                                             "seed": base + 1}]
    return cases


def _measure_judge(cases: list, outcomes: list) -> str:
    measured = []
    for case, got in each(cases, outcomes):
        d_k, scaled = case["d_k"], case["scaled"]
        what = f"score_variance({d_k}, scaled={scaled})"
        x = _number(got, what)
        measured.append(x)
        want = 1.0 if scaled else float(d_k)
        if abs(x - want) <= 0.12 * want:
            continue
        if not scaled and abs(x - math.sqrt(d_k)) <= 0.12 * math.sqrt(d_k):
            fail(f"{what} = {x:.4g}, close to sqrt(d_k) = {math.sqrt(d_k):.4g}: you measured the "
                 "standard deviation. Return the variance.")
        if scaled and abs(x - d_k) <= 0.12 * d_k:
            fail(f"{what} = {x:.4g}: with scaled=True divide each dot product by sqrt(d_k) "
                 "before measuring the variance.")
        if not scaled and abs(x - 1) <= 0.12:
            fail(f"{what} = {x:.4g}: with scaled=False do not divide by sqrt(d_k).")
        fail(f"{what} = {x:.4g}, expected about {want:.4g} (within 12%). Draw n_samples random "
             "queries and keys of width d_k, take one dot product per pair, and return the "
             "variance of those numbers.")
    if measured[-1] == measured[-2]:
        fail("score_variance gives exactly the same number for two different seeds: measure it "
             "from random samples drawn with a generator seeded by `seed`, not from the formula.")
    return "score_variance: measured variance ≈ d_k unscaled and ≈ 1 scaled."


score_variance = Check(
    id="ch03.score_variance",
    cases=_measure_cases,
    run=lambda fn, case: call(fn, case["d_k"], case["scaled"], N_SAMPLES, case["seed"],
                              name="score_variance"),
    judge=_measure_judge,
    hints=(
        "Measure, do not derive: draw many random query-key pairs from a seeded generator, take "
        "their dot products, and report how spread out those numbers are.",
        "Seed a torch.Generator with `seed`, draw q and k of shape (n_samples, d_k) from a "
        "standard normal, take one dot product per row, divide by sqrt(d_k) when scaled.",
        "dots = (q * k).sum(dim=-1), optionally / sqrt(d_k); return dots.var() as a number.",
        f"The worked answer is exercise 2 of {SOLUTION}.",
    ),
    grade_ids=("ch03_measure_test",),
)


# ---------------------------------------------------------------- exercise 3

def _entropy_cases(seed: int, hidden: bool) -> list:
    g = _generator(3, seed)
    cases = [
        torch.full((1, 8), 1 / 8, dtype=torch.float64),
        torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64),
        _softmax(torch.randn(2, 3, 6, generator=g, dtype=torch.float64) * 2),
    ]
    if hidden:
        cases += [torch.full((4,), 0.25, dtype=torch.float64),
                  _softmax(torch.randn(5, 30, generator=g, dtype=torch.float64) * 8)]
    return cases


def _entropy_judge(cases: list, outcomes: list) -> str:
    for weights, got in each(cases, outcomes):
        logs = torch.where(weights > 0, weights.clamp_min(1e-300).log(), torch.zeros_like(weights))
        want = -(weights * logs).sum(-1)
        t = to_tensor(got, "entropy(weights)", dtype=torch.float64)
        expect_shape(t, want.shape, "entropy(weights)",
                     "One entropy per row: sum over the last axis only.")
        if not torch.isfinite(t).all() and (weights == 0).any():
            fail("entropy gives NaN for a row with exact zeros: 0 · log 0 is NaN in floating "
                 "point but 0 in the formula. Make zero weights contribute exactly 0.")
        if _allclose(t, -want) and want.abs().max() > 0:
            fail("your entropies are negative: H = -Σ w log w, with a minus sign.")
        if _allclose(t, want / math.log(2)) and want.abs().max() > 0:
            fail("your entropy is in bits (log2); use the natural log (nats) as the chapter does.")
        expect_close(t, want, "entropy(weights)", atol=1e-8, rtol=1e-6,
                     hint="H = -Σ_j w_j log w_j over the last axis; uniform over n keys gives "
                          "log n.")
    return "entropy: -Σ w log w per row, 0 for a one-hot row, log n for a uniform one."


entropy = Check(
    id="ch03.entropy",
    cases=_entropy_cases,
    run=lambda fn, case: call(fn, case, name="entropy"),
    judge=_entropy_judge,
    hints=(
        "Entropy adds up -w log w over the keys of each row. A weight of exactly 0 contributes "
        "nothing, which floating point does not know by itself.",
        "Sum over the last axis only, one entropy per row, in nats (natural log). 0 · log 0 is "
        "NaN in floating point: use a function that treats it as 0, or mask those entries.",
        "H = -(w · log w).sum(dim=-1), with the w = 0 terms set to 0 (torch.xlogy does this).",
        f"The worked answer is exercise 3 of {SOLUTION}.",
    ),
    grade_ids=("ch03_entropy_test",),
)


# ---------------------------------------------------------------- exercise 4

def _jacobian_cases(seed: int, hidden: bool) -> list:
    g = _generator(4, seed)
    cases = [torch.randn(5, generator=g, dtype=torch.float64),
             torch.randn(3, generator=g, dtype=torch.float64) * 4,
             torch.tensor([30.0, 0.0, -2.0, 1.0], dtype=torch.float64)]
    if hidden:
        cases += [torch.tensor([100.0, 0.0, 0.0], dtype=torch.float64),
                  torch.tensor([0.7], dtype=torch.float64)]
    return cases


def _jacobian_judge(cases: list, outcomes: list) -> str:
    for scores, got in each(cases, outcomes):
        p = _softmax(scores)
        want = torch.diag(p) - torch.outer(p, p)
        n = scores.numel()
        t = to_tensor(got, "softmax_jacobian(scores)", dtype=torch.float64)
        expect_shape(t, (n, n), "softmax_jacobian(scores)",
                     "The Jacobian has one row per output weight and one column per score.")
        if not _allclose(want, torch.zeros_like(want)):
            if _allclose(t, -torch.outer(p, p)):
                fail("you have only the -p_i p_j part: the diagonal also gets +p_i "
                     "(∂p_i/∂s_i = p_i - p_i²).")
            if _allclose(t, torch.diag(p)):
                fail("you have only the diagonal: every weight also depends on every other score "
                     "through the normalising sum, giving -p_i p_j off the diagonal.")
        expect_close(t, want, "softmax_jacobian(scores)", atol=1e-9, rtol=1e-7,
                     hint="∂p_i/∂s_j = p_i (δ_ij - p_j).")
    return "softmax_jacobian: diag(p) - p pᵀ, which shrinks to 0 as p becomes one-hot."


softmax_jacobian = Check(
    id="ch03.softmax_jacobian",
    cases=_jacobian_cases,
    run=lambda fn, case: call(fn, case, name="softmax_jacobian"),
    judge=_jacobian_judge,
    forbid=((torch.autograd.functional, "jacobian"),),
    hints=(
        "Differentiate p_i = exp(s_i) / Σ_l exp(s_l) by hand: s_j sits in the numerator only "
        "when i = j, and in the denominator always.",
        "The quotient rule gives ∂p_i/∂s_j = p_i (δ_ij - p_j): a diagonal part p_i on i = j and "
        "a part -p_i p_j everywhere.",
        "J = diag(p) - outer(p, p) with p = softmax(scores); shape (n, n).",
        f"The worked answer is exercise 4 of {SOLUTION}.",
    ),
    grade_ids=("ch03_jacobian_test",),
)
