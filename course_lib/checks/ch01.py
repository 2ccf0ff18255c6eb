"""Checkers for exercises/01_soft_dictionary.ipynb: scores, a stable softmax with a temperature,
the soft lookup, and the gradient of a lookup with respect to its query."""

from __future__ import annotations

import numpy as np
import torch

import course_lib.lookup as lookup
from course_lib.checks._core import expect_close, expect_pair, expect_shape, fail, to_tensor
from course_lib.checks._protocol import each, function_check, hint, value_check
from course_lib.checks._values import read_numbers

__all__ = ["similarity_scores", "softmax_weights", "soft_lookup", "query_gradient",
           "temperature_prediction", "lookup_many", "hint"]

SOLUTION = "solutions/01_soft_dictionary.ipynb"


def _problem(rng: np.random.Generator, n: int, d: int, d_v: int | None = None) -> dict:
    keys = rng.normal(size=(n, d))
    values = rng.normal(size=(n,)) if d_v is None else rng.normal(size=(n, d_v))
    return {"query": rng.normal(size=(d,)), "keys": keys, "values": values}


# ---------------------------------------------------------------- exercise 1

def _scores_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([1, seed])
    sizes = [(5, 3), (1, 4), (8, 2)] + ([(3, 3), (40, 16)] if hidden else [])
    return [_problem(rng, n, d) for n, d in sizes]


