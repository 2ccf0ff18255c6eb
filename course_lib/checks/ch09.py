"""Checkers for exercises/09_paying_less.ipynb: grouped-query attention (build), a recurrence with
a planted bug (debug), where the quadratic term takes over (predict), and how far a sliding
window reaches after training (experiment)."""

from __future__ import annotations

import functools
import math
from functools import partial

import torch
import torch.nn.functional as F

import course_lib.attention as attention
import course_lib.linear_attention as linear
from course_lib.checks._core import expect_close, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check, value_check
from course_lib.checks._judging import value
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
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


def _gqa(q, k, v, tiled=False, scale=None):
    """Softmax attention of each query head over its group's K/V head: head i reads K/V head
    i // (h/g) (tiled=True: i % g, the K/V heads repeated as a whole), scores times 1/√d (or
    `scale`). Written out, not PyTorch's SDPA: the reference and the variants run as an answer
    does, under the exercise's forbid."""
    r = q.shape[1] // k.shape[1]
    k, v = (t.repeat(1, r, 1, 1) if tiled else t.repeat_interleave(r, dim=1) for t in (k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def _heads(case, got) -> dict:
    h, groups = case["q"].shape[1], case["k"].shape[1]
    return {"h": h, "g": groups, "r": h // groups}


@function_check(1, args=("q", "k", "v"), grade="gqa", cases=_gqa_cases, forbid=(
    (attention, "grouped_query_attention"), (F, "scaled_dot_product_attention")),
    reference=_gqa, mistakes=(
    Mistake("query head i reads K/V head i % g: with h={h}, g={g}, head 1 should share K/V head "
            "0 with head 0, since heads are grouped in consecutive blocks of h/g = {r}. Copy "
            "each K/V head h/g times in a row (repeat_interleave), or reshape the queries into "
            "(g, h/g) groups.", partial(_gqa, tiled=True), atol=1e-8, rtol=1e-5,
            detail=_heads),
    Mistake("your output is attention without the 1/√d scale: divide the scores by √d.",
            partial(_gqa, scale=1.0), atol=1e-8, rtol=1e-5),
))
def grouped_query_attention(cases: list, outcomes: list) -> str:
    for case, outcome in zip(cases, outcomes):
        q, k = case["q"], case["k"]
        got = value(outcome, "grouped_query_attention")
        if isinstance(got, (tuple, list)) and len(got) == 2:
            got = got[0]  # (out, weights) is fine too
        out = to_tensor(got, "grouped_query_attention(q, k, v)", dtype=torch.float64)
        h, groups = q.shape[1], k.shape[1]
        want = expected(case)
        expect_shape(out, want.shape, "the output",
                     f"one output per QUERY head: (batch, h={h}, n_q, d_v), although k and v "
                     f"have only g={groups} heads.")
        named_mistake(case, out)
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


def _linear(q, k, v, diagonal=0, normalised=True):
    """Linear attention over the keys j <= i + diagonal (0: the causal form; -1: the state read
    before token i is added, so output 0 reads nothing and is 0; n: every key), divided by the
    sum of its weights or not. Written out, not the course's own (which the exercise forbids)."""
    w = torch.tril(linear.feature_map(q) @ linear.feature_map(k).T, diagonal)
    if not normalised:
        return w @ v
    return (w @ v) / w.sum(-1, keepdim=True).clamp_min(1e-300)


def _after_the_first(out):
    return out[1:]


@function_check(2, args=("q", "k", "v"), grade="recurrence", cases=_recurrence_cases,
                forbid=((linear, "linear_attention"), (linear, "linear_attention_recurrent")),
                reference=_linear, mistakes=(
    Mistake("output i ignores token i itself: the state is read before token i is added. Under "
            "a causal mask a token may see itself (j <= i).", partial(_linear, diagonal=-1),
            atol=1e-9, rtol=1e-5, on=_after_the_first),
    Mistake("every output sees every token, later ones included: the causal form may use only "
            "the tokens up to i.",
            lambda q, k, v: _linear(q, k, v, diagonal=len(k)), atol=1e-9, rtol=1e-5),
    Mistake("the output is not divided by φ(q_i)·z_i, so its weights do not sum to 1.",
            partial(_linear, normalised=False), atol=1e-9, rtol=1e-5),
))
def linear_recurrence(cases: list, outcomes: list) -> str:
    for case, outcome in zip(cases, outcomes):
        q = case["q"]
        out = to_tensor(value(outcome, "linear_recurrence"), "linear_recurrence(q, k, v)",
                        dtype=torch.float64)
        want = expected(case)
        expect_shape(out, want.shape, "the output", "one row per token, d_v columns.")
        if q.shape[0] > 1 and not torch.isfinite(out[0]).all() and torch.isfinite(out[1:]).all():
            fail("the first output row is NaN: token 0 reads a state that holds nothing yet "
                 "(0 / 0). What should the state contain when token i is read?")
        named_mistake(case, out)
        expect_close(out, want, "the output", atol=1e-9, rtol=1e-7,
                     hint="the output must equal linear_attention(q, k, v, causal=True).")
    return ("linear_recurrence: equals causal linear attention on every case; the bug is fixed.")


# ------------------------------------------------------------------------------------------------
# exercise 3 (predict): where the quadratic term takes over
# ------------------------------------------------------------------------------------------------

PREDICT_WIDTH = 1024


def _read_crossover(got) -> float:
    if got is None:
        fail("predicted_crossover is None: write your prediction (a number of tokens) in it.")
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got) \
            or got <= 0:
        fail(f"predicted_crossover should be a positive number of tokens, got {got!r}.")
    return float(got)


@commit_check(3, read=_read_crossover, grade="predict", reveals=("ch09_predict_run",))
def predicted_crossover(got: float) -> str:
    want = crossover_length(PREDICT_WIDTH)
    ratio = got / want
    gap = "within 10% of it" if 0.9 <= ratio <= 1.1 else \
        f"{max(ratio, 1 / ratio):.1f} times too {'low' if ratio < 1 else 'high'}"
    return (f"prediction committed. The count: at d = {PREDICT_WIDTH} the score and blend "
            f"products cost as much as the rest of the layer at n = {want} tokens; you "
            f"predicted {got:g}, {gap}. The next cell counts the real layer.")


crossover_why = choice_check(3, "crossover_why", "abc", module=__name__)


# ------------------------------------------------------------------------------------------------
# exercise 4 (experiment): how far back does a window of W reach, as measured?
# ------------------------------------------------------------------------------------------------

EXPERIMENT_WINDOW, EXPERIMENT_TOKENS, EXPERIMENT_VOCAB = 5, 24, 8


@functools.cache
def measured_curve() -> dict[int, float]:
    """The check's own run of the exercise's recipe: accuracy at every distance k."""
    from course_lib.models.cheaper import CheaperAttentionModel
    from course_lib.models.recall import accuracy_by_distance, recall_batch
    from course_lib.train import train

    n, vocab = EXPERIMENT_TOKENS, EXPERIMENT_VOCAB
    batch_fn = partial(recall_batch, n=n, vocab=vocab)
    tokens, targets = batch_fn(torch.Generator().manual_seed(99), batch=2000)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = CheaperAttentionModel(vocab + n + 1, vocab, d_model=16, num_heads=2,
                                      max_len=n + 1, window=EXPERIMENT_WINDOW)
        train(model, batch_fn, steps=300, lr=1e-2, seed=0, progress=False)
        with torch.no_grad():
            return accuracy_by_distance(model, tokens, targets, vocab)


def _reach(curve: dict) -> int:
    reach = 0
    while reach + 1 in curve and curve[reach + 1] >= 0.9:
        reach += 1
    return reach


def _measured_reach() -> tuple[int, dict[int, float]]:
    curve = measured_curve()
    return _reach(curve), curve


def _theory_curve() -> tuple[int, dict[int, float]]:
    """1 inside the window, exactly 1/8 beyond: the curve written down, not measured."""
    w = EXPERIMENT_WINDOW
    return w - 1, {k: 1.0 if k < w else 1 / EXPERIMENT_VOCAB for k in measured_curve()}


def _the_curve(answer):
    return answer[1]


@value_check(4, grade="experiment", reference=_measured_reach, mistakes=(
    Mistake("acc is the theory's curve (1 inside the window, exactly 1/8 beyond), not a "
            "measurement: train the model and read its accuracies; the guesses beyond the "
            "window scatter around chance.", _theory_curve, atol=1e-9, rtol=0, on=_the_curve),
))
def window_reach(cases: list, outcomes: list) -> str:
    reach, acc = read_several(value(outcomes[0], "(reach, acc)"), 2, "two answers",
                              "check.window_reach(reach, acc)")
    if reach is None or acc is None:
        fail("reach or acc is None: set both from your measurement.")
    if isinstance(reach, bool) or not isinstance(reach, (int, float)) or reach != int(reach):
        fail(f"reach should be a whole number of tokens (a distance k), got {reach!r}.")
    if not isinstance(acc, dict) or not all(isinstance(k, int) and isinstance(v, (int, float))
                                            for k, v in acc.items()):
        fail("acc should be the dict {distance k: accuracy} that accuracy_by_distance returns.")
    _, want = expected(cases[0])
    if sorted(acc) != sorted(want):
        fail(f"acc has the distances {sorted(acc)[:4]}...; measure on the exercise's test batch "
             f"(seed 99, 2000 sequences), which holds every k from 1 to {max(want)}.")
    w = EXPERIMENT_WINDOW
    named_mistake(cases[0], (reach, acc))
    off = [k for k in want if abs(acc[k] - want[k]) > 0.03]
    if off:
        k = off[0]
        fail(f"at k = {k} your accuracy is {'higher' if acc[k] > want[k] else 'lower'} than the "
             f"check's run of the same recipe (by more than 0.03; {len(off)} distance(s) off). "
             "Train with torch.manual_seed(0) first, window=WINDOW, steps=300, lr=1e-2, seed=0, "
             "and measure on the given test batch.")
    if int(reach) != _reach(acc):
        fail(f"reach = {int(reach)} does not follow from your own curve: take the largest k "
             "such that every distance 1..k has accuracy >= 0.9.")
    return (f"window_reach: measured, the window of {w} answers every k up to {int(reach)} and "
            "guesses beyond it, the guesses scattered around chance.")
