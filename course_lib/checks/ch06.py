"""Checkers for exercises/06_attention_vs_recurrence.ipynb: an RNN step (build), an RNN loop that
never carries its summary (debug), a gradient-versus-distance measurement and the memory each
model keeps (build), how much more attention remembers (predict), and how far an RNN's gradient
reaches (experiment)."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn

import course_lib.recurrent as recurrent
from course_lib.checks._cases import generator, randn
from course_lib.checks._core import call, expect_close, expect_pair, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check, value_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each, value
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._values import read_choice, read_number

__all__ = ["rnn_step", "run_rnn", "gradient_vs_distance", "memory_numbers", "predicted_ratio",
           "ratio_why", "far_prediction", "rnn_far", "hint"]

SOLUTION = "solutions/06_attention_vs_recurrence.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
# Here: the gradient exercise measures the learner's function on an RNN the kernel must run
# (`_model`, `_step`): the one RNN step of exercise 1 is in reach there (a known limit)
KERNEL_HALF = ("_model", "_step", "_step_run")


def _params(g: torch.Generator, d_in: int, d_h: int) -> dict:
    s = 1 / math.sqrt(d_h)
    return {"W_xh": randn(g, d_h, d_in, scale=s), "W_hh": randn(g, d_h, d_h, scale=s),
            "b": randn(g, d_h, scale=s)}


def _step(x_t, h, W_xh, W_hh, b):
    return torch.tanh(x_t @ W_xh.T + h @ W_hh.T + b)


# ---------------------------------------------------------------- exercise 1

def _step_cases(seed: int, hidden: bool) -> list:
    g = generator(1, seed)
    sizes = [(1, 3, 4), (4, 5, 8), (2, 6, 6)] + ([(3, 1, 2), (2, 16, 4)] if hidden else [])
    cases = [dict(_params(g, d_in, d_h), x_t=randn(g, B, d_in), h=randn(g, B, d_h))
             for B, d_in, d_h in sizes]
    # torch's own RNN cell, whose two biases add up to b
    cell = {"x_t": randn(g, 2, 3), "h": randn(g, 2, 5), "W_xh": randn(g, 5, 3),
            "W_hh": randn(g, 5, 5), "b_ih": randn(g, 5), "b_hh": randn(g, 5)}
    cases.append(dict(cell, b=cell["b_ih"] + cell["b_hh"]))
    # a batch of sequences of different lengths: the ended ones (alive False) keep their summary
    for B, d_in, d_h in [(4, 3, 5), (3, 2, 4)] + ([(6, 4, 4)] if hidden else []):
        alive = torch.arange(B) % 2 == 0
        cases.append(dict(_params(g, d_in, d_h), x_t=randn(g, B, d_in), h=randn(g, B, d_h),
                          alive=alive))
    return cases


def _step_run(fn, case):
    args = tuple(case[k] for k in ("x_t", "h", "W_xh", "W_hh", "b"))
    if "alive" in case:
        return call(fn, *args, case["alive"], name="rnn_step")
    return call(fn, *args, name="rnn_step")


def _rnn_cell(case: dict) -> torch.Tensor:
    cell = nn.RNNCell(case["W_xh"].shape[1], case["W_xh"].shape[0]).double()
    with torch.no_grad():
        for name, key in (("weight_ih", "W_xh"), ("weight_hh", "W_hh"), ("bias_ih", "b_ih"),
                          ("bias_hh", "b_hh")):
            getattr(cell, name).copy_(case[key])
        return cell(case["x_t"], case["h"])


def _kept_where_ended(new, h, alive=None):
    """The step's new summaries, but h itself for the sequences that have ended (alive False)."""
    return new if alive is None else torch.where(alive[:, None], new, h)


def _rnn_step_ok(x_t, h, W_xh, W_hh, b, alive=None):
    return _kept_where_ended(_step(x_t, h, W_xh, W_hh, b), h, alive)


