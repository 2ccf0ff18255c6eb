"""Checkers for exercises/03_scaling.ipynb: the score variance for entries of any spread (a
formula, then a `measure(seed)` the grader calls on hidden seeds), softmax entropy, a committed
prediction of it over 64 keys (and its explanation), and the softmax Jacobian with a
temperature (the thing that carries gradients back through the weights)."""

from __future__ import annotations

import math
from functools import partial

import torch

from course_lib.attention import softmax as _softmax
from course_lib.checks._cases import generator
from course_lib.checks._core import expect_close, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check, seeds_cases
from course_lib.checks._values import read_numbers

__all__ = ["predicted_variance", "measured_variance", "entropy", "entropy_prediction",
           "entropy_why", "softmax_jacobian", "hint"]

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
    # (64, 0.5, 3) before (4, 2, 1), where a standard deviation is also the unit-variance
    # answer: each of those two mistakes is named by the first case that tells them apart
    conditions = [(1, 1.0, 1.0), (64, 0.5, 3.0), (4, 2.0, 1.0), (1000, 1.0, 0.1)]
    conditions += [(9, 1.5, 1.5), (2, 3.0, 0.2), (4096, 1.0, 1.0)] if hidden else []
    return [{"d_k": d_k, "sigma_q": sq, "sigma_k": sk, "scaled": scaled}
            for d_k, sq, sk in conditions for scaled in (False, True)]


def _variance(d_k: int, sigma_q: float, sigma_k: float, scaled: bool) -> float:
    return sigma_q ** 2 * sigma_k ** 2 * (1.0 if scaled else float(d_k))


def _predict_what(case: dict) -> str:
    return (f"predicted_variance({case['d_k']}, sigma_q={case['sigma_q']:g}, "
            f"sigma_k={case['sigma_k']:g}, scaled={case['scaled']})")


def _predicted(case: dict, x: float) -> dict:
    return {"what": _predict_what(case), "x": x}


def _unit_variance(d_k: int, sigma_q: float, sigma_k: float, scaled: bool) -> float:
    return 1.0 if scaled else float(d_k)


def _standard_deviation(d_k: int, sigma_q: float, sigma_k: float, scaled: bool) -> float:
    return math.sqrt(_variance(d_k, sigma_q, sigma_k, scaled))


def _not_also_unit(case: dict) -> bool:
    """Where the standard deviation is also the unit-variance answer (d_k = 4, sigma_q sigma_k
    = 2), the check names the unit variance."""
    return abs(_standard_deviation(**case) - _unit_variance(**case)) > 1e-9


