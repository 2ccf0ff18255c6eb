"""Checkers for exercises/02_queries_keys_values.ipynb: scores, a stable softmax, self-attention."""

from __future__ import annotations

import math
from functools import partial

import torch

from course_lib.attention import scaled_dot_product_attention as _reference_attention
from course_lib.attention import softmax as _reference_softmax
from course_lib.checks._cases import generator, randn
from course_lib.checks._core import expect_close, expect_pair, fail, to_tensor
from course_lib.checks._declare import function_check, value_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._routes import ATTENTION, SOFTMAX
from course_lib.checks._values import read_choice, read_numbers

__all__ = ["attention_scores", "softmax_rows", "self_attention", "batched_attention",
           "shuffle_prediction", "shuffle_why", "dilution_experiment", "hint"]

SOLUTION = "solutions/02_queries_keys_values.ipynb"
# the references an attention answer must not call
_SDPA = ATTENTION


# ---------------------------------------------------------------- exercise 1

def _scores_cases(seed: int, hidden: bool) -> list:
    g = generator(1, seed)
    shapes = [((5, 4), (6, 4)), ((3, 16), (3, 16)), ((2, 3, 5, 8), (2, 3, 7, 8))]
    if hidden:
        shapes += [((2, 4), (3, 4)), ((1, 1), (1, 1)), ((4, 1, 9, 32), (4, 1, 2, 32))]
    return [{"q": randn(g, *q), "k": randn(g, *k)} for q, k in shapes]


def _scores(q: torch.Tensor, k: torch.Tensor, divide_by: float | None = None) -> torch.Tensor:
    """q kᵀ divided by `divide_by` (None: sqrt(d_k), the right scores)."""
    return q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if divide_by is None else divide_by)


