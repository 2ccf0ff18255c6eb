"""Checkers for exercises/05_multihead.ipynb: split and merge heads, a multi-head forward pass,
and a previous-token score for attention heads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import course_lib.multihead as multihead
from course_lib.checks._core import call, expect_close, expect_shape, fail, forbid, passed, to_tensor


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _ref_split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, n, d = x.shape
    return x.view(B, n, h, d // h).transpose(1, 2)  # (B, h, n, d/h)


def _ref_merge(x: torch.Tensor) -> torch.Tensor:
    B, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(B, n, h * dh)


def _ref_mha(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
    q, k, v = (_ref_split(x @ w, num_heads) for w in (w_q, w_k, w_v))  # (B, h, n, d/h)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return _ref_merge(weights @ v) @ w_o, weights


def split_heads(fn) -> None:
    """Exercise 1: split_heads(x, num_heads): (B, n, d) -> (B, heads, n, d/heads)."""
    cases = [((1, 3, 4), 2), ((2, 5, 12), 3), ((3, 4, 8), 8), ((2, 6, 6), 1)]
    with forbid((multihead, "split_heads"), exercise="split_heads"):
        for seed, (shape, h) in enumerate(cases):
            x = _randn(*shape, seed=seed)
            want = _ref_split(x, h)
            t = to_tensor(call(fn, x.clone(), h, name="split_heads"), "split_heads(x, num_heads)",
                          dtype=torch.float64)
            B, n, d = shape
            if t.shape == (B, n, h, d // h):
                fail(f"split_heads returned shape {tuple(t.shape)} = (batch, n, heads, d_head): move the "
                     "head axis in front of the positions with .transpose(1, 2).")
            expect_shape(t, want.shape, "split_heads(x, num_heads)", hint="wanted (batch, heads, n, d // heads).")
            if n > 1 and h > 1 and torch.allclose(t, x.reshape(B, h, n, d // h)):
                fail("your heads mix positions: x.reshape(B, heads, n, d_head) cuts the (n, d) block in "
                     "the wrong place. View as (B, n, heads, d_head) first, then transpose(1, 2).")
            expect_close(t, want, "split_heads(x, num_heads)", atol=1e-12,
                         hint="head i must hold features i*d_head .. (i+1)*d_head - 1 of every position.")
    passed("split_heads: (batch, n, d) -> (batch, heads, n, d/heads), head i = feature slice i.")


def merge_heads(fn) -> None:
    """Exercise 2: merge_heads(x): (B, heads, n, d_head) -> (B, n, heads * d_head)."""
    cases = [(1, 2, 3, 2), (2, 3, 5, 4), (2, 8, 4, 1), (3, 1, 6, 5)]
    with forbid((multihead, "merge_heads"), exercise="merge_heads"):
        for seed, shape in enumerate(cases):
            x = _randn(*shape, seed=10 + seed)
            want = _ref_merge(x)
            t = to_tensor(call(fn, x.clone(), name="merge_heads"), "merge_heads(x)", dtype=torch.float64)
            expect_shape(t, want.shape, "merge_heads(x)", hint="wanted (batch, n, heads * d_head).")
            B, h, n, dh = shape
            if n > 1 and h > 1 and torch.allclose(t, x.reshape(B, n, h * dh)):
                fail("merge_heads reshapes without moving the head axis back: positions get mixed up. "
                     "Use x.transpose(1, 2) first (then .reshape, since the transpose is not contiguous).")
            expect_close(t, want, "merge_heads(x)", atol=1e-12,
                         hint="position j's output must be [head 0's j-th row, head 1's j-th row, ...].")
    passed("merge_heads: (batch, heads, n, d_head) -> (batch, n, d), the exact inverse of split_heads.")


def multi_head_attention(fn) -> None:
    """Exercise 3: multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None) -> (out, weights)."""
    cases = [(2, 5, 8, 2, False), (1, 6, 12, 3, True), (3, 4, 16, 4, True), (2, 3, 6, 1, False)]
    with forbid((multihead.MultiHeadAttention, "forward"), (F, "multi_head_attention_forward"),
                exercise="multi_head_attention"):
        for seed, (B, n, d, h, masked) in enumerate(cases):
            x = _randn(B, n, d, seed=20 + seed)
            ws = [_randn(d, d, seed=30 + 4 * seed + i) / math.sqrt(d) for i in range(4)]
            mask = torch.ones(n, n, dtype=torch.bool).tril() if masked else None
            want_out, want_w = _ref_mha(x, *ws, h, mask)
            got = call(fn, x.clone(), *[w.clone() for w in ws], h, mask, name="multi_head_attention")
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                fail(f"multi_head_attention should return a pair (out, weights), got {type(got).__name__}.")
            out = to_tensor(got[0], "out", dtype=torch.float64)
            w = to_tensor(got[1], "weights", dtype=torch.float64)
            expect_shape(w, want_w.shape, "weights", hint="wanted (batch, heads, n, n): one grid per head.")
            if h > 1:
                _, one_head_w = _ref_mha(x, *ws, 1, mask)
                if torch.allclose(w, one_head_w.expand_as(w), atol=1e-6):
                    fail("every head has the same weights as one full-width head: split q, k and v into "
                         "heads BEFORE the scores, so each head compares only its own slice.")
                scores_full = _ref_split(x @ ws[0], h) @ _ref_split(x @ ws[1], h).transpose(-2, -1)
                for wrong_scale in (math.sqrt(d), 1.0):
                    s = scores_full / wrong_scale
                    if mask is not None:
                        s = s.masked_fill(~mask, float("-inf"))
                    if torch.allclose(w, torch.softmax(s, dim=-1), atol=1e-6):
                        fail("the weights use the wrong scale: divide each head's scores by sqrt(d_head) = "
                             "sqrt(d_model / num_heads)." if wrong_scale != 1.0 else
                             "the weights have no scale at all: divide each head's scores by sqrt(d_head).")
            if mask is not None and (w.masked_select(~mask.expand_as(w)).abs() > 1e-12).any():
                fail("some weights are non-zero where the mask is False: set those scores to -inf "
                     "(scores.masked_fill(~mask, float('-inf'))) before the softmax.")
            expect_close(w, want_w, "weights", atol=1e-6,
                         hint="weights = softmax(q kᵀ / sqrt(d_head)) per head, over the key axis.")
            expect_shape(out, want_out.shape, "out", hint="wanted (batch, n, d_model): merge the heads back.")
            if torch.allclose(out, _ref_merge(want_w @ _ref_split(x @ ws[2], h)), atol=1e-6):
                fail("out is the merged heads without the final mix: multiply by w_o at the end.")
            expect_close(out, want_out, "out", atol=1e-6,
                         hint="out = merge_heads(weights @ v) @ w_o.")
    passed("multi_head_attention: split, attend per head with sqrt(d_head), merge, mix with w_o.")


def previous_token_score(fn) -> None:
    """Exercise 4: previous_token_score(weights) -> (heads,), mean weight on position i-1."""
    g = torch.Generator().manual_seed(40)
    for B, h, n in [(2, 3, 5), (1, 1, 4), (4, 2, 9)]:
        logits = torch.randn(B, h, n, n, generator=g, dtype=torch.float64) * 2
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        w = torch.softmax(logits, dim=-1)
        want = torch.diagonal(w, offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))
        t = to_tensor(call(fn, w.clone(), name="previous_token_score"), "previous_token_score(weights)",
                      dtype=torch.float64)
        if t.numel() == 1 and h > 1:
            fail("previous_token_score returned one number; wanted one score per head, shape (heads,): "
                 "average over the batch and the query positions only.")
        expect_shape(t, (h,), "previous_token_score(weights)", hint="one score per head.")
        diag = torch.diagonal(w, offset=0, dim1=-2, dim2=-1).mean(dim=(0, 2))
        if torch.allclose(t, diag):
            fail("your score reads the diagonal (each query on itself); the previous token is one step "
                 "left of it: torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1).")
        if n > 1:
            with_first = torch.cat([torch.zeros(B, h, 1, dtype=w.dtype),
                                    torch.diagonal(w, offset=-1, dim1=-2, dim2=-1)], dim=-1).mean(dim=(0, 2))
            if torch.allclose(t, with_first):
                fail("you averaged over all n queries, but query 0 has no previous token: average over the "
                     "n - 1 queries 1..n-1 only.")
        expect_close(t, want, "previous_token_score(weights)", atol=1e-9,
                     hint="mean over batch and queries i >= 1 of weights[b, head, i, i-1].")
    # a perfect previous-token head scores 1
    perfect = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    perfect[0, 0, 0, 0] = 1
    perfect[0, 0, torch.arange(1, 4), torch.arange(3)] = 1
    t = to_tensor(call(fn, perfect, name="previous_token_score"), "score of a perfect head", dtype=torch.float64)
    if t.numel() != 1 or not math.isclose(float(t.reshape(-1)[0]), 1.0, abs_tol=1e-9):
        fail("a head that always looks exactly one step back should score 1.0.")
    passed("previous_token_score: mean weight on position i-1, one score per head.")
