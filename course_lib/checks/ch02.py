"""Checkers for exercises/02_queries_keys_values.ipynb: scores, a stable softmax, self-attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import course_lib.attention as attention
from course_lib.attention import scaled_dot_product_attention as _reference_attention
from course_lib.attention import softmax as _reference_softmax
from course_lib.checks._core import call, expect_close, fail, forbid, passed, to_tensor


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-6, rtol=1e-5))


def attention_scores(fn) -> None:
    """Exercise 1: attention_scores(q, k) -> q kᵀ / √d_k, shape (..., n_q, n_k)."""
    cases = [((5, 4), (6, 4)), ((3, 16), (3, 16)), ((2, 3, 5, 8), (2, 3, 7, 8))]
    for seed, (q_shape, k_shape) in enumerate(cases):
        q, k = _randn(*q_shape, seed=seed), _randn(*k_shape, seed=seed + 100)
        got = call(fn, q.clone(), k.clone(), name="attention_scores")
        t = to_tensor(got, "attention_scores(q, k)", dtype=torch.float64)
        raw = q @ k.transpose(-2, -1)
        want = raw / math.sqrt(q.shape[-1])
        n_q, n_k = q.shape[-2], k.shape[-2]
        if n_q != n_k and t.shape[-2:] == (n_k, n_q):
            fail(f"attention_scores returned shape {tuple(t.shape)} for {n_q} queries and {n_k} keys; "
                 f"expected {tuple(want.shape)}: one row per query. Use q @ k.transpose(-2, -1).")
        if _close(t, raw):
            fail("your scores are the raw dot products q·k: divide them by sqrt(d_k), the width of a key.")
        if _close(t, raw / q.shape[-1]):
            fail("your scores are divided by d_k; divide by sqrt(d_k) instead (math.sqrt(d_k)).")
        expect_close(t, want, "attention_scores(q, k)", atol=1e-6, rtol=1e-5,
                     hint="score[..., i, j] = q[..., i, :] · k[..., j, :] / sqrt(d_k); use k.transpose(-2, -1) "
                          "so leading batch/head dims are kept.")
    passed("attention_scores: q kᵀ / √d_k for every query-key pair, batch dims kept.")


def softmax_rows(fn) -> None:
    """Exercise 2: softmax_rows(scores) -> a stable softmax over the last axis."""
    cases = [
        _randn(4, 6, seed=1),
        _randn(2, 3, 5, seed=2) * 3,
        torch.tensor([[1e4, -1e4, 0.0], [-1e4, -1e4 + 1.0, -1e4]], dtype=torch.float64),
        torch.tensor([[0.5]], dtype=torch.float64),
    ]
    with forbid((attention, "softmax"), (torch, "softmax"), (F, "softmax"), (torch.Tensor, "softmax"),
                exercise="softmax_rows"):
        for scores in cases:
            got = call(fn, scores.clone(), name="softmax_rows")
            want = _reference_softmax(scores)
            t = to_tensor(got, "softmax_rows(scores)", dtype=torch.float64)
            if t.shape == want.shape and not torch.isfinite(t).all() and scores.abs().max() > 100:
                fail("softmax_rows gives NaN/inf for scores like [1e4, -1e4, 0]: exp(1e4) overflows. "
                     "Subtract each row's max (scores.amax(dim=-1, keepdim=True)) before exp; it cancels out.")
            if t.shape == want.shape and torch.isfinite(t).all():
                sums = t.sum(dim=-1)
                if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
                    col_sums = t.sum(dim=-2) if t.ndim >= 2 else sums
                    if t.shape[-2] > 1 and torch.allclose(col_sums, torch.ones_like(col_sums), atol=1e-6):
                        fail("your columns sum to 1, not your rows: normalise over the key axis, dim=-1.")
                    fail(f"rows of your weights sum to {float(sums.min()):.2f}-{float(sums.max()):.2f}, not 1: "
                         "divide each row by its own sum (keepdim=True), over the last axis.")
            expect_close(t, want, "softmax_rows(scores)", atol=1e-9, rtol=1e-7,
                         hint="softmax(s)_j = exp(s_j - max) / sum_l exp(s_l - max), along dim=-1.")
    passed("softmax_rows: a stable softmax over the key axis, fine for scores of ±1e4.")


def self_attention(fn) -> None:
    """Exercise 3: self_attention(x, w_q, w_k, w_v) -> (out, weights), from scratch."""
    cases = [((6, 8), 4, 5), ((2, 6, 8), 4, 3), ((3, 12), 6, 6)]
    with forbid((attention, "scaled_dot_product_attention"), (F, "scaled_dot_product_attention"),
                exercise="self_attention"):
        for seed, (x_shape, d_k, d_v) in enumerate(cases):
            d_model = x_shape[-1]
            x = _randn(*x_shape, seed=seed + 10)
            w_q, w_k = _randn(d_model, d_k, seed=seed + 20), _randn(d_model, d_k, seed=seed + 30)
            w_v = _randn(d_model, d_v, seed=seed + 40)
            result = call(fn, x.clone(), w_q.clone(), w_k.clone(), w_v.clone(), name="self_attention")
            if not (isinstance(result, tuple) and len(result) == 2):
                kind = type(result).__name__ + (f" of length {len(result)}" if isinstance(result, tuple) else "")
                fail(f"self_attention should return a pair (out, weights); it returned {kind}.")
            out, weights = result
            q, k, v = x @ w_q, x @ w_k, x @ w_v
            want_out, want_weights = _reference_attention(q, k, v)
            w = to_tensor(weights, "the weights", dtype=torch.float64)
            if w.shape == want_weights.shape:
                _, unscaled = _reference_attention(q, k, v, scale=1.0)
                if _close(w, unscaled):
                    fail("your weights are softmax(q kᵀ) without the 1/sqrt(d_k): divide the scores by "
                         f"sqrt(d_k) = sqrt({d_k}) before the softmax.")
                if _close(w, want_weights.transpose(-2, -1)):
                    fail("your weights are transposed: row i should hold query i's weights over the keys "
                         "(scores = q @ k.transpose(-2, -1)).")
            expect_close(w, want_weights, "the weights", atol=1e-6, rtol=1e-5,
                         hint="q = x @ w_q, k = x @ w_k; weights = softmax(q kᵀ / sqrt(d_k)) over the last axis.")
            expect_close(out, want_out, "the output", atol=1e-6, rtol=1e-5,
                         hint="out = weights @ v with v = x @ w_v: each row blends the value rows.")
    passed("self_attention: Q, K, V from three maps, scaled scores, softmax, weighted values.")