@function_check(1, run=_step_run, cases=_step_cases,
                forbid=((recurrent, "rnn_step"), (nn.RNNCell, "forward")),
                reference=_rnn_step_ok, mistakes=(
    Mistake("rnn_step(..., alive) updated every sequence, the ended ones too: where alive is "
            "False the summary must stay h, unchanged.",
            lambda x_t, h, W_xh, W_hh, b, alive=None: _step(x_t, h, W_xh, W_hh, b),
            atol=1e-8, rtol=1e-5),
    Mistake("the ended sequences' summaries became 0: where alive is False the step must hand "
            "back h itself, so the summary survives the padding.",
            lambda x_t, h, W_xh, W_hh, b, alive=None: _kept_where_ended(
                _step(x_t, h, W_xh, W_hh, b), torch.zeros_like(h), alive),
            atol=1e-8, rtol=1e-5),
    Mistake("rnn_step returns the sum before the non-linearity: squash it with tanh.",
            lambda x_t, h, W_xh, W_hh, b, alive=None: _kept_where_ended(
                x_t @ W_xh.T + h @ W_hh.T + b, h, alive),
            atol=1e-8, rtol=1e-5),
    Mistake("rnn_step leaves out the bias b: add it inside the tanh.",
            lambda x_t, h, W_xh, W_hh, b, alive=None: _kept_where_ended(
                torch.tanh(x_t @ W_xh.T + h @ W_hh.T), h, alive),
            atol=1e-8, rtol=1e-5),
    Mistake("rnn_step ignores the previous summary h: without it nothing is carried on.",
            lambda x_t, h, W_xh, W_hh, b, alive=None: _kept_where_ended(
                torch.tanh(x_t @ W_xh.T + b), h, alive),
            atol=1e-8, rtol=1e-5),
))
def rnn_step(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        want = _rnn_cell(case) if "b_ih" in case else expected(case)
        what = "rnn_step vs torch.nn.RNNCell" if "b_ih" in case else "rnn_step(...)"
        t = to_tensor(got, what, dtype=torch.float64)
        if "alive" in case:
            expect_shape(t, want.shape, what, hint="wanted (batch, d_hidden).")
            named_mistake(case, t)
            expect_close(t, want, what, atol=1e-9,
                         hint="rows with alive True take the new summary, the others keep h.")
            continue
        expect_shape(t, want.shape, what, hint="wanted (batch, d_hidden): one new summary per "
                     "sequence.")
        named_mistake(case, t)
        expect_close(t, want, what, atol=1e-9,
                     hint="h_new = tanh(x_t W_xhᵀ + h W_hhᵀ + b).")
    return ("rnn_step: h_new = tanh(x_t W_xhᵀ + h W_hhᵀ + b), the same as torch.nn.RNNCell, and "
            "the sequences that have ended keep their summary.")


# ---------------------------------------------------------------- exercise 2

def _run_cases(seed: int, hidden: bool) -> list:
    g = generator(2, seed)
    sizes = [(1, 4, 3, 5), (3, 7, 4, 6), (2, 1, 2, 3)] + ([(2, 12, 3, 3)] if hidden else [])
    return [dict(_params(g, d_in, d_h), x=randn(g, B, n, d_in)) for B, n, d_in, d_h in sizes]


def _run_rnn_ok(x, W_xh, W_hh, b):
    h = x.new_zeros(x.shape[0], W_hh.shape[0])
    outs = []
    for t in range(x.shape[1]):
        h = _step(x[:, t], h, W_xh, W_hh, b)
        outs.append(h)
    return torch.stack(outs, dim=1), h


def _run_rnn_given(x, W_xh, W_hh, b):
    """The planted bug: each step starts from the zero state, the new summary never carried."""
    h = x.new_zeros(x.shape[0], W_hh.shape[0])
    outs = [_step(x[:, t], h, W_xh, W_hh, b) for t in range(x.shape[1])]
    return torch.stack(outs, dim=1), outs[-1]


@function_check(2, args=("x", "W_xh", "W_hh", "b"), cases=_run_cases,
                forbid=((recurrent.RunningSummaryRNN, "forward"), (nn.RNN, "forward")),
                reference=_run_rnn_ok, mistakes=(
    Mistake("still the planted bug: every output ignores the previous state, so each summary is "
            "the step applied to the zero state. Pass each step's new h on to the next step.",
            _run_rnn_given, atol=1e-8, rtol=1e-5, on=lambda result: result[0]),
))
def run_rnn(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        B, n, _ = case["x"].shape
        d_h = case["W_hh"].shape[0]
        want_out, want_h = expected(case)
        expect_pair(got, "run_rnn", "(outputs, h_last)")
        out = to_tensor(got[0], "outputs", dtype=torch.float64)
        h_last = to_tensor(got[1], "h_last", dtype=torch.float64)
        if out.shape == (n, B, d_h) and n != B:
            fail(f"outputs has shape {tuple(out.shape)} = (n, batch, d_hidden): stack the states "
                 "along the position axis, dim=1, to get (batch, n, d_hidden).")
        expect_shape(out, want_out.shape, "outputs",
                     hint="wanted (batch, n, d_hidden): one summary per position.")
        expect_shape(h_last, want_h.shape, "h_last",
                     hint="wanted (batch, d_hidden): the summary after the last token.")
        named_mistake(case, (out, h_last))
        expect_close(out, want_out, "outputs", atol=1e-9,
                     hint="start from a zero summary; at each position update it with rnn_step "
                          "and keep every summary.")
        expect_close(h_last, want_h, "h_last", atol=1e-9,
                     hint="h_last is the state after the final step.")
    return ("run_rnn: a running summary, updated position by position, equal to the loop it "
            "should be.")


# ---------------------------------------------------------------- exercise 3

def _gradient_cases(seed: int, hidden: bool) -> list:
    g = generator(3, seed)
    cases = [{"model": "rnn", **_params(g, 4, 6), "x": randn(g, 1, 7, 4)},
             {"model": "attention", "W": randn(g, 3, 4, 4, scale=0.5), "x": randn(g, 1, 5, 4)}]
    if hidden:
        cases += [{"model": "rnn", **_params(g, 2, 3), "x": randn(g, 1, 12, 2)},
                  {"model": "attention", "W": randn(g, 3, 2, 2), "x": randn(g, 1, 2, 2)}]
    return cases


def _model(case: dict):
    """The function whose gradients the learner measures, rebuilt from the case's weights."""
    if case["model"] == "rnn":
        W_xh, W_hh, b = case["W_xh"], case["W_hh"], case["b"]

        def rnn_outputs(x):
            h = x.new_zeros(x.shape[0], W_hh.shape[0])
            outs = []
            for t in range(x.shape[1]):
                h = _step(x[:, t], h, W_xh, W_hh, b)
                outs.append(h)
            return torch.stack(outs, dim=1)
        return rnn_outputs
    W = case["W"]

    def attention_outputs(x):
        q, k, v = x @ W[0], x @ W[1], x @ W[2]
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v
    return attention_outputs


def _jacobian_norms(f, x):
    """The right answer: the norm of d out[0, -1] / d x[0, j] for every position j."""
    J = torch.autograd.functional.jacobian(lambda t: f(t)[0, -1], x)  # (d_out, 1, n, d)
    return J.pow(2).sum(dim=(0, 1, 3)).sqrt()


def _sum_gradient_norms(f, x):
    """The gradient of the SUM of the last output's coordinates, its norm at every position."""
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x)[0, -1].sum(), x)
    return g[0].norm(dim=-1)


