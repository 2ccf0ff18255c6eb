"""Checkers for exercises/01_soft_dictionary.ipynb."""

from __future__ import annotations

import numpy as np
import torch

import course_lib.lookup as lookup
from course_lib.checks._core import call, expect_close, fail, forbid, passed, to_tensor


def _problem(seed: int, n: int = 5, d: int = 3, d_v: int | None = None):
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, d))
    values = rng.normal(size=(n,)) if d_v is None else rng.normal(size=(n, d_v))
    query = rng.normal(size=(d,))
    return query, keys, values


def similarity_scores(fn) -> None:
    """Exercise 1: scores(query, keys) -> (n,) dot products of the query with every key."""
    for seed, (n, d) in enumerate([(5, 3), (1, 4), (8, 2)]):
        query, keys, _ = _problem(seed, n, d)
        got = call(fn, query.copy(), keys.copy(), name="similarity_scores")
        want = torch.as_tensor(keys @ query)
        t = to_tensor(got, "similarity_scores(query, keys)", dtype=torch.float64)
        if t.shape != want.shape and t.numel() in (n * n, d) and n != d:
            fail(f"similarity_scores returned shape {tuple(t.shape)} for {n} keys of size {d}; "
                 f"expected one score per key, shape ({n},): multiply keys (n, d) by query (d,).")
        expect_close(t, want, "similarity_scores(query, keys)", atol=1e-8, rtol=1e-6,
                     hint="The score of key j is the dot product sum_m keys[j, m] * query[m].")
    passed("similarity_scores: one dot product per key, shape (n,).")


def softmax_weights(fn) -> None:
    """Exercise 2: weights(scores, temperature) -> softmax(scores / temperature), stable."""
    rng = np.random.default_rng(1)
    cases = [(rng.normal(size=6), 1.0), (rng.normal(size=4) * 3, 0.25), (np.array([1000.0, 999.0, -1000.0]), 1.0),
             (np.array([0.5]), 2.0)]
    for scores, temperature in cases:
        got = call(fn, scores.copy(), temperature, name="softmax_weights")
        z = scores / temperature
        want = torch.as_tensor(np.exp(z - z.max()) / np.exp(z - z.max()).sum())
        t = to_tensor(got, "softmax_weights(scores, temperature)", dtype=torch.float64)
        if t.shape == want.shape and not torch.isfinite(t).all() and np.abs(scores).max() > 100:
            fail("softmax_weights gives NaN/inf for scores like [1000, 999, -1000]: exp(1000) "
                 "overflows. Subtract the largest score before exponentiating; it cancels out.")
        if t.shape == want.shape and torch.isfinite(t).all() and abs(float(t.sum()) - 1) > 1e-6:
            fail(f"your weights sum to {float(t.sum()):.4f}, not 1: divide by the sum of the exponentials.")
        expect_close(t, want, "softmax_weights(scores, temperature)", atol=1e-9, rtol=1e-7,
                     hint="Divide the scores by the temperature before the softmax.")
    passed("softmax_weights: a stable softmax that sums to 1 and respects the temperature.")


def soft_lookup(fn) -> None:
    """Exercise 3: soft_lookup(query, keys, values, temperature) -> (value, weights)."""
    cases = []
    for seed, (n, d, d_v, temperature) in enumerate([(5, 3, None, 1.0), (7, 4, 2, 0.5), (3, 2, 3, 4.0)]):
        query, keys, values = _problem(seed + 10, n, d, d_v)
        cases.append((query, keys, values, temperature, lookup.soft_lookup(query, keys, values, temperature)))
    for query, keys, values, temperature, (want_value, want_weights) in cases:
        with forbid((lookup, "soft_lookup"), exercise="soft_lookup"):
            result = call(fn, query.copy(), keys.copy(), values.copy(), temperature, name="soft_lookup")
        if result is None:
            fail("soft_lookup returned None: did you forget to `return` the pair (value, weights)?")
        if not (isinstance(result, tuple) and len(result) == 2):
            fail(f"soft_lookup should return a pair (value, weights); it returned "
                 f"{type(result).__name__}{'' if not isinstance(result, tuple) else f' of length {len(result)}'}.")
        value, weights = result
        w = to_tensor(weights, "the weights", dtype=torch.float64)
        expect_close(w, torch.as_tensor(want_weights), "the weights", atol=1e-9, rtol=1e-7,
                     hint="weights = softmax(keys @ query / temperature), one per key.")
        expect_close(value, torch.as_tensor(want_value), "the blended value", atol=1e-9, rtol=1e-7,
                     hint="The value is the weighted sum over keys: weights @ values.")
    passed("soft_lookup: weights and blended value match, for scalar and vector values.")


def query_gradient(fn) -> None:
    """Exercise 4: the gradient of a scalar soft lookup's value with respect to the query."""
    for seed, (n, d, temperature) in enumerate([(5, 3, 1.0), (4, 2, 0.3), (6, 5, 2.0)]):
        query, keys, values = _problem(seed + 20, n, d)
        got = call(fn, query.copy(), keys.copy(), values.copy(), temperature, name="query_gradient")
        q = torch.tensor(query, requires_grad=True)
        value, _ = lookup.soft_lookup(q, torch.as_tensor(keys), torch.as_tensor(values), temperature)
        (want,) = torch.autograd.grad(value, q)
        t = to_tensor(got, "query_gradient(...)", dtype=torch.float64)
        if t.shape == () or t.numel() == 1:
            fail(f"query_gradient returned a single number; expected one partial derivative per query "
                 f"component, shape ({d},). Return query.grad, not the value.")
        if t.shape == want.shape and torch.allclose(t, torch.zeros_like(t)):
            fail("query_gradient returned all zeros: did you make the query a tensor with "
                 "requires_grad=True and call .backward() on the blended value?")
        expect_close(t, want, "query_gradient(...)", atol=1e-8, rtol=1e-6,
                     hint="Build the lookup from torch operations (torch.softmax) so autograd can follow it.")
    passed("query_gradient: autograd flows through the soft lookup to the query.")
