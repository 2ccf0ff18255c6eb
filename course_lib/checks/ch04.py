"""Checkers for exercises/04_masking.ipynb: causal and padding masks, the additive form, and a
masked softmax that gives exact zeros and no NaN."""

from __future__ import annotations

import math
from functools import partial

import torch

import course_lib.masks as masks
from course_lib.attention import softmax as _softmax
from course_lib.checks._cases import generator
from course_lib.checks._core import (
    call,
    expect_close,
    expect_pair,
    expect_shape,
    fail,
    to_tensor,
)
from course_lib.checks._declare import function_check, value_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._routes import ATTENTION, SOFTMAX
from course_lib.checks._values import read_numbers

__all__ = ["causal_mask", "padding_mask", "to_additive", "masked_softmax", "causal_attention",
           "soft_mask_experiment", "hint"]

SOLUTION = "solutions/04_masking.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
# Here: exercise 6's scores, which the notebook prints
KERNEL_HALF = ("soft_mask_scores",)


def _bool_result(got, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The learner's mask as a bool tensor of `shape`, with feedback on float 0/1 answers."""
    if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
        fail(f"{what} has dtype {got.dtype}; return a boolean tensor (True = may attend). "
             "A comparison gives one, or call .bool() at the end.")
    t = to_tensor(got, what)
    expect_shape(t, shape, what)
    return t.bool()


# ---------------------------------------------------------------- exercise 1

def _causal_cases(seed: int, hidden: bool) -> list:
    return [4, 7, 1] + ([3, 2, 33] if hidden else [])


def _lower(n: int, diagonal: int = 0) -> torch.Tensor:
    """True on and below diagonal `diagonal` of an (n, n) grid (0: the main diagonal)."""
    return torch.ones(n, n, dtype=torch.bool).tril(diagonal)


@function_check(1, grade="causal", cases=_causal_cases, forbid=((masks, "causal_mask"),),
                reference=_lower, mistakes=(
    Mistake("your mask is upper-triangular: it lets query i see keys j >= i, the future. True "
            "should sit on and BELOW the diagonal (key j <= query i).",
            lambda n: _lower(n).T),
    Mistake("your mask is True where attention is forbidden. The convention is True = may "
            "attend: query i may see keys 0..i.", lambda n: ~_lower(n)),
    Mistake("your mask forbids the diagonal: a token may attend to itself (key j = i is "
            "allowed).", lambda n: _lower(n, -1)),
    Mistake("your mask is off by one diagonal: query i also sees key i + 1, one step into the "
            "future. The last key query i may see is key i itself.", lambda n: _lower(n, 1)),
))
def causal_mask(cases: list, outcomes: list) -> str:
    for n, got in each(cases, outcomes):
        got = _bool_result(got, f"causal_mask({n})", (n, n))
        named_mistake(n, got)
        want = expected(n)
        if not torch.equal(got, want):
            fail(f"causal_mask({n}) is not lower-triangular with the diagonal: expected\n"
                 f"{want.int()}\ngot\n{got.int()}")
    return "causal_mask: True on and below the diagonal; no query sees a later key."


# ---------------------------------------------------------------- exercise 2

def _padding_cases(seed: int, hidden: bool) -> list:
    cases = [([3, 1], 4), ([5], 5), ([2, 4, 0], 6)]
    if hidden:
        g = generator(2, seed)
        cases += [([2], 3), (torch.randint(0, 9, (5,), generator=g).tolist(), 9)]
    return [{"lengths": lengths, "n_keys": n_keys} for lengths, n_keys in cases]


def _padding_ok(lengths: list, n_keys: int) -> torch.Tensor:
    return torch.arange(n_keys)[None, None, :] < torch.tensor(lengths)[:, None, None]


@function_check(2, grade="padding", cases=_padding_cases, forbid=((masks, "padding_mask"),),
                run=lambda fn, case: call(fn, list(case["lengths"]), case["n_keys"],
                                          name="padding_mask"),
                reference=_padding_ok, mistakes=(
    Mistake("your mask is True on the padding. True = may attend: the first lengths[b] keys "
            "of sequence b are True, the padding after them False.",
            lambda lengths, n_keys: ~_padding_ok(lengths, n_keys)),
))
def padding_mask(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        lengths, n_keys = case["lengths"], case["n_keys"]
        what = f"padding_mask({lengths}, {n_keys})"
        want = expected(case)
        if isinstance(got, torch.Tensor) and tuple(got.shape) == (len(lengths), n_keys):
            fail(f"{what} has shape {tuple(got.shape)}; expected (batch, 1, n_keys) = "
                 f"{tuple(want.shape)}: add a middle axis of size 1 so it broadcasts over the "
                 "queries.")
        got = _bool_result(got, what, tuple(want.shape))
        named_mistake(case, got)
        if not torch.equal(got, want):
            fail(f"{what} marks the wrong keys: expected\n{want.int()}\ngot\n{got.int()}")
    return "padding_mask: the first lengths[b] keys of sequence b, shape (batch, 1, n_keys)."


# ---------------------------------------------------------------- exercise 3

def _additive_cases(seed: int, hidden: bool) -> list:
    g = generator(3, seed)
    cases = [torch.ones(3, 3, dtype=torch.bool).tril(), torch.rand(2, 4, 5, generator=g) > 0.4]
    if hidden:
        cases += [torch.tensor([True, False]), torch.zeros(2, 2, dtype=torch.bool)]
    return cases


@function_check(3, grade="additive", cases=_additive_cases)
def to_additive(cases: list, outcomes: list) -> str:
    for mask, got in each(cases, outcomes):
        if isinstance(got, torch.Tensor) and not got.is_floating_point():
            fail(f"to_additive returned dtype {got.dtype}; the additive mask is a float tensor "
                 "(it is added to float scores).")
        t = to_tensor(got, "to_additive(mask)", dtype=torch.float64)
        want = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
        expect_shape(t, want.shape, "to_additive(mask)")
        if torch.isnan(t).any():
            fail("to_additive contains NaN: 0 * -inf is NaN, so do not build it by multiplying "
                 "the mask by -inf; fill or select instead.")
        if mask.any() and not mask.all() and torch.equal(t == 0, ~mask):
            fail("your additive mask is 0 where the boolean mask is False. True (may attend) -> "
                 "0, False (blocked) -> -inf.")
        if (~mask).any() and torch.equal(t == 0, mask) and not torch.isinf(t[~mask]).all():
            fail(f"blocked entries hold {float(t[~mask].max()):.3g}, not -inf. Use float('-inf'): "
                 "exp(-inf) is exactly 0, and a large finite number leaves a fully masked row "
                 "uniform.")
        expect_close(t, want, "to_additive(mask)", atol=0, rtol=0,
                     hint="0.0 where the mask is True, -inf where it is False.")
    return "to_additive: 0 where attention is allowed, -inf where it is blocked."


# ---------------------------------------------------------------- exercise 4

def _masked_softmax_cases(seed: int, hidden: bool) -> list:
    g = generator(4, seed)
    scores = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    random_mask = torch.rand(2, 4, 5, generator=g) > 0.4
    random_mask[0, 1] = False  # one query with every key masked
    random_mask[1, 2] = True
    cases = [
        (torch.randn(4, 4, generator=g, dtype=torch.float64),
         torch.ones(4, 4, dtype=torch.bool).tril()),
        (scores, random_mask),
        (torch.tensor([[1e4, -1e4, 5.0]], dtype=torch.float64),
         torch.tensor([[False, True, True]])),
    ]
    if hidden:
        cases += [(torch.zeros(2, 3, dtype=torch.float64),
                   torch.tensor([[True, True, False], [False, False, False]])),
                  (torch.randn(3, 6, generator=g, dtype=torch.float64) * 1e3,
                   torch.rand(3, 6, generator=g) > 0.5)]
    return [{"scores": s, "mask": m} for s, m in cases]


# torch's softmax does the stable part and the NaN of a fully masked row for you (nan_to_num
# then hides the NaN): the exercise is to write both from torch.exp and sums.
@function_check(4, args=("scores", "mask"), cases=_masked_softmax_cases,
                forbid=SOFTMAX + ATTENTION)
def masked_softmax(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        s, mask = case["scores"], case["mask"]
        want = _softmax(s.masked_fill(~mask, float("-inf")))
        t = to_tensor(got, "masked_softmax(scores, mask)", dtype=torch.float64)
        expect_shape(t, want.shape, "masked_softmax(scores, mask)")
        full_mask = mask.expand_as(want)
        dead = ~full_mask.any(dim=-1)  # rows with no key allowed
        if not torch.isfinite(t).all():
            bad_rows = (~torch.isfinite(t))[dead]
            where = "in a fully masked row" if bad_rows.any() else "in the weights"
            fail(f"masked_softmax gives NaN/inf {where}. When every key of a row is masked, the "
                 "max is -inf and -inf - (-inf) is NaN: such rows must come out as zeros.")
        if dead.any() and (t[dead] != 0).any():
            fail("a row whose keys are all masked should get all-zero weights (it has nothing to "
                 "attend to), not a uniform or other distribution.")
        if (t[~full_mask] != 0).any():
            fail("some masked keys get non-zero weight: block their scores BEFORE the softmax, so "
                 "exp gives exactly 0.")
        expect_close(t, want, "masked_softmax(scores, mask)", atol=1e-9, rtol=1e-7,
                     hint="block the masked scores, then a stable softmax over the last axis.")
    return "masked_softmax: exact zeros on masked keys, zero rows instead of NaN."


# ---------------------------------------------------------------- exercise 5 (debug)

def _causal_reference(q, k, v, diagonal: int = 1, dim: int = -1):
    """Attention with keys j >= i + diagonal blocked (diagonal=1 is causal; 2 is the planted
    bug, one future key leaking), its softmax over axis `dim` (-1, the keys; -2 is the
    softmax over the queries)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    blocked = torch.triu(torch.ones(n_q, n_k, dtype=torch.bool), diagonal=diagonal)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(blocked,
                                                                          float("-inf"))
    w = torch.softmax(scores, dim=dim)
    return w @ v, w


def _causal_attention_cases(seed: int, hidden: bool) -> list:
    g = generator(5, seed)
    shapes = [((6, 4), 3), ((2, 5, 8), 2), ((3, 2, 7, 4), 4)] + ([((1, 2), 1), ((9, 16), 5)]
                                                                 if hidden else [])
    cases = []
    for qk, d_v in shapes:
        f = {"dtype": torch.float64, "generator": g}
        cases.append({"q": torch.randn(*qk, **f), "k": torch.randn(*qk, **f),
                      "v": torch.randn(*qk[:-1], d_v, **f)})
    return cases


def _weights(result):
    return result[1]


@function_check(5, args=("q", "k", "v"), cases=_causal_attention_cases,
                forbid=((masks, "causal_mask"), *ATTENTION), reference=_causal_reference,
                mistakes=(
    Mistake("still off by one diagonal: query i also reads key i + 1, one token of the future "
            "(the leak test shows it: change only token j and the output of query j - 1 "
            "moves). The blocked keys start right after the diagonal.",
            partial(_causal_reference, diagonal=2), on=_weights),
    Mistake("each COLUMN of your weights sums to 1: the softmax ran over the queries "
            "(dim=-2). Each query's row must sum to 1 over the keys it may read: dim=-1.",
            partial(_causal_reference, dim=-2), on=_weights),
))
def causal_attention(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        n = case["q"].shape[-2]
        out, weights = expect_pair(result, "causal_attention", "(out, weights) of shapes "
                                   "(..., n, d_v) and (..., n, n)")
        want_out, want_w = expected(case)
        w = to_tensor(weights, "the weights of causal_attention", dtype=torch.float64)
        expect_shape(w, want_w.shape, "the weights of causal_attention")
        named_mistake(case, (out, w))
        if not bool(torch.isfinite(w).all()) and n > 0:
            fail("your mask now also hides each token from itself: query 0 has no key left "
                 "and its weights come out NaN. Key j = i is allowed; only j > i is the future.")
        past = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
        if n > 1 and bool((w[..., past] == 0).all()) and bool((w[..., past.T] > 0).all()):
            fail("your weights are zero on the past and positive on the future: the mask is the "
                 "wrong way round (or the weights are transposed). Query i reads keys 0..i.")
        expect_close(w, want_w, "the weights of causal_attention", atol=1e-7, rtol=1e-6,
                     hint="Row i is query i's softmax over keys 0..i, with exact zeros after i.")
        expect_close(out, want_out, "the output of causal_attention", atol=1e-7, rtol=1e-6,
                     hint="out = weights @ v.")
    return "causal_attention: no query reads a later key; the off-by-one is fixed."


# ---------------------------------------------------------------- exercise 6 (experiment)

SOFT_MASK_PENALTIES = (5, 10, 30)


def soft_mask_scores() -> torch.Tensor:
    """The (8, 8) scores of exercise 6: seeded, standard deviation 3, float64."""
    return 3 * torch.randn(8, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)


def _leaked(penalty: float, rows_with_blocked_only: bool = False) -> float:
    s = soft_mask_scores()
    blocked = torch.triu(torch.ones(8, 8, dtype=torch.bool), diagonal=1)
    w = torch.softmax(s - penalty * blocked, dim=-1)
    per_row = (w * blocked).sum(-1)
    return float(per_row[:-1].mean() if rows_with_blocked_only else per_row.mean())


def _leaked_all(rows_with_blocked_only: bool = False) -> dict:
    return {m: _leaked(m, rows_with_blocked_only) for m in SOFT_MASK_PENALTIES}


def _first_penalty(case, got) -> dict:
    m = SOFT_MASK_PENALTIES[0]
    return {"m": m, "x": got[m]}


@value_check(6, grade="soft_mask", reference=_leaked_all, mistakes=(
    Mistake("leaked[{m}] = {x:.4g} averages over the 7 rows that have a blocked key; the "
            "measurement averages over all 8 rows (the last row leaks 0).",
            partial(_leaked_all, rows_with_blocked_only=True), atol=1e-12, rtol=1e-4,
            detail=_first_penalty),
))
def soft_mask_experiment(cases: list, outcomes: list) -> str:
    (case, got), = each(cases, outcomes)
    measured = read_numbers(got, "leaked", SOFT_MASK_PENALTIES)
    named_mistake(case, measured)
    want = expected(case)
    for m in SOFT_MASK_PENALTIES:
        x = measured[m]
        if abs(x - want[m]) <= 1e-4 * want[m] + 1e-12:
            continue
        if x == 0:
            fail(f"leaked[{m}] is 0: did you mask with -inf? Subtract the penalty {m} from the "
                 "blocked scores instead, and measure what still reaches the future.")
        side = "too large" if x > want[m] else "too small"
        fail(f"leaked[{m}] = {x:.4g} is {side}: subtract {m} from the scores of the keys j > i "
             "(only those), softmax each row, add up each row's weight on those keys, and "
             "average over the 8 rows.")
    return (f"leaked: {measured[5]:.3f} of each row's weight reaches the future at a penalty of "
            f"5, {measured[10]:.1e} at 10 and {measured[30]:.0e} at 30: a soft mask only hides "
            "the future when its penalty dwarfs the spread of the scores.")