@function_check(3, grade="gradient",
                run=lambda fn, case: call(fn, _model(case), case["x"], name="gradient_vs_distance"),
                cases=_gradient_cases, forbid=((recurrent, "gradient_vs_distance"),),
                reference=_jacobian_norms, mistakes=(
    Mistake("your norms come out in reverse: entry j should belong to input position j (the "
            "caller flips them to get distances).",
            lambda f, x: _jacobian_norms(f, x).flip(0), atol=1e-9, rtol=1e-5),
    Mistake("you took the gradient of the SUM of the last output's coordinates; the measure is "
            "the norm of the whole Jacobian block: the gradient of every output coordinate, "
            "squared and added.", _sum_gradient_norms, atol=1e-9, rtol=1e-5),
))
def gradient_vs_distance(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        name = "an RNN" if case["model"] == "rnn" else "an attention layer"
        want = expected(case)
        t = to_tensor(got, f"gradient_vs_distance on {name}", dtype=torch.float64)
        expect_shape(t, (case["x"].shape[1],), f"gradient_vs_distance on {name}",
                     hint="wanted one norm per input position, shape (n,).")
        named_mistake(case, t)
        expect_close(t, want, f"gradient_vs_distance on {name}", atol=1e-8, rtol=1e-6,
                     hint="g[j] = sqrt(sum over output coordinates i and features of "
                          "(d out[0, -1, i] / d x[0, j])²).")
    return "gradient_vs_distance: the Jacobian norm of the last output for every input position."


# ---------------------------------------------------------------- exercise 4

def _memory_cases(seed: int, hidden: bool) -> list:
    sizes = [(1, 1, 1), (16, 32, 1), (1000, 64, 2), (4096, 4096, 32)]
    sizes += [(100_000, 4096, 32), (7, 3, 5)] if hidden else []
    return [{"n": n, "d": d, "num_layers": layers} for n, d, layers in sizes]


def _memory_ok(n, d, num_layers):
    return d * num_layers, 2 * n * d * num_layers


@function_check(4, args=("n", "d", "num_layers"), grade="memory", cases=_memory_cases,
                reference=_memory_ok, mistakes=(
    Mistake("the RNN keeps one state of d numbers per layer: multiply by num_layers.",
            lambda n, d, num_layers: (d, 2 * n * d * num_layers), atol=0, rtol=0,
            on=lambda numbers: numbers[0]),
    Mistake("attention keeps a key AND a value for every position: 2 · n · d per layer.",
            lambda n, d, num_layers: (d * num_layers, n * d * num_layers), atol=0, rtol=0),
))
def memory_numbers(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        n, d, layers = case["n"], case["d"], case["num_layers"]
        expect_pair(got, "memory_numbers", "(rnn_numbers, attention_numbers)")
        try:
            rnn, attn = (int(v) for v in got)
        except (TypeError, ValueError, RuntimeError):
            fail(f"memory_numbers should return two whole numbers, got {got!r}.")
        named_mistake(case, (rnn, attn))
        if rnn != d * layers:
            fail(f"for d={d}, num_layers={layers} the RNN keeps {d * layers} numbers (d per "
                 f"layer), you said {rnn}; it does not depend on n.")
        if attn != 2 * n * d * layers:
            fail(f"for n={n}, d={d}, num_layers={layers} attention keeps 2·n·d·layers = "
                 f"{2 * n * d * layers} numbers, you said {attn}.")
    return ("memory_numbers: d per layer for the RNN, 2·n·d per layer for attention's keys and "
            "values.")


# ---------------------------------------------------------------- exercise 5 (predict)

BOOK_TOKENS, BOOK_LAYERS, BOOK_WIDTH = 100_000, 32, 4096
BOOK_HEADS, BOOK_KV_HEADS, BOOK_WINDOW = 32, 8, 4096


def book_ratio() -> float:
    """Numbers kept by windowed grouped-query attention over those of the RNN, for the book."""
    kept_tokens = min(BOOK_TOKENS, BOOK_WINDOW)
    d_kv = BOOK_WIDTH * BOOK_KV_HEADS // BOOK_HEADS      # the width of the shared K/V heads
    attention = 2 * kept_tokens * d_kv * BOOK_LAYERS
    return attention / (BOOK_WIDTH * BOOK_LAYERS)


@commit_check(5, read=partial(read_number, what="predicted_ratio", low=0, high=1e15,
                              kind="a number (how many times more)"), grade="predicted_ratio")
def predicted_ratio(got: float) -> str:
    ratio = book_ratio()
    close = "within 1% of it" if abs(got - ratio) <= 0.01 * ratio else \
        f"{max(got / ratio, ratio / got):,.1f} times too {'high' if got > ratio else 'low'}"
    return (f"prediction committed. The count: this attention keeps {ratio:,.0f} times the "
            f"RNN's numbers; you predicted {got:,.0f}x, {close}.")


ratio_why = choice_check(5, "ratio_why", "abc", module=__name__)


# ---------------------------------------------------------------- exercise 6 (experiment)

FAR_SEED, FAR_N, FAR_D_IN, FAR_D_HIDDEN, FAR_SCALE = 6, 32, 8, 16, 3.0


def measured_far(scale: float = FAR_SCALE, part: str = "W_hh") -> float:
    """g[0] / g[-1] for the exercise's seeded RNN with `part` multiplied by `scale`: the first
    input's pull on the last output, relative to the last input's."""
    with torch.random.fork_rng():
        torch.manual_seed(FAR_SEED)
        rnn = recurrent.RunningSummaryRNN(FAR_D_IN, FAR_D_HIDDEN)
        x = torch.randn(1, FAR_N, FAR_D_IN)
    with torch.no_grad():
        getattr(rnn, part).mul_(scale)
    g = recurrent.gradient_vs_distance(lambda t: rnn(t)[0], x)
    return float(g[0] / g[-1])


FAR_CHOICES = ("faster", "slower", "none")


@commit_check(6, read=partial(read_choice, name="far_prediction", choices=FAR_CHOICES),
              grade="far_prediction", reveals=("ch06_rnn_far",))
def far_prediction(got: str) -> str:
    return (f"prediction committed ({got!r}). Now measure it: the check of your rnn_far says "
            "whether you were right.")


def _far_words(case, got) -> dict:
    return {"got": got, "scale": FAR_SCALE}


@value_check(7, reference=measured_far, mistakes=(
    Mistake("rnn_far = {got:.3g} is the RNN as the cell built it: multiply its W_hh by "
            "{scale:g} (inside torch.no_grad()) before measuring.",
            lambda: measured_far(1.0), atol=0, rtol=0.02, detail=_far_words),
    Mistake("rnn_far = {got:.3g} is upside down: divide the gradient at the FIRST position, "
            "g[0], by the one at the last, g[-1].",
            lambda: 1 / measured_far(), atol=0, rtol=0.02, detail=_far_words),
    Mistake("you scaled W_xh, the weights that read the input; the recurrence is W_hh, the "
            "weights that carry the summary from one step to the next.",
            lambda: measured_far(FAR_SCALE, "W_xh"), atol=0, rtol=0.02),
))
def rnn_far(cases: list, outcomes: list) -> str:
    got = read_number(value(outcomes[0], "rnn_far"), "rnn_far", 0, 1e30,
                      "a number (g[0] / g[-1])")
    want = expected(cases[0])
    if abs(got - want) <= 0.02 * abs(want):
        return (f"rnn_far: {got:.2g}, no longer fading (your prediction was recorded above). "
                f"With W_hh {FAR_SCALE:g} times larger, the first token's "
                "pull on the last output no longer fades with distance: each step's factor is "
                "now close to 1 (the tanh saturates what would otherwise explode). A gradient's "
                "reach through a recurrence hangs on the size of that factor, a knife edge "
                "between vanishing and exploding.")
    named_mistake(cases[0], got)
    direction = "larger" if got > want else "smaller"
    fail(f"rnn_far = {got:.3g} is {direction} than the check's measurement (by more than 2%) on "
         f"the set-up cell's seeded RNN and x with W_hh times {FAR_SCALE:g}. Scale W_hh once, "
         "then use your gradient_vs_distance from exercise 3 on f = lambda t: rnn(t)[0].")