@function_check(1, args=("q", "k"), grade="scores", cases=_scores_cases, reference=_scores,
                mistakes=(
    Mistake("your scores are the raw dot products q·k: divide them by sqrt(d_k), the width of a "
            "key.", partial(_scores, divide_by=1.0), atol=1e-6, rtol=1e-5),
    Mistake("your scores are divided by d_k; divide by sqrt(d_k) instead.",
            lambda q, k: _scores(q, k, divide_by=q.shape[-1]), atol=1e-6, rtol=1e-5),
))
def attention_scores(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        q, k = case["q"], case["k"]
        t = to_tensor(got, "attention_scores(q, k)", dtype=torch.float64)
        want = expected(case)
        n_q, n_k = q.shape[-2], k.shape[-2]
        if n_q != n_k and t.shape[-2:] == (n_k, n_q):
            fail(f"attention_scores returned shape {tuple(t.shape)} for {n_q} queries and {n_k} "
                 f"keys; expected {tuple(want.shape)}: one row per query, one column per key.")
        named_mistake(case, t)
        expect_close(t, want, "attention_scores(q, k)", atol=1e-6, rtol=1e-5,
                     hint="score[..., i, j] = q[..., i, :] · k[..., j, :] / sqrt(d_k), with the "
                          "leading batch/head dims kept.")
    return "attention_scores: q kᵀ / √d_k for every query-key pair, batch dims kept."


# ---------------------------------------------------------------- exercise 2

def _softmax_cases(seed: int, hidden: bool) -> list:
    g = generator(2, seed)
    cases = [
        randn(g, 4, 6),
        randn(g, 2, 3, 5) * 3,
        torch.tensor([[1e4, -1e4, 0.0], [-1e4, -1e4 + 1.0, -1e4]], dtype=torch.float64),
        torch.tensor([[0.5]], dtype=torch.float64),
    ]
    if hidden:
        cases += [torch.tensor([[1e4, -1e4]], dtype=torch.float64),
                  torch.zeros(2, 4, dtype=torch.float64), randn(g, 3, 40) * 50]
    return cases


@function_check(2, grade="softmax", cases=_softmax_cases, forbid=SOFTMAX + ATTENTION)
def softmax_rows(cases: list, outcomes: list) -> str:
    for scores, got in each(cases, outcomes):
        want = _reference_softmax(scores)
        t = to_tensor(got, "softmax_rows(scores)", dtype=torch.float64)
        if t.shape == want.shape and not torch.isfinite(t).all() and scores.abs().max() > 100:
            fail("softmax_rows gives NaN/inf for scores like [1e4, -1e4, 0]: exp(1e4) overflows. "
                 "Shift each row by its own largest score before exponentiating; it cancels out.")
        if t.shape == want.shape and torch.isfinite(t).all():
            sums = t.sum(dim=-1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
                col_sums = t.sum(dim=-2) if t.ndim >= 2 else sums
                if t.ndim >= 2 and t.shape[-2] > 1 and \
                        torch.allclose(col_sums, torch.ones_like(col_sums), atol=1e-6):
                    fail("your columns sum to 1, not your rows: normalise over the key axis, "
                         "dim=-1.")
                fail(f"rows of your weights sum to {float(sums.min()):.2f}-"
                     f"{float(sums.max()):.2f}, not 1: divide each row by its own sum, over the "
                     "last axis.")
        expect_close(t, want, "softmax_rows(scores)", atol=1e-9, rtol=1e-7,
                     hint="softmax(s)_j = exp(s_j - max) / sum_l exp(s_l - max), along dim=-1.")
    return "softmax_rows: a stable softmax over the key axis, fine for scores of ±1e4."


# ---------------------------------------------------------------- exercise 3

def _attention_cases(seed: int, hidden: bool) -> list:
    g = generator(3, seed)
    shapes = [((6, 8), 4, 5), ((2, 6, 8), 4, 3), ((3, 12), 6, 6)]
    if hidden:
        shapes += [((5, 8), 4, 2), ((1, 4), 2, 2)]
    cases = []
    for x_shape, d_k, d_v in shapes:
        d_model = x_shape[-1]
        cases.append({"x": randn(g, *x_shape), "w_q": randn(g, d_model, d_k),
                      "w_k": randn(g, d_model, d_k), "w_v": randn(g, d_model, d_v)})
    return cases


def _answer(case: dict, result, name: str, weights: str) -> tuple:
    """The learner's (out, weights) of one case, and the reference's (out, weights)."""
    out, w = expect_pair(result, name, "(out, weights)")
    return out, to_tensor(w, weights, dtype=torch.float64), expected(case)


def _attention(x, w_q, w_k, w_v, divide_by: float | None = None, dim: int = -1,
               transposed: bool = False) -> tuple:
    """Self-attention of x (the right answer by default): its scores divided by `divide_by`
    (None: sqrt(d_k)), the softmax over axis `dim` (-1, the keys), the weights `transposed`."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    w = torch.softmax(_scores(q, k, divide_by), dim=dim)
    w = w.transpose(-2, -1) if transposed else w
    return w @ v, w


def _weights(result):
    return result[1]


def _d_k(case, got) -> dict:
    return {"d_k": case["w_k"].shape[-1]}


@function_check(3, args=("x", "w_q", "w_k", "w_v"), cases=_attention_cases, forbid=_SDPA,
                reference=_attention, mistakes=(
    Mistake("your weights are softmax(q kᵀ) without the 1/sqrt(d_k): divide the scores by "
            "sqrt(d_k) = sqrt({d_k}) before the softmax.", partial(_attention, divide_by=1.0),
            atol=1e-6, rtol=1e-5, on=_weights, detail=_d_k),
    Mistake("your weights are transposed: row i should hold query i's weights over the keys.",
            partial(_attention, transposed=True), atol=1e-6, rtol=1e-5, on=_weights),
))
def self_attention(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        out, w, (want_out, want_weights) = _answer(case, result, "self_attention", "the weights")
        named_mistake(case, (out, w))
        expect_close(w, want_weights, "the weights", atol=1e-6, rtol=1e-5,
                     hint="weights = softmax(q kᵀ / sqrt(d_k)) over the last axis, with "
                          "q = x w_q and k = x w_k.")
        expect_close(out, want_out, "the output", atol=1e-6, rtol=1e-5,
                     hint="out = weights @ v with v = x w_v: each row blends the value rows.")
    return "self_attention: Q, K, V from three maps, scaled scores, softmax, weighted values."


# ---------------------------------------------------------------- exercise 4 (debug)

def _reshaped(x, w_q, w_k, w_v) -> tuple:
    """The planted bug: K reshaped to (..., d_k, n) instead of transposed."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    *batch, n, d_k = k.shape
    w = torch.softmax(q @ k.reshape(*batch, d_k, n) / math.sqrt(d_k), dim=-1)
    return w @ v, w


def _batched_cases(seed: int, hidden: bool) -> list:
    g = generator(4, seed)
    shapes = [(2, 5, 8, 4, 3), (3, 6, 4, 4, 4), (1, 7, 6, 2, 5)]
    shapes += [(4, 9, 8, 3, 2), (2, 1, 4, 4, 4)] if hidden else []
    return [{"x": randn(g, b, n, d), "w_q": randn(g, d, d_k), "w_k": randn(g, d, d_k),
             "w_v": randn(g, d, d_v)} for b, n, d, d_k, d_v in shapes]


@function_check(4, args=("x", "w_q", "w_k", "w_v"), grade="batched", cases=_batched_cases,
                forbid=_SDPA, reference=_attention, mistakes=(
    Mistake("still reshaping K: k.reshape(b, d_k, n) has the right shape but not the right "
            "numbers (it refills the same memory row by row, so entries of different keys end "
            "up in one column). Swap the last two axes instead.", _reshaped, atol=1e-6,
            rtol=1e-5, on=_weights),
    Mistake("each COLUMN of your weights sums to 1: the softmax ran over the queries (dim=-2 / "
            "dim=1). Each query's row must sum to 1 over the keys: dim=-1.",
            partial(_attention, dim=-2), atol=1e-6, rtol=1e-5, on=_weights),
    Mistake("the fix lost the 1/sqrt(d_k): the scores must still be divided by sqrt(d_k) = "
            "sqrt({d_k}).", partial(_attention, divide_by=1.0), atol=1e-6, rtol=1e-5, on=_weights,
            detail=_d_k),
))
def batched_attention(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        out, w, (want_out, want_weights) = _answer(case, result, "batched_attention",
                                                   "the weights of batched_attention")
        named_mistake(case, (out, w))
        expect_close(w, want_weights, "the weights of batched_attention", atol=1e-6, rtol=1e-5,
                     hint="Row i of each example's weights is query i's softmax over its keys.")
        expect_close(out, want_out, "the output of batched_attention", atol=1e-6, rtol=1e-5,
                     hint="out = weights @ v, example by example.")
    return "batched_attention: K's last two axes swapped, not reshaped; the bug is fixed."


# ---------------------------------------------------------------- exercise 5 (predict)

SHUFFLE_CHOICES = ("same", "shuffled", "different")
SHUFFLE_ORDER = [3, 0, 5, 1, 4, 2]


def shuffle_experiment() -> dict:
    """The run of exercise 5 (the notebook's given cell builds the same tensors): largest
    difference of attention on the shuffled tokens from the original output and from the
    original output shuffled the same way."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 8, generator=g, dtype=torch.float64)
    w_q, w_k, w_v = (torch.randn(8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = _reference_attention(x @ w_q, x @ w_k, x @ w_v)[0]
    xs = x[SHUFFLE_ORDER]
    out_s = _reference_attention(xs @ w_q, xs @ w_k, xs @ w_v)[0]
    return {"same": float((out_s - out).abs().max()),
            "shuffled": float((out_s - out[SHUFFLE_ORDER]).abs().max())}


@commit_check(5, read=partial(read_choice, name="prediction", choices=SHUFFLE_CHOICES),
              grade="shuffle")
def shuffle_prediction(choice: str) -> str:
    run = shuffle_experiment()
    by = "less than 1e-9" if run["shuffled"] < 1e-9 else f"{run['shuffled']:.1e}"
    return (f"prediction committed ({choice!r}). The run: the shuffled tokens' outputs differ "
            f"from the original outputs by up to {run['same']:.3f}, and from the original "
            f"outputs shuffled the same way by {by}.")


shuffle_why = choice_check(5, "shuffle_why", "abc", module=__name__)


# ---------------------------------------------------------------- exercise 6 (experiment)

DILUTION_NS = (4, 64, 1024)
_DILUTION_RTOL = 0.2   # a 500-trial mean is within ~4% (1024 keys) of the reference


def _dilution_reference(n: int, trials: int = 2000, d_k: int = 16) -> float:
    g = torch.Generator().manual_seed(1000 + n)
    q = torch.randn(trials, 1, d_k, generator=g)
    k = torch.randn(trials, n, d_k, generator=g)
    return float(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1).amax(-1).mean())


@value_check(6, grade="dilution")
def dilution_experiment(cases: list, outcomes: list) -> str:
    (_, got), = each(cases, outcomes)
    measured = read_numbers(got, "largest_weight", DILUTION_NS)
    want = {n: _dilution_reference(n) for n in DILUTION_NS}
    for n in DILUTION_NS:
        if not 0 < measured[n] <= 1:
            fail(f"largest_weight[{n}] = {measured[n]:.4g} cannot be a softmax weight (weights "
                 "lie in (0, 1]).")
        if abs(measured[n] - want[n]) > _DILUTION_RTOL * want[n]:
            if measured[n] > want[n]:
                fail(f"largest_weight[{n}] = {measured[n]:.4f} is too LARGE for {n} keys (by "
                     f"more than the sampling noise of 500 queries): did you divide the scores "
                     "by sqrt(d_k) = 4?")
            fail(f"largest_weight[{n}] = {measured[n]:.4f} is too SMALL for {n} keys (by more "
                 "than the sampling noise of 500 queries): did you take the LARGEST weight of "
                 "each query's row, then the mean over the queries?")
    return ("largest_weight: the best key's share falls from "
            f"{measured[DILUTION_NS[0]]:.2f} ({DILUTION_NS[0]} keys) to "
            f"{measured[DILUTION_NS[-1]]:.3f} ({DILUTION_NS[-1]} keys): with random queries and "
            "keys, attention dilutes as the context grows.")