@function_check(1, args=("query", "keys"), grade="scores", cases=_scores_cases)
def similarity_scores(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        query, keys = case["query"], case["keys"]
        (n, d), want = keys.shape, torch.as_tensor(keys @ query)
        t = to_tensor(got, "similarity_scores(query, keys)", dtype=torch.float64)
        if t.shape != want.shape and t.numel() in (n * n, d) and n != d:
            fail(f"similarity_scores returned shape {tuple(t.shape)} for {n} keys of size {d}; "
                 f"expected one score per key, shape ({n},).")
        expect_close(t, want, "similarity_scores(query, keys)", atol=1e-8, rtol=1e-6,
                     hint="The score of key j is the dot product of key j with the query.")
    return "similarity_scores: one dot product per key, shape (n,)."


# ---------------------------------------------------------------- exercise 2

def _softmax_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([2, seed])
    cases = [(rng.normal(size=6), 1.0), (rng.normal(size=4) * 3, 0.25),
             (np.array([1000.0, 999.0, -1000.0]), 1.0), (np.array([0.5]), 2.0)]
    if hidden:
        cases += [(np.array([-1e4, 0.0, 1e4]), 1.0), (np.array([2.0, 2.0]), 0.001),
                  (rng.normal(size=50) * 10, 3.0)]
    return [{"scores": s, "temperature": t} for s, t in cases]


@function_check(2, args=("scores", "temperature"), grade="softmax", cases=_softmax_cases)
def softmax_weights(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        scores, temperature = case["scores"], case["temperature"]
        z = scores / temperature
        want = torch.as_tensor(np.exp(z - z.max()) / np.exp(z - z.max()).sum())
        t = to_tensor(got, "softmax_weights(scores, temperature)", dtype=torch.float64)
        if t.shape == want.shape and not torch.isfinite(t).all() and np.abs(z).max() > 100:
            fail(f"softmax_weights gives NaN/inf for scores like {scores.tolist()}: exp of a large "
                 "score overflows. Shift the scores before exponentiating; a shift cancels out.")
        if t.shape == want.shape and torch.isfinite(t).all() and abs(float(t.sum()) - 1) > 1e-6:
            fail(f"your weights sum to {float(t.sum()):.4f}, not 1: divide by the sum of the "
                 "exponentials.")
        expect_close(t, want, "softmax_weights(scores, temperature)", atol=1e-9, rtol=1e-7,
                     hint="Divide the scores by the temperature before the softmax.")
    return "softmax_weights: a stable softmax that sums to 1 and respects the temperature."


# ---------------------------------------------------------------- exercise 3

def _lookup_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([3, seed])
    sizes = [(5, 3, None, 1.0), (7, 4, 2, 0.5), (3, 2, 3, 4.0)]
    if hidden:
        sizes += [(1, 3, 2, 1.0), (20, 8, None, 0.1)]
    return [dict(_problem(rng, n, d, d_v), temperature=t) for n, d, d_v, t in sizes]


@function_check(3, args=("query", "keys", "values", "temperature"), cases=_lookup_cases,
                forbid=((lookup, "soft_lookup"),))
def soft_lookup(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        want_value, want_weights = lookup.soft_lookup(
            case["query"], case["keys"], case["values"], case["temperature"])
        blended, weights = expect_pair(result, "soft_lookup", "(value, weights)")
        expect_close(weights, torch.as_tensor(want_weights), "the weights", atol=1e-9, rtol=1e-7,
                     hint="One weight per key: the softmax of the query's scores, with the "
                          "temperature.")
        expect_close(blended, torch.as_tensor(want_value), "the blended value", atol=1e-9,
                     rtol=1e-7, hint="The value is the weighted sum of the rows of values.")
    return "soft_lookup: weights and blended value match, for scalar and vector values."


# ---------------------------------------------------------------- exercise 4

def _gradient_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([4, seed])
    sizes = [(5, 3, 1.0), (4, 2, 0.3), (6, 5, 2.0)]
    sizes += [(2, 1, 1.0), (12, 6, 0.5)] if hidden else []
    return [dict(_problem(rng, n, d), temperature=t) for n, d, t in sizes]


@function_check(4, args=("query", "keys", "values", "temperature"), grade="gradient",
                cases=_gradient_cases)
def query_gradient(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        q = torch.tensor(case["query"], requires_grad=True)
        blended, _ = lookup.soft_lookup(q, torch.as_tensor(case["keys"]),
                                        torch.as_tensor(case["values"]), case["temperature"])
        (want,) = torch.autograd.grad(blended, q)
        t = to_tensor(got, "query_gradient(...)", dtype=torch.float64)
        if t.shape == () or t.numel() == 1 and want.numel() > 1:
            fail(f"query_gradient returned a single number; expected one partial derivative per "
                 f"query component, shape ({want.numel()},): return the query's gradient, not the "
                 "value.")
        if t.shape == want.shape and torch.allclose(t, torch.zeros_like(t)):
            fail("query_gradient returned all zeros: did you ask autograd to track the query "
                 "(requires_grad=True) and run backward from the blended value?")
        expect_close(t, want, "query_gradient(...)", atol=1e-8, rtol=1e-6,
                     hint="Build the lookup from torch operations so autograd can follow it.")
    return "query_gradient: autograd flows through the soft lookup to the query."


# ---------------------------------------------------------------- exercise 5 (predict)

# The small dictionary of exercise 5 (the notebook's given cell builds the same one).
PREDICT_KEYS = np.array([[2.0, 0.0], [0.0, 2.0], [-2.0, 0.0], [0.0, -2.0]])
PREDICT_VALUES = np.array([10.0, 20.0, 30.0, 40.0])
PREDICT_QUERY = np.array([1.0, 0.5])
TEMPERATURES = {"cold": 0.01, "hot": 100.0}
_TOLERANCE = {"cold": 0.5, "hot": 1.0}


@value_check(5, grade="temperature")
def temperature_prediction(cases: list, outcomes: list) -> str:
    (_, got), = each(cases, outcomes)
    predicted = read_numbers(got, "prediction", tuple(TEMPERATURES))
    lines = []
    for name, temperature in TEMPERATURES.items():
        measured, weights = lookup.soft_lookup(PREDICT_QUERY, PREDICT_KEYS, PREDICT_VALUES,
                                               temperature)
        gap = predicted[name] - float(measured)
        if abs(gap) > _TOLERANCE[name]:
            why = ("a cold softmax puts (almost) all the weight on the best-matching key, "
                   f"key {int(np.argmax(weights))}: the soft lookup becomes a hard lookup"
                   if name == "cold" else
                   "a hot softmax flattens the weights towards 1/n each: the lookup returns "
                   "(nearly) the plain average of the values")
            lines.append(f"at temperature {temperature:g} the lookup returned "
                         f"{float(measured):.2f}, you predicted {predicted[name]:.2f}: {why}.")
    if lines:
        fail("your prediction is off: " + " And ".join(lines))
    return ("prediction: cold -> the best match's value (a hard lookup), hot -> nearly the "
            "average of the values.")


# ---------------------------------------------------------------- exercise 6 (debug)

def _many_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([6, seed])
    sizes = [(3, 5, 2, 2, 1.0), (4, 4, 3, 1, 0.5), (1, 6, 2, 3, 2.0), (6, 2, 4, 2, 1.0)]
    sizes += [(8, 8, 5, 3, 0.2), (2, 30, 3, 4, 3.0)] if hidden else []
    cases = []
    for m, n, d, d_v, t in sizes:
        problem = _problem(rng, n, d, d_v)
        del problem["query"]
        cases.append({"queries": rng.normal(size=(m, d)), **problem, "temperature": t})
    return cases


def _many_softmax(scores: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@function_check(6, args=("queries", "keys", "values", "temperature"), cases=_many_cases,
                forbid=((lookup, "soft_lookup"),))
def lookup_many(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        queries, keys, values = case["queries"], case["keys"], case["values"]
        scores = queries @ keys.T / case["temperature"]
        (m, n), want = scores.shape, _many_softmax(scores, axis=1)
        blended, weights = expect_pair(result, "lookup_many", "(blended, weights)")
        w = to_tensor(weights, "the weights of lookup_many", dtype=torch.float64)
        expect_shape(w, (m, n), "the weights of lookup_many", "One row per query, one column per "
                     "key.")
        if m > 1 and torch.allclose(w, torch.as_tensor(_many_softmax(scores, axis=0))):
            fail("still normalising over the queries: each COLUMN of your weights sums to 1 "
                 "(the sum ran over axis 0, the queries). Each query's ROW must sum to 1: its "
                 "weights are spread over the keys.")
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        if m == n and torch.allclose(w, torch.as_tensor(e / e.sum(axis=1))):
            fail("your row sums broadcast along the wrong axis: a sum over axis 1 has shape "
                 "(m,), which divides COLUMN j by row j's sum. Keep the summed axis "
                 "(keepdims=True) so each row is divided by its own sum.")
        rows = w.sum(dim=1)
        if bool(torch.isfinite(rows).all()) and not torch.allclose(rows, torch.ones_like(rows)):
            fail(f"the rows of your weights sum to {rows.numpy().round(3).tolist()}, not 1: "
                 "each query's weights over the keys must sum to 1.")
        expect_close(w, torch.as_tensor(want), "the weights of lookup_many", atol=1e-9, rtol=1e-7)
        expect_close(blended, torch.as_tensor(want @ values), "the blended values of lookup_many",
                     atol=1e-9, rtol=1e-7, hint="Each query blends the rows of values with its "
                     "own weights.")
    return "lookup_many: every query's weights sum to 1 over the keys; the bug is fixed."