@function_check(1, args=("d_k", "sigma_q", "sigma_k", "scaled"), grade="predict",
                cases=_predict_cases, reference=_variance, mistakes=(
    Mistake("{what} = {x:.4g} is the standard deviation; the variance is its square.",
            _standard_deviation, atol=1e-9, rtol=1e-9, detail=_predicted, when=_not_also_unit),
    Mistake("{what} = {x:.4g}: that is the unit-variance answer. Each product q_m k_m now has "
            "variance sigma_q² sigma_k², not 1.",
            _unit_variance, atol=1e-9, rtol=1e-9, detail=_predicted),
    Mistake("{what} = {x:.4g} multiplies by sigma_q sigma_k: variances scale with the SQUARE "
            "of a factor (sigma_q² sigma_k²).",
            lambda d_k, sigma_q, sigma_k, scaled: sigma_q * sigma_k * (1.0 if scaled else d_k),
            atol=1e-9, rtol=1e-9, detail=_predicted),
    Mistake("with scaled=True you still predict {x:.4g}: dividing by sqrt(d_k) divides the "
            "variance by (sqrt(d_k))² = d_k.",
            lambda d_k, sigma_q, sigma_k, scaled: _variance(d_k, sigma_q, sigma_k, False),
            atol=1e-9, rtol=1e-9, detail=_predicted),
))
def predicted_variance(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        what = _predict_what(case)
        x = _number(got, what)
        want = expected(case)
        if abs(x - want) <= 1e-9 * max(1.0, want):
            continue
        named_mistake(case, x)
        fail(f"{what} = {x:.4g} is not the variance. Each term q_m·k_m has mean 0 and "
             "variance sigma_q² sigma_k², and variances of independent terms add.")
    return ("predicted_variance: d_k sigma_q² sigma_k² without scaling, sigma_q² sigma_k² with "
            "it.")


# ---------------------------------------------------------------- exercise 2 (experiment)

MEASURE_D_K, MEASURE_SIGMA_Q, MEASURE_SIGMA_K = 64, 2.0, 1.5
_MEASURE_RTOL = 0.15   # 300 x 300 scores: an honest estimate is within ~5% of the truth


def _measure_reference() -> float:
    return _variance(MEASURE_D_K, MEASURE_SIGMA_Q, MEASURE_SIGMA_K, False)


def _measure(seed: int, std: bool = False, unit: bool = False) -> float:
    """The measurement of exercise 2: the variance of the 300 x 300 raw scores of queries and
    keys drawn from `seed` (or, `std`, their standard deviation; `unit`, with unit-variance
    entries)."""
    g = torch.Generator().manual_seed(seed)
    sq, sk = (1.0, 1.0) if unit else (MEASURE_SIGMA_Q, MEASURE_SIGMA_K)
    q = sq * torch.randn(300, MEASURE_D_K, generator=g)
    k = sk * torch.randn(300, MEASURE_D_K, generator=g)
    scores = q @ k.T
    return float(scores.std() if std else scores.var())


def _measured(case: dict, x: float) -> dict:
    return {"what": f"measure({case['seed']})", "x": x}


@function_check(2, args=("seed",), grade="measured", cases=seeds_cases(2), reference=_measure,
                mistakes=(
    Mistake("{what} is exactly the formula's value: a variance estimated from random samples is "
            "never exact. Draw the queries and keys with the seed and measure.",
            lambda seed: _measure_reference(), atol=0, rtol=0, detail=_measured),
    Mistake("{what} = {x:.4g} is far too small: it looks like a standard deviation. Report the "
            "variance of the scores.",
            partial(_measure, std=True), atol=0, rtol=_MEASURE_RTOL, detail=_measured),
    Mistake("{what} = {x:.4g} is too small: did you draw unit-variance entries? Queries have "
            f"standard deviation {MEASURE_SIGMA_Q:g}, keys {MEASURE_SIGMA_K:g}.",
            partial(_measure, unit=True), atol=0, rtol=_MEASURE_RTOL, detail=_measured),
))
def measured_variance(cases: list, outcomes: list) -> str:
    want, values = _measure_reference(), []
    for case, got in each(cases, outcomes):
        what = f"measure({case['seed']})"
        x = _number(got, what)
        values.append(x)
        named_mistake(case, x)  # none of them lies within the sampling noise of the formula
        if abs(x - want) <= _MEASURE_RTOL * want:
            continue
        side = "too large" if x > want else "too small"
        fail(f"{what} = {x:.4g} is {side} (by more than the sampling noise of 300 x 300 "
             "scores): the variance of all the RAW scores q·k (no 1/sqrt(d_k)) for queries of "
             f"standard deviation {MEASURE_SIGMA_Q:g} and keys of {MEASURE_SIGMA_K:g}.")
    if len(set(values)) < len(values):
        fail("measure returns the same number for different seeds: it does not draw its "
             "samples from the seed it is given.")
    return (f"measured_variance: your measurements ({', '.join(f'{v:.0f}' for v in values)}) "
            "agree with d_k sigma_q² sigma_k², seed after seed.")


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


def _entropy(weights: torch.Tensor) -> torch.Tensor:
    logs = torch.where(weights > 0, weights.clamp_min(1e-300).log(), torch.zeros_like(weights))
    return -(weights * logs).sum(-1)


@function_check(3, cases=_entropy_cases,
                forbid=((torch.distributions.Categorical, "entropy"), (torch.special, "entr")),
                reference=_entropy, mistakes=(
    Mistake("your entropies are negative: H = -Σ w log w, with a minus sign.",
            lambda weights: -_entropy(weights), atol=1e-8),
    Mistake("your entropy is in bits (log2); use the natural log (nats) as the chapter does.",
            lambda weights: _entropy(weights) / math.log(2), atol=1e-8),
))
def entropy(cases: list, outcomes: list) -> str:
    for weights, got in each(cases, outcomes):
        want = expected(weights)
        t = to_tensor(got, "entropy(weights)", dtype=torch.float64)
        expect_shape(t, want.shape, "entropy(weights)",
                     "One entropy per row: sum over the last axis only.")
        if not torch.isfinite(t).all() and (weights == 0).any():
            fail("entropy gives NaN for a row with exact zeros: 0 · log 0 is NaN in floating "
                 "point but 0 in the formula. Make zero weights contribute exactly 0.")
        named_mistake(weights, t)
        expect_close(t, want, "entropy(weights)", atol=1e-8, rtol=1e-6,
                     hint="H = -Σ_j w_j log w_j over the last axis; uniform over n keys gives "
                          "log n.")
    return "entropy: -Σ w log w per row, 0 for a one-hot row, log n for a uniform one."


# ---------------------------------------------------------------- exercise 5

def _jacobian_cases(seed: int, hidden: bool) -> list:
    g = generator(4, seed)
    cases = [(torch.randn(5, generator=g, dtype=torch.float64), 1.0),
             (torch.randn(3, generator=g, dtype=torch.float64) * 4, 0.5),
             (torch.tensor([30.0, 0.0, -2.0, 1.0], dtype=torch.float64), 10.0)]
    if hidden:
        cases += [(torch.tensor([100.0, 0.0, 0.0], dtype=torch.float64), 2.0),
                  (torch.tensor([0.7], dtype=torch.float64), 0.3)]
    return [{"scores": s, "temperature": t} for s, t in cases]


def _jacobian(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    p = _softmax(scores / temperature)
    return (torch.diag(p) - torch.outer(p, p)) / temperature


def _outer_only(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    p = _softmax(scores / temperature)
    return -torch.outer(p, p) / temperature


def _jacobian_what(case: dict, got=None) -> dict:
    return {"what": f"softmax_jacobian(scores, temperature={case['temperature']:g})"}


@function_check(5, args=("scores", "temperature"), grade="jacobian", cases=_jacobian_cases,
                forbid=((torch.autograd.functional, "jacobian"),), reference=_jacobian,
                mistakes=(
    Mistake("{what}: you forgot the chain rule's factor 1/T: the weights depend on s / T, so "
            "every entry gets divided by the temperature.",
            lambda scores, temperature: _jacobian(scores, temperature) * temperature,
            atol=1e-8, detail=_jacobian_what),
    Mistake("{what}: you multiplied by the temperature; d(s/T)/ds = 1/T divides.",
            lambda scores, temperature: _jacobian(scores, temperature) * temperature * temperature,
            atol=1e-8, detail=_jacobian_what),
    Mistake("{what}: your weights ignore the temperature: p = softmax(s / T).",
            lambda scores, temperature: _jacobian(scores, 1.0) / temperature,
            atol=1e-8, detail=_jacobian_what),
    Mistake("you have only the -p_i p_j part: the diagonal also gets +p_i.", _outer_only,
            atol=1e-8),
))
def softmax_jacobian(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        n = case["scores"].numel()
        what = _jacobian_what(case)["what"]
        want = expected(case)
        got_t = to_tensor(got, what, dtype=torch.float64)
        expect_shape(got_t, (n, n), what,
                     "The Jacobian has one row per output weight and one column per score.")
        named_mistake(case, got_t)
        expect_close(got_t, want, what, atol=1e-9, rtol=1e-7,
                     hint="∂p_i/∂s_j = p_i (δ_ij - p_j) / T with p = softmax(s / T).")
    return ("softmax_jacobian: (diag(p) - p pᵀ) / T: a cold softmax has large but rare "
            "gradients, a hot one small and spread.")


# ---------------------------------------------------------------- exercise 4 (predict)

ENTROPY_D_K, ENTROPY_KEYS = 64, 64


def entropy_experiment(n_queries: int = 2000, seed: int = 4) -> dict:
    """The run of exercise 4: mean entropy (nats) of softmax(q·k) and of softmax(q·k / sqrt(d_k))
    over 64 random keys at d_k = 64, for random unit-variance queries and keys."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_queries, 1, ENTROPY_D_K, generator=g, dtype=torch.float64)
    k = torch.randn(n_queries, ENTROPY_KEYS, ENTROPY_D_K, generator=g, dtype=torch.float64)
    raw = (q @ k.transpose(-2, -1)).squeeze(1)
    out = {}
    for name, s in (("unscaled", raw), ("scaled", raw / math.sqrt(ENTROPY_D_K))):
        w = torch.softmax(s, dim=-1)
        out[name] = float(-torch.xlogy(w, w).sum(-1).mean())
    return out


def _read_entropy(got) -> dict:
    top = math.log(ENTROPY_KEYS)
    predicted = read_numbers(got, "predicted_entropy", ("unscaled", "scaled"))
    for name, value in predicted.items():
        if not -1e-9 <= value <= top + 1e-9:
            fail(f"predicted_entropy[{name!r}] = {value:.3g} is impossible: the entropy of "
                 f"weights over {ENTROPY_KEYS} keys lies between 0 (one-hot) and "
                 f"log {ENTROPY_KEYS} = {top:.3f} (uniform).")
    return predicted


@commit_check(4, read=_read_entropy)
def entropy_prediction(predicted: dict) -> str:
    run, top = entropy_experiment(), math.log(ENTROPY_KEYS)
    return (f"prediction committed. The run: unscaled {run['unscaled']:.2f} nats (you "
            f"predicted {predicted['unscaled']:.2f}), scaled {run['scaled']:.2f} nats (you "
            f"predicted {predicted['scaled']:.2f}), against log {ENTROPY_KEYS} = {top:.2f} for "
            "uniform weights.")


entropy_why = choice_check(4, "entropy_why", "abc", module=__name__)


