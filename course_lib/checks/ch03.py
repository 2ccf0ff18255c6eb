"""Checkers for exercises/03_scaling.ipynb: the score variance for entries of any spread (a
formula, then a `measure(seed)` the grader calls on hidden seeds), softmax entropy, a committed
prediction of it over 64 keys (and its explanation), and the softmax Jacobian with a
temperature (the thing that carries gradients back through the weights)."""

from __future__ import annotations

import math

import torch

from course_lib.attention import softmax as _softmax
from course_lib.checks._cases import generator
from course_lib.checks._core import expect_close, expect_shape, fail, matches, to_tensor
from course_lib.checks._predict import choice_check, commit_check, seeds_cases
from course_lib.checks._protocol import each, function_check, hint
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
    conditions = [(1, 1.0, 1.0), (4, 2.0, 1.0), (64, 0.5, 3.0), (1000, 1.0, 0.1)]
    conditions += [(9, 1.5, 1.5), (2, 3.0, 0.2), (4096, 1.0, 1.0)] if hidden else []
    return [{"d_k": d_k, "sigma_q": sq, "sigma_k": sk, "scaled": scaled}
            for d_k, sq, sk in conditions for scaled in (False, True)]


def _variance(d_k: int, sigma_q: float, sigma_k: float, scaled: bool) -> float:
    return sigma_q ** 2 * sigma_k ** 2 * (1.0 if scaled else float(d_k))


@function_check(1, args=("d_k", "sigma_q", "sigma_k", "scaled"), grade="predict",
                cases=_predict_cases)
def predicted_variance(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        d_k, sq, sk, scaled = case["d_k"], case["sigma_q"], case["sigma_k"], case["scaled"]
        what = f"predicted_variance({d_k}, sigma_q={sq:g}, sigma_k={sk:g}, scaled={scaled})"
        x = _number(got, what)
        want = _variance(d_k, sq, sk, scaled)
        if abs(x - want) <= 1e-9 * max(1.0, want):
            continue
        unit = 1.0 if scaled else float(d_k)
        if abs(x - math.sqrt(want)) < 1e-9 * max(1.0, want) and \
                abs(math.sqrt(want) - unit) > 1e-9 and want != 1:
            fail(f"{what} = {x:.4g} is the standard deviation; the variance is its square.")
        if sq * sk != 1 and abs(x - unit) < 1e-9 * unit:
            fail(f"{what} = {x:.4g}: that is the unit-variance answer. Each product q_m k_m now "
                 "has variance sigma_q² sigma_k², not 1.")
        if sq * sk != 1 and abs(x - unit * sq * sk) < 1e-9 * max(1.0, x):
            fail(f"{what} = {x:.4g} multiplies by sigma_q sigma_k: variances scale with the "
                 "SQUARE of a factor (sigma_q² sigma_k²).")
        if scaled and abs(x - _variance(d_k, sq, sk, False)) < 1e-9 * d_k:
            fail(f"with scaled=True you still predict {x:.4g}: dividing by sqrt(d_k) divides the "
                 "variance by (sqrt(d_k))² = d_k.")
        fail(f"{what} = {x:.4g} is not the variance. Each term q_m·k_m has mean 0 and "
             "variance sigma_q² sigma_k², and variances of independent terms add.")
    return ("predicted_variance: d_k sigma_q² sigma_k² without scaling, sigma_q² sigma_k² with "
            "it.")


# ---------------------------------------------------------------- exercise 2 (experiment)

MEASURE_D_K, MEASURE_SIGMA_Q, MEASURE_SIGMA_K = 64, 2.0, 1.5
_MEASURE_RTOL = 0.15   # 300 x 300 scores: an honest estimate is within ~5% of the truth


def _measure_reference() -> float:
    return _variance(MEASURE_D_K, MEASURE_SIGMA_Q, MEASURE_SIGMA_K, False)


@function_check(2, args=("seed",), grade="measured", cases=seeds_cases(2))
def measured_variance(cases: list, outcomes: list) -> str:
    want, values = _measure_reference(), []
    for case, got in each(cases, outcomes):
        what = f"measure({case['seed']})"
        x = _number(got, what)
        values.append(x)
        if x == want:
            fail(f"{what} is exactly the formula's value: a variance estimated from random "
                 "samples is never exact. Draw the queries and keys with the seed and measure.")
        if abs(x - want) <= _MEASURE_RTOL * want:
            continue
        if abs(x - math.sqrt(want)) <= _MEASURE_RTOL * math.sqrt(want):
            fail(f"{what} = {x:.4g} is far too small: it looks like a standard deviation. "
                 "Report the variance of the scores.")
        if abs(x - MEASURE_D_K) <= _MEASURE_RTOL * MEASURE_D_K:
            fail(f"{what} = {x:.4g} is too small: did you draw unit-variance entries? Queries "
                 f"have standard deviation {MEASURE_SIGMA_Q:g}, keys {MEASURE_SIGMA_K:g}.")
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


@function_check(3, cases=_entropy_cases,
                forbid=((torch.distributions.Categorical, "entropy"), (torch.special, "entr")))
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


@function_check(5, args=("scores", "temperature"), grade="jacobian", cases=_jacobian_cases,
                forbid=((torch.autograd.functional, "jacobian"),))
def softmax_jacobian(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        scores, t = case["scores"], case["temperature"]
        want = _jacobian(scores, t)
        n = scores.numel()
        what = f"softmax_jacobian(scores, temperature={t:g})"
        got_t = to_tensor(got, what, dtype=torch.float64)
        expect_shape(got_t, (n, n), what,
                     "The Jacobian has one row per output weight and one column per score.")
        if not matches(want, torch.zeros_like(want)) and t != 1:
            p = _softmax(scores / t)
            if matches(got_t, want * t):
                fail(f"{what}: you forgot the chain rule's factor 1/T: the weights depend on "
                     "s / T, so every entry gets divided by the temperature.")
            if matches(got_t, want * t * t):
                fail(f"{what}: you multiplied by the temperature; d(s/T)/ds = 1/T divides.")
            p1 = _softmax(scores)
            if matches(got_t, (torch.diag(p1) - torch.outer(p1, p1)) / t):
                fail(f"{what}: your weights ignore the temperature: p = softmax(s / T).")
        p = _softmax(scores / t)
        if n > 1 and matches(got_t, -torch.outer(p, p) / t):
            fail("you have only the -p_i p_j part: the diagonal also gets +p_i.")
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


