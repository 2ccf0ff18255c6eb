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
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._protocol import each, function_check, hint, value, value_check
from course_lib.checks._values import read_choice, read_number

__all__ = ["rnn_step", "run_rnn", "gradient_vs_distance", "memory_numbers", "predicted_ratio",
           "ratio_why", "far_prediction", "rnn_far", "hint"]

SOLUTION = "solutions/06_attention_vs_recurrence.ipynb"


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


@function_check(1, run=_step_run, cases=_step_cases,
                forbid=((recurrent, "rnn_step"), (nn.RNNCell, "forward")))
def rnn_step(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        x_t, h, W_xh, W_hh, b = (case[k] for k in ("x_t", "h", "W_xh", "W_hh", "b"))
        want = _rnn_cell(case) if "b_ih" in case else _step(x_t, h, W_xh, W_hh, b)
        what = "rnn_step vs torch.nn.RNNCell" if "b_ih" in case else "rnn_step(...)"
        t = to_tensor(got, what, dtype=torch.float64)
        if "alive" in case:
            alive = case["alive"][:, None]
            expect_shape(t, want.shape, what, hint="wanted (batch, d_hidden).")
            if torch.allclose(t, want):
                fail("rnn_step(..., alive) updated every sequence, the ended ones too: where "
                     "alive is False the summary must stay h, unchanged.")
            if torch.allclose(t, torch.where(alive, want, torch.zeros_like(want))):
                fail("the ended sequences' summaries became 0: where alive is False the step "
                     "must hand back h itself, so the summary survives the padding.")
            expect_close(t, torch.where(alive, want, h), what, atol=1e-9,
                         hint="rows with alive True take the new summary, the others keep h.")
            continue
        expect_shape(t, want.shape, what, hint="wanted (batch, d_hidden): one new summary per "
                     "sequence.")
        pre = x_t @ W_xh.T + h @ W_hh.T + b
        if torch.allclose(t, pre):
            fail("rnn_step returns the sum before the non-linearity: squash it with tanh.")
        if torch.allclose(t, torch.tanh(x_t @ W_xh.T + h @ W_hh.T)):
            fail("rnn_step leaves out the bias b: add it inside the tanh.")
        if torch.allclose(t, torch.tanh(x_t @ W_xh.T + b)):
            fail("rnn_step ignores the previous summary h: without it nothing is carried on.")
        square = W_xh.shape[0] == W_xh.shape[1]
        if square and torch.allclose(t, torch.tanh(x_t @ W_xh + h @ W_hh + b)):
            fail("the weights are used untransposed: W_xh has shape (d_hidden, d_in), so the "
                 "token must meet its transpose.")
        expect_close(t, want, what, atol=1e-9,
                     hint="h_new = tanh(x_t W_xhᵀ + h W_hhᵀ + b).")
    return ("rnn_step: h_new = tanh(x_t W_xhᵀ + h W_hhᵀ + b), the same as torch.nn.RNNCell, and "
            "the sequences that have ended keep their summary.")


# ---------------------------------------------------------------- exercise 2

def _run_cases(seed: int, hidden: bool) -> list:
    g = generator(2, seed)
    sizes = [(1, 4, 3, 5), (3, 7, 4, 6), (2, 1, 2, 3)] + ([(2, 12, 3, 3)] if hidden else [])
    return [dict(_params(g, d_in, d_h), x=randn(g, B, n, d_in)) for B, n, d_in, d_h in sizes]


@function_check(2, args=("x", "W_xh", "W_hh", "b"), cases=_run_cases,
                forbid=((recurrent.RunningSummaryRNN, "forward"), (nn.RNN, "forward")))
def run_rnn(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        x, W_xh, W_hh, b = (case[k] for k in ("x", "W_xh", "W_hh", "b"))
        B, n, _ = x.shape
        d_h = W_hh.shape[0]
        h = torch.zeros(B, d_h, dtype=torch.float64)
        outs = []
        for t in range(n):
            h = _step(x[:, t], h, W_xh, W_hh, b)
            outs.append(h)
        want_out, want_h = torch.stack(outs, dim=1), h
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
        if n > 1 and torch.allclose(out, torch.tanh(x @ W_xh.T + b)):
            fail("still the planted bug: every output ignores the previous state, so each "
                 "summary is the step applied to the zero state. Pass each step's new h on to "
                 "the next step.")
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


@function_check(3, grade="gradient",
                run=lambda fn, case: call(fn, _model(case), case["x"], name="gradient_vs_distance"),
                cases=_gradient_cases, forbid=((recurrent, "gradient_vs_distance"),))
def gradient_vs_distance(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        f, x = _model(case), case["x"]
        name = "an RNN" if case["model"] == "rnn" else "an attention layer"
        n = x.shape[1]
        J = torch.autograd.functional.jacobian(lambda t, f=f: f(t)[0, -1], x)  # (d_out, 1, n, d)
        want = J.pow(2).sum(dim=(0, 1, 3)).sqrt()
        t = to_tensor(got, f"gradient_vs_distance on {name}", dtype=torch.float64)
        expect_shape(t, (n,), f"gradient_vs_distance on {name}",
                     hint="wanted one norm per input position, shape (n,).")
        if torch.allclose(t, want.flip(0), atol=1e-9) and not torch.allclose(want, want.flip(0)):
            fail("your norms come out in reverse: entry j should belong to input position j "
                 "(the caller flips them to get distances).")
        x_req = x.clone().requires_grad_(True)
        (g_sum,) = torch.autograd.grad(f(x_req)[0, -1].sum(), x_req)
        if torch.allclose(t, g_sum[0].norm(dim=-1), atol=1e-9) and \
                not torch.allclose(want, g_sum[0].norm(dim=-1), atol=1e-9):
            fail("you took the gradient of the SUM of the last output's coordinates; the measure "
                 "is the norm of the whole Jacobian block: the gradient of every output "
                 "coordinate, squared and added.")
        expect_close(t, want, f"gradient_vs_distance on {name}", atol=1e-8, rtol=1e-6,
                     hint="g[j] = sqrt(sum over output coordinates i and features of "
                          "(d out[0, -1, i] / d x[0, j])²).")
    return "gradient_vs_distance: the Jacobian norm of the last output for every input position."


# ---------------------------------------------------------------- exercise 4

def _memory_cases(seed: int, hidden: bool) -> list:
    sizes = [(1, 1, 1), (16, 32, 1), (1000, 64, 2), (4096, 4096, 32)]
    sizes += [(100_000, 4096, 32), (7, 3, 5)] if hidden else []
    return [{"n": n, "d": d, "num_layers": layers} for n, d, layers in sizes]


@function_check(4, args=("n", "d", "num_layers"), grade="memory", cases=_memory_cases)
def memory_numbers(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        n, d, layers = case["n"], case["d"], case["num_layers"]
        expect_pair(got, "memory_numbers", "(rnn_numbers, attention_numbers)")
        try:
            rnn, attn = (int(v) for v in got)
        except (TypeError, ValueError, RuntimeError):
            fail(f"memory_numbers should return two whole numbers, got {got!r}.")
        if rnn != d * layers:
            if rnn == d and layers > 1:
                fail("the RNN keeps one state of d numbers per layer: multiply by num_layers.")
            fail(f"for d={d}, num_layers={layers} the RNN keeps {d * layers} numbers (d per "
                 f"layer), you said {rnn}; it does not depend on n.")
        if attn != 2 * n * d * layers:
            if attn == n * d * layers:
                fail("attention keeps a key AND a value for every position: 2 · n · d per layer.")
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


@value_check(7)
def rnn_far(cases: list, outcomes: list) -> str:
    got = read_number(value(outcomes[0], "rnn_far"), "rnn_far", 0, 1e30,
                      "a number (g[0] / g[-1])")
    want = measured_far()

    def near(x, tol=0.02):
        return abs(got - x) <= tol * abs(x)

    if near(want):
        return (f"rnn_far: {got:.2g}, no longer fading (your prediction was recorded above). "
                f"With W_hh {FAR_SCALE:g} times larger, the first token's "
                "pull on the last output no longer fades with distance: each step's factor is "
                "now close to 1 (the tanh saturates what would otherwise explode). A gradient's "
                "reach through a recurrence hangs on the size of that factor, a knife edge "
                "between vanishing and exploding.")
    if near(measured_far(1.0)):
        fail(f"rnn_far = {got:.3g} is the RNN as the cell built it: multiply its W_hh by "
             f"{FAR_SCALE:g} (inside torch.no_grad()) before measuring.")
    if want > 0 and near(1 / want):
        fail(f"rnn_far = {got:.3g} is upside down: divide the gradient at the FIRST position, "
             "g[0], by the one at the last, g[-1].")
    if near(measured_far(FAR_SCALE, "W_xh")):
        fail("you scaled W_xh, the weights that read the input; the recurrence is W_hh, the "
             "weights that carry the summary from one step to the next.")
    direction = "larger" if got > want else "smaller"
    fail(f"rnn_far = {got:.3g} is {direction} than the check's measurement (by more than 2%) on "
         f"the set-up cell's seeded RNN and x with W_hh times {FAR_SCALE:g}. Scale W_hh once, "
         "then use your gradient_vs_distance from exercise 3 on f = lambda t: rnn(t)[0].")
