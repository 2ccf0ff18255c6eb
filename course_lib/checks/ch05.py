"""Checkers for exercises/05_multihead.ipynb: split heads (build), fix a merge that mixes
positions (debug), a multi-head forward pass (build), predict what widening the model costs
(predict), and a previous-token score for attention heads (build)."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

import course_lib.multihead as multihead
from course_lib.checks._cases import generator, randn
from course_lib.checks._core import expect_close, expect_pair, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._values import read_number

__all__ = ["split_heads", "merge_heads", "multi_head_attention", "flop_growth", "flop_why",
           "previous_token_score", "hint"]

SOLUTION = "solutions/05_multihead.ipynb"


def _ref_split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, n, d = x.shape
    return x.view(B, n, h, d // h).transpose(1, 2)  # (B, h, n, d/h)


def _ref_merge(x: torch.Tensor) -> torch.Tensor:
    B, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(B, n, h * dh)


def _ref_mha(x, w_q, w_k, w_v, w_o, num_heads, mask=None, scale=None, mix=True):
    """(out, weights) of multi-head attention, each head's scores divided by `scale` (None:
    sqrt(d_head), the right one) and the merged heads mixed by w_o (unless not `mix`)."""
    q, k, v = (_ref_split(x @ w, num_heads) for w in (w_q, w_k, w_v))  # (B, h, n, d/h)
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    merged = _ref_merge(weights @ v)
    return (merged @ w_o if mix else merged), weights


def _one_head(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
    """One full-width head's attention, its weights handed back as those of every head."""
    out, weights = _ref_mha(x, w_q, w_k, w_v, w_o, 1, mask)
    return out, weights.expand(-1, num_heads, -1, -1)


def _weights(result):
    return result[1]


# ---------------------------------------------------------------- exercise 1

def _split_cases(seed: int, hidden: bool) -> list:
    g = generator(1, seed)
    sizes = [((1, 3, 4), 2), ((2, 5, 12), 3), ((3, 4, 8), 8), ((2, 6, 6), 1)]
    sizes += [((1, 7, 12), 4), ((4, 2, 6), 2)] if hidden else []
    return [{"x": randn(g, *shape), "num_heads": h} for shape, h in sizes]


