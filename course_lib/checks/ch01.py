"""Checkers for exercises/01_soft_dictionary.ipynb: distance scores, a stable log-softmax with a
temperature, a soft lookup by closeness, the gradient of a lookup with respect to its query, a
committed prediction of a cold and a hot lookup (and its explanation), and a batched lookup."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

import course_lib.lookup as lookup
from course_lib.checks._core import expect_close, expect_pair, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._routes import ATTENTION, SOFTMAX
from course_lib.checks._values import read_numbers

__all__ = ["similarity_scores", "log_softmax_weights", "soft_lookup", "query_gradient",
           "temperature_prediction", "temperature_why", "lookup_many", "hint"]

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


def _distance_scores(query: np.ndarray, keys: np.ndarray) -> np.ndarray:
    return -((keys - query) ** 2).sum(axis=-1)


@function_check(1, args=("query", "keys"), grade="scores", cases=_scores_cases,
                reference=_distance_scores, mistakes=(
    Mistake("your scores are the squared distances themselves: a NEAR key must get the HIGHER "
            "score, so the score is minus the squared distance.",
            lambda query, keys: -_distance_scores(query, keys), atol=1e-8, rtol=1e-5),
    Mistake("your scores are minus the distance; the exercise asks for minus the SQUARED "
            "distance (no square root).",
            lambda query, keys: -np.sqrt(-_distance_scores(query, keys)), atol=1e-8, rtol=1e-5),
    Mistake("those are dot products, chapter 01's scores; this exercise scores a key by how "
            "close it lies to the query: minus the squared distance.",
            lambda query, keys: keys @ query, atol=1e-8, rtol=1e-5),
))
def similarity_scores(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        (n, d), want = case["keys"].shape, expected(case)
        t = to_tensor(got, "similarity_scores(query, keys)", dtype=torch.float64)
        if t.shape != want.shape and t.numel() in (n * n, d) and n != d:
            fail(f"similarity_scores returned shape {tuple(t.shape)} for {n} keys of size {d}; "
                 f"expected one score per key, shape ({n},).")
        named_mistake(case, t)
        expect_close(t, want, "similarity_scores(query, keys)", atol=1e-8, rtol=1e-6,
                     hint="Key j's score is -(sum over m of (keys[j, m] - query[m])²).")
    return "similarity_scores: minus the squared distance to every key, shape (n,)."


# ---------------------------------------------------------------- exercise 2

def _softmax_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([2, seed])
    cases = [(rng.normal(size=6), 1.0), (rng.normal(size=4) * 3, 0.25),
             (np.array([1000.0, 999.0, -1000.0]), 1.0), (np.array([0.5]), 2.0),
             (np.array([0.0, -2000.0, 1.0]), 1.0)]
    if hidden:
        cases += [(np.array([-1e4, 0.0, 1e4]), 1.0), (np.array([2.0, 2.0]), 0.001),
                  (rng.normal(size=50) * 10, 3.0)]
    return [{"scores": s, "temperature": t} for s, t in cases]


def _log_softmax(scores: np.ndarray, temperature: float) -> np.ndarray:
    z = scores / temperature
    shifted = z - z.max()
    return shifted - np.log(np.exp(shifted).sum())


@function_check(2, args=("scores", "temperature"), grade="softmax", cases=_softmax_cases,
                forbid=(*SOFTMAX, (torch, "logsumexp"), (torch.Tensor, "logsumexp")),
                reference=_log_softmax, mistakes=(
    Mistake("you returned the weights themselves; the exercise asks for their logs (each one "
            "<= 0, and exp of them sums to 1).",
            lambda scores, temperature: np.exp(_log_softmax(scores, temperature)), atol=1e-9,
            rtol=1e-5),
))
def log_softmax_weights(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        scores = case["scores"]
        want = expected(case)
        t = to_tensor(got, "log_softmax_weights(scores, temperature)", dtype=torch.float64)
        named_mistake(case, t)
        if t.shape == want.shape and scores.size > 1:
            if bool(torch.isneginf(t).any()) and bool(torch.isfinite(want).all()):
                fail(f"log_softmax_weights gives -inf for scores like {scores.tolist()}: a weight "
                     "that underflows to 0 has log -inf, though its log is an ordinary number. "
                     "Compute the log directly instead of taking the log of the weights.")
            if not torch.isfinite(t).all():
                fail(f"log_softmax_weights gives NaN/inf for scores like {scores.tolist()}: exp of "
                     "a large score overflows. Shift the scores first; a shift cancels out.")
            if abs(float(t.exp().sum()) - 1) > 1e-6:
                fail(f"exp of your log-weights sums to {float(t.exp().sum()):.4f}, not 1: "
                     "subtract the log of the normalising sum.")
        expect_close(t, want, "log_softmax_weights(scores, temperature)", atol=1e-9, rtol=1e-7,
                     hint="Divide the scores by the temperature first.")
    return ("log_softmax_weights: stable log-weights (finite where the weights underflow), "
            "with the temperature.")


# ---------------------------------------------------------------- exercise 3

def _lookup_cases(seed: int, hidden: bool) -> list:
    rng = np.random.default_rng([3, seed])
    sizes = [(5, 3, None, 1.0), (7, 4, 2, 0.5), (3, 2, 3, 4.0)]
    if hidden:
        sizes += [(1, 3, 2, 1.0), (20, 8, None, 0.1)]
    return [dict(_problem(rng, n, d, d_v), temperature=t) for n, d, d_v, t in sizes]


def _scored_lookup(scores: np.ndarray, values: np.ndarray, temperature: float) -> tuple:
    w = np.exp(_log_softmax(scores, temperature))
    return w @ values, w


def _near_lookup(query, keys, values, temperature) -> tuple:
    return _scored_lookup(_distance_scores(query, keys), values, temperature)


def _weights(result):
    return result[1]


@function_check(3, args=("query", "keys", "values", "temperature"), cases=_lookup_cases,
                forbid=ATTENTION, reference=_near_lookup, mistakes=(
    Mistake("your weights come from dot products; this lookup scores keys by closeness: use "
            "your similarity_scores.",
            lambda query, keys, values, temperature: _scored_lookup(keys @ query, values,
                                                                    temperature),
            atol=1e-8, rtol=1e-5, on=_weights),
))
def soft_lookup(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        want_value, want_weights = expected(case)
        blended, weights = expect_pair(result, "soft_lookup", "(value, weights)")
        w = to_tensor(weights, "the weights", dtype=torch.float64)
        if w.shape == want_weights.shape and bool((w <= 0).all()) and w.numel() > 1:
            fail("your weights are all <= 0: those are log-weights. Turn them into weights "
                 "(exp) before you blend the values.")
        named_mistake(case, (blended, w))
        expect_close(w, want_weights, "the weights", atol=1e-9, rtol=1e-7,
                     hint="One weight per key: the softmax of the distance scores, with the "
                          "temperature.")
        expect_close(blended, torch.as_tensor(want_value, dtype=torch.float64),
                     "the blended value", atol=1e-9, rtol=1e-7,
                     hint="The value is the weighted sum of the rows of values.")
    return "soft_lookup: weights from closeness, blended values, for scalar and vector values."


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


@commit_check(5, read=partial(read_numbers, name="prediction", keys=tuple(TEMPERATURES)),
              grade="temperature")
def temperature_prediction(predicted: dict) -> str:
    parts = []
    for name, temperature in TEMPERATURES.items():
        measured, weights = lookup.soft_lookup(PREDICT_QUERY, PREDICT_KEYS, PREDICT_VALUES,
                                               temperature)
        parts.append(f"{name} (T = {temperature:g}): the lookup returns {float(measured):.2f} "
                     f"with weights {np.round(weights, 3).tolist()}, you predicted "
                     f"{predicted[name]:.2f}")
    return "prediction committed. The run: " + "; ".join(parts) + "."


temperature_why = choice_check(5, "temperature_why", "abc", module=__name__)


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
    # rows of very different scale: a query of norm ~1000 next to one of norm ~1 (a shift by
    # the max of the WHOLE matrix underflows the small row to 0 / 0)
    problem = _problem(rng, 4, 3, 2)
    del problem["query"]
    queries = rng.normal(size=(3, 3)) * np.array([[1000.0], [1.0], [-300.0]])
    cases.append({"queries": queries, **problem, "temperature": 1.0})
    return cases


def _many_softmax(scores: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _many_lookup(queries, keys, values, temperature, axis: int = 1) -> tuple:
    """The lookup of every query, its softmax over `axis` (1, the keys; 0 is the planted bug's
    softmax over the queries: its shift by the max of the whole matrix cancels in a column)."""
    w = _many_softmax(queries @ keys.T / temperature, axis=axis)
    return w @ values, w


@function_check(6, args=("queries", "keys", "values", "temperature"), cases=_many_cases,
                forbid=ATTENTION, reference=_many_lookup, mistakes=(
    Mistake("still normalising over the queries: each COLUMN of your weights sums to 1 (the sum "
            "ran over axis 0, the queries). Each query's ROW must sum to 1: its weights are "
            "spread over the keys.", partial(_many_lookup, axis=0), atol=1e-8, rtol=1e-5,
            on=_weights),
))
def lookup_many(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        want_blended, want = expected(case)
        m, n = want.shape
        blended, weights = expect_pair(result, "lookup_many", "(blended, weights)")
        w = to_tensor(weights, "the weights of lookup_many", dtype=torch.float64)
        expect_shape(w, (m, n), "the weights of lookup_many", "One row per query, one column per "
                     "key.")
        named_mistake(case, (blended, w))
        if not bool(torch.isfinite(w).all()) and bool(torch.isfinite(want).all()):
            fail("some rows of your weights are NaN when the queries differ in scale (one query "
                 "a thousand times longer than another): every row was shifted by the largest "
                 "score of the WHOLE matrix, so a row far below it underflows to 0 / 0. Shift "
                 "each row by its own largest score.")
        rows = w.sum(dim=1)
        if bool(torch.isfinite(rows).all()) and not torch.allclose(rows, torch.ones_like(rows)):
            fail(f"the rows of your weights sum to {rows.numpy().round(3).tolist()}, not 1: "
                 "each query's weights over the keys must sum to 1.")
        expect_close(w, want, "the weights of lookup_many", atol=1e-9, rtol=1e-7)
        expect_close(blended, want_blended, "the blended values of lookup_many",
                     atol=1e-9, rtol=1e-7, hint="Each query blends the rows of values with its "
                     "own weights.")
    return ("lookup_many: every query's weights sum to 1 over the keys, each row shifted by its "
            "own max; the bugs are fixed.")

