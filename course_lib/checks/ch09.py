"""Checkers for exercises/09_paying_less.ipynb: grouped-query attention (build), a recurrence with
a planted bug (debug), where the quadratic term takes over (predict), and how far a sliding
window reaches after training (experiment)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import course_lib.attention as attention
import course_lib.linear_attention as linear
from course_lib.checks._core import expect_close, expect_shape, fail, to_tensor
from course_lib.checks._protocol import function_check, value, value_check
from course_lib.checks._values import read_several
from course_lib.cost import crossover_length

SOLUTION = "solutions/09_paying_less.ipynb"

# ------------------------------------------------------------------------------------------------
# exercise 1 (build): grouped-query attention
# ------------------------------------------------------------------------------------------------


def _gqa_cases(seed: int, hidden: bool) -> list:
    g = torch.Generator().manual_seed(900 + seed)
    # (batch, h, g, n_q, n_k, d, d_v)
    shapes = [(2, 8, 2, 7, 9, 4, 4), (1, 6, 3, 5, 5, 8, 3), (3, 4, 1, 6, 6, 2, 5)]
    if hidden:
        shapes += [(1, 4, 4, 3, 3, 5, 5), (2, 12, 4, 1, 11, 3, 2)]
    cases = []
    for batch, h, groups, n_q, n_k, d, d_v in shapes:
        cases.append({"q": torch.randn(batch, h, n_q, d, generator=g, dtype=torch.float64),
                      "k": torch.randn(batch, groups, n_k, d, generator=g, dtype=torch.float64),
                      "v": torch.randn(batch, groups, n_k, d_v, generator=g, dtype=torch.float64)})
    return cases


@function_check(1, args=("q", "k", "v"), grade="gqa", cases=_gqa_cases, forbid=(
    (attention, "grouped_query_attention"), (F, "scaled_dot_product_attention")))
def grouped_query_attention(cases: list, outcomes: list) -> str:
    for case, outcome in zip(cases, outcomes):
        q, k, v = case["q"], case["k"], case["v"]
        got = value(outcome, "grouped_query_attention")
        if isinstance(got, (tuple, list)) and len(got) == 2:
            got = got[0]  # (out, weights) is fine too
        out = to_tensor(got, "grouped_query_attention(q, k, v)", dtype=torch.float64)
        h, groups = q.shape[1], k.shape[1]
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        expect_shape(out, want.shape, "the output",
                     f"one output per QUERY head: (batch, h={h}, n_q, d_v), although k and v "
                     f"have only g={groups} heads.")
        r = h // groups
        tiled = F.scaled_dot_product_attention(q, k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1))
        if groups not in (1, h) and torch.allclose(out, tiled):
            fail(f"query head i reads K/V head i % g: with h={h}, g={groups}, head 1 should "
                 f"share K/V head 0 with head 0, since heads are grouped in consecutive blocks "
                 f"of h/g = {r}. Copy each K/V head h/g times in a row (repeat_interleave), "
                 "or reshape the queries into (g, h/g) groups.")
        unscaled = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=1.0)
        if torch.allclose(out, unscaled):
            fail("your output is attention without the 1/√d scale: divide the scores by √d.")
        expect_close(out, want, "the output", atol=1e-9, rtol=1e-7,
                     hint=f"(case h={h}, g={groups}, n_q={q.shape[2]}, n_k={k.shape[2]}) "
                          "every query head attends with softmax(q kᵀ/√d) over its group's keys.")
    return (f"grouped_query_attention: equals PyTorch's SDPA(enable_gqa=True) on {len(cases)} "
            "shapes, multi-query (g = 1) included.")


# ------------------------------------------------------------------------------------------------
# exercise 2 (debug): the recurrent form of linear attention
# ------------------------------------------------------------------------------------------------


def _recurrence_cases(seed: int, hidden: bool) -> list:
    g = torch.Generator().manual_seed(910 + seed)
    sizes = [(12, 4, 3), (7, 6, 6), (1, 3, 2)] + ([(30, 2, 5)] if hidden else [])
    return [{"q": torch.randn(n, d, generator=g, dtype=torch.float64),
             "k": torch.randn(n, d, generator=g, dtype=torch.float64),
             "v": torch.randn(n, d_v, generator=g, dtype=torch.float64)} for n, d, d_v in sizes]


@function_check(2, args=("q", "k", "v"), grade="recurrence", cases=_recurrence_cases,
                forbid=((linear, "linear_attention"), (linear, "linear_attention_recurrent")))
def linear_recurrence(cases: list, outcomes: list) -> str:
    for case, outcome in zip(cases, outcomes):
        q, k, v = case["q"], case["k"], case["v"]
        out = to_tensor(value(outcome, "linear_recurrence"), "linear_recurrence(q, k, v)",
                        dtype=torch.float64)
        want = linear.linear_attention(q, k, v, causal=True)
        expect_shape(out, want.shape, "the output", "one row per token, d_v columns.")
        if q.shape[0] > 1 and not torch.isfinite(out[0]).all() and torch.isfinite(out[1:]).all():
            fail("the first output row is NaN: token 0 reads a state that holds nothing yet "
                 "(0 / 0). What should the state contain when token i is read?")
        fq, fk = linear.feature_map(q), linear.feature_map(k)
        if q.shape[0] > 1:
            before = torch.tril(fq @ fk.T, diagonal=-1)               # keys j < i only
            shifted = (before @ v)[1:] / before.sum(-1, keepdim=True)[1:]
            if torch.allclose(out[1:], shifted, atol=1e-9):
                fail("output i ignores token i itself: the state is read before token i is "
                     "added. Under a causal mask a token may see itself (j <= i).")
        noncausal = linear.linear_attention(q, k, v, causal=False)
        if q.shape[0] > 1 and torch.allclose(out, noncausal, atol=1e-9):
            fail("every output sees every token, later ones included: the causal form may use "
                 "only the tokens up to i.")
        unnormalised = torch.tril(fq @ fk.T) @ v
        if torch.allclose(out, unnormalised, atol=1e-9):
            fail("the output is not divided by φ(q_i)·z_i, so its weights do not sum to 1.")
        expect_close(out, want, "the output", atol=1e-9, rtol=1e-7,
                     hint="the output must equal linear_attention(q, k, v, causal=True).")
    return ("linear_recurrence: equals causal linear attention on every case; the bug is fixed.")


# ------------------------------------------------------------------------------------------------
# exercise 3 (predict): where the quadratic term takes over
# ------------------------------------------------------------------------------------------------

PREDICT_WIDTH = 1024


@value_check(3, grade="predict")
def predicted_crossover(cases: list, outcomes: list) -> str:
    got = value(outcomes[0], "predicted_crossover")
    if got is None:
        fail("predicted_crossover is None: write your prediction (a number of tokens) in it.")
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got) \
            or got <= 0:
        fail(f"predicted_crossover should be a positive number of tokens, got {got!r}.")
    d = PREDICT_WIDTH
    want = crossover_length(d)
    ratio = got / want
    if 0.9 <= ratio <= 1.1:
        return (f"predicted_crossover: {got:g} tokens, and the count says {want}: the score and "
                f"blend products (4n²d) equal the projections and the MLP (24nd²) at n = 6d.")
    if abs(got - 4 * d) <= 0.1 * 4 * d:
        fail(f"{got:g} is where 4n²d equals the MLP's 16nd² alone; the Q, K, V and output "
             f"projections (8nd²) are part of the rest of the layer too. The count says {want}.")
    if abs(got - 2 * d) <= 0.2 * 2 * d or abs(got - d) <= 0.2 * d:
        fail(f"{got:g} counts only part of the layer: the MLP (d -> 4d -> d) does 16nd², "
             f"the projections 8nd². The count says {want}.")
    direction = "low" if ratio < 1 else "high"
    fail(f"{got:g} is {max(ratio, 1 / ratio):.1f}x too {direction}: the count says {want} tokens. "
         "Write both sides as FLOPs of n and d (2 per multiply-add) and solve for n.")


# ------------------------------------------------------------------------------------------------
# exercise 4 (experiment): how far does a window of W reach?
# ------------------------------------------------------------------------------------------------

EXPERIMENT_WINDOW = 5


@value_check(4, grade="experiment")
def window_reach(cases: list, outcomes: list) -> str:
    reach, beyond = read_several(value(outcomes[0], "(reach, beyond)"), 2, "two numbers",
                                 "check.window_reach(reach, beyond)")
    if reach is None or beyond is None:
        fail("reach or beyond is None: set both from your measurement.")
    if isinstance(reach, bool) or not isinstance(reach, (int, float)) or reach != int(reach):
        fail(f"reach should be a whole number of tokens (a distance k), got {reach!r}.")
    if isinstance(beyond, bool) or not isinstance(beyond, (int, float)) \
            or not 0 <= beyond <= 1:
        fail(f"beyond should be an accuracy between 0 and 1, got {beyond!r}.")
    w = EXPERIMENT_WINDOW
    if int(reach) == w:
        fail(f"reach = {w}: the window holds W = {w} positions, but one of them is the question "
             "itself, so the farthest token it can look up is W - 1 back. Is your k counted from "
             "the question?")
    if not w - 2 <= int(reach) <= w - 1:
        fail(f"reach = {int(reach)}: with a window of W = {w} the model cannot see further than "
             f"{w - 1} tokens back, and trained as asked it answers every k up to there. "
             "Did you train with window=WINDOW, and take the largest k BEFORE the first "
             "distance below 0.9?")
    if beyond > 0.4:
        fail(f"beyond = {beyond:.2f}: past the window the model cannot see the token it is asked "
             "for, so it should be near chance (1/8). Did you average only over k >= W?")
    return (f"window_reach: a window of {w} answers up to k = {int(reach)} and guesses beyond it "
            f"(accuracy {beyond:.2f}, chance 0.12).")