@function_check(1, args=("x", "num_heads"), cases=_split_cases,
                forbid=((multihead, "split_heads"),), reference=_ref_split, mistakes=(
    Mistake("your heads mix positions: reshaping straight to (batch, heads, n, d_head) cuts the "
            "(n, d) block in the wrong place. Cut each position's features into heads first, "
            "then move the head axis forward.",
            lambda x, num_heads: x.reshape(x.shape[0], num_heads, x.shape[1], -1),
            atol=1e-8, rtol=1e-5),
))
def split_heads(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        x, h = case["x"], case["num_heads"]
        want = expected(case)
        t = to_tensor(got, "split_heads(x, num_heads)", dtype=torch.float64)
        B, n, d = x.shape
        if t.shape == (B, n, h, d // h) and n != h:
            fail(f"split_heads returned shape {tuple(t.shape)} = (batch, n, heads, d_head): the "
                 "head axis must come before the positions.")
        expect_shape(t, want.shape, "split_heads(x, num_heads)",
                     hint="wanted (batch, heads, n, d // heads).")
        named_mistake(case, t)
        expect_close(t, want, "split_heads(x, num_heads)", atol=1e-12,
                     hint="head i must hold features i*d_head .. (i+1)*d_head - 1 of every "
                          "position.")
    return "split_heads: (batch, n, d) -> (batch, heads, n, d/heads), head i = feature slice i."


# ---------------------------------------------------------------- exercise 2

def _merge_cases(seed: int, hidden: bool) -> list:
    g = generator(2, seed)
    shapes = [(1, 2, 3, 2), (2, 3, 5, 4), (2, 8, 4, 1), (3, 1, 6, 5)]
    shapes += [(2, 3, 5, 4), (1, 4, 1, 3)] if hidden else []
    return [randn(g, *shape) for shape in shapes]


@function_check(2, cases=_merge_cases, forbid=((multihead, "merge_heads"),),
                reference=_ref_merge, mistakes=(
    Mistake("still the planted bug: merge_heads reshapes without moving the head axis back, so "
            "positions get mixed up (the shape is right, the numbers are not). Put the positions "
            "before the heads first, then flatten the heads.",
            lambda x: x.reshape(x.shape[0], x.shape[2], -1), atol=1e-8, rtol=1e-5),
))
def merge_heads(cases: list, outcomes: list) -> str:
    for x, got in each(cases, outcomes):
        want = expected(x)
        t = to_tensor(got, "merge_heads(x)", dtype=torch.float64)
        expect_shape(t, want.shape, "merge_heads(x)", hint="wanted (batch, n, heads * d_head).")
        named_mistake(x, t)
        expect_close(t, want, "merge_heads(x)", atol=1e-12,
                     hint="position j's output must be [head 0's j-th row, head 1's j-th row, "
                          "...].")
    return ("merge_heads: (batch, heads, n, d_head) -> (batch, n, d), the exact inverse of "
            "split_heads (the given version skipped moving the head axis back).")


# ---------------------------------------------------------------- exercise 3

def _mha_cases(seed: int, hidden: bool) -> list:
    g = generator(3, seed)
    sizes = [(2, 5, 8, 2, False), (1, 6, 12, 3, True), (3, 4, 16, 4, True), (2, 3, 6, 1, False)]
    sizes += [(1, 1, 4, 2, True), (2, 7, 8, 4, False)] if hidden else []
    cases = []
    for B, n, d, h, masked in sizes:
        ws = [randn(g, d, d) / math.sqrt(d) for _ in range(4)]
        cases.append({"x": randn(g, B, n, d), "w_q": ws[0], "w_k": ws[1], "w_v": ws[2],
                      "w_o": ws[3], "num_heads": h,
                      "mask": torch.ones(n, n, dtype=torch.bool).tril() if masked else None})
    return cases


# The weights' mistakes compare the weights only; the missing mix, the whole (out, weights),
# so it is named only on weights that are right.
@function_check(3, grade="mha", args=("x", "w_q", "w_k", "w_v", "w_o", "num_heads", "mask"),
                cases=_mha_cases, forbid=((multihead.MultiHeadAttention, "forward"),
                                          (F, "multi_head_attention_forward")),
                reference=_ref_mha, mistakes=(
    Mistake("every head has the same weights as one full-width head: split q, k and v into "
            "heads BEFORE the scores, so each head compares only its own slice.",
            _one_head, atol=1e-6, rtol=1e-5, on=_weights),
    Mistake("the weights use the wrong scale: divide each head's scores by sqrt(d_head) = "
            "sqrt(d_model / num_heads).",
            lambda x, *rest: _ref_mha(x, *rest, scale=math.sqrt(x.shape[-1])),
            atol=1e-6, rtol=1e-5, on=_weights),
    Mistake("the weights have no scale at all: divide each head's scores by sqrt(d_head).",
            partial(_ref_mha, scale=1.0), atol=1e-6, rtol=1e-5, on=_weights),
    Mistake("out is the merged heads without the final mix: multiply by w_o at the end.",
            partial(_ref_mha, mix=False), atol=1e-6, rtol=1e-5),
))
def multi_head_attention(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        mask = case["mask"]
        want_out, want_w = expected(case)
        expect_pair(got, "multi_head_attention", "(out, weights)")
        out = to_tensor(got[0], "out", dtype=torch.float64)
        w = to_tensor(got[1], "weights", dtype=torch.float64)
        expect_shape(w, want_w.shape, "weights", hint="wanted (batch, heads, n, n): one grid per "
                     "head.")
        named_mistake(case, (out, w))
        if mask is not None and (w.masked_select(~mask.expand_as(w)).abs() > 1e-12).any():
            fail("some weights are non-zero where the mask is False: block those scores before "
                 "the softmax.")
        expect_close(w, want_w, "weights", atol=1e-6,
                     hint="weights = softmax(q kᵀ / sqrt(d_head)) per head, over the key axis.")
        expect_shape(out, want_out.shape, "out", hint="wanted (batch, n, d_model): merge the "
                     "heads back.")
        expect_close(out, want_out, "out", atol=1e-6, hint="out = merge_heads(weights @ v) @ w_o.")
    return "multi_head_attention: split, attend per head with sqrt(d_head), merge, mix with w_o."


# ---------------------------------------------------------------- exercise 4 (predict)

FLOP_N, FLOP_D_HEAD, FLOP_HEADS = 64, 16, (1, 4)


def measured_flops(num_heads: int, n: int = FLOP_N, d_head: int = FLOP_D_HEAD) -> int:
    """FLOPs of one forward pass of the course's MultiHeadAttention(num_heads * d_head, ...)."""
    from torch.utils.flop_counter import FlopCounterMode

    d_model = num_heads * d_head
    with torch.random.fork_rng():
        torch.manual_seed(0)
        mha = multihead.MultiHeadAttention(d_model, num_heads)
        x = torch.randn(1, n, d_model)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        mha(x)
    return counter.get_total_flops()


@commit_check(4, read=partial(read_number, what="predicted_growth", low=0, high=1e6,
                              kind="a number (how many times more FLOPs)"))
def flop_growth(predicted: float) -> str:
    one, four = (measured_flops(h) for h in FLOP_HEADS)
    return (f"prediction committed ({predicted:g}x). The count: {one:,} FLOPs with 1 head "
            f"(d_model 16), {four:,} with 4 heads (d_model 64): {four / one:g}x.")


flop_why = choice_check(4, "flop_why", "abcd", module=__name__)


# ---------------------------------------------------------------- exercise 5

def _perfect_head(n: int) -> torch.Tensor:
    perfect = torch.zeros(1, 1, n, n, dtype=torch.float64)
    perfect[0, 0, 0, 0] = 1
    perfect[0, 0, torch.arange(1, n), torch.arange(n - 1)] = 1
    return perfect


def _prev_cases(seed: int, hidden: bool) -> list:
    g = generator(4, seed)
    sizes = [(2, 3, 5), (1, 1, 4), (4, 2, 9)] + ([(1, 4, 2), (3, 2, 16)] if hidden else [])
    cases = []
    for B, h, n in sizes:
        logits = torch.randn(B, h, n, n, generator=g, dtype=torch.float64) * 2
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        cases.append({"weights": torch.softmax(logits, dim=-1), "perfect": False})
    return cases + [{"weights": _perfect_head(4), "perfect": True}]


def _diagonal_score(weights: torch.Tensor, offset: int = -1, query_0: bool = False):
    """Each head's mean weight on the diagonal `offset` of its (n, n) grid, over the batch and
    the queries that have one (-1: the previous token); `query_0`: query 0 counted too, as 0."""
    diagonal = torch.diagonal(weights, offset=offset, dim1=-2, dim2=-1)
    if query_0:
        diagonal = torch.cat([torch.zeros(*weights.shape[:2], 1, dtype=weights.dtype), diagonal],
                             dim=-1)
    return diagonal.mean(dim=(0, 2))


@function_check(5, args=("weights",), grade="prev_score", cases=_prev_cases,
                reference=_diagonal_score, mistakes=(
    Mistake("your score reads the diagonal (each query on itself); the previous token is one "
            "step to the left of it.", partial(_diagonal_score, offset=0), atol=1e-8, rtol=1e-5),
    Mistake("you averaged over all n queries, but query 0 has no previous token: average over "
            "the n - 1 queries 1..n-1 only.", partial(_diagonal_score, query_0=True),
            atol=1e-8, rtol=1e-5),
))
def previous_token_score(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        h = case["weights"].shape[1]
        t = to_tensor(got, "previous_token_score(weights)", dtype=torch.float64)
        if case["perfect"]:
            if t.numel() != 1 or not math.isclose(float(t.reshape(-1)[0]), 1.0, abs_tol=1e-9):
                fail("a head that always looks exactly one step back should score 1.0.")
            continue
        want = expected(case)
        if t.numel() == 1 and h > 1:
            fail("previous_token_score returned one number; wanted one score per head, shape "
                 "(heads,): average over the batch and the query positions only.")
        expect_shape(t, (h,), "previous_token_score(weights)", hint="one score per head.")
        named_mistake(case, t)
        expect_close(t, want, "previous_token_score(weights)", atol=1e-9,
                     hint="mean over batch and queries i >= 1 of weights[b, head, i, i-1].")
    return "previous_token_score: mean weight on position i-1, one score per head."

