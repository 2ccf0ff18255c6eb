"""Checkers for exercises/06_attention_vs_recurrence.ipynb: an RNN step, the RNN loop, a
gradient-versus-distance measurement, and the memory each model keeps."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

import course_lib.recurrent as recurrent
from course_lib.checks._core import call, expect_close, expect_shape, fail, forbid, passed, to_tensor


def _randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _params(d_in: int, d_h: int, seed: int):
    s = 1 / math.sqrt(d_h)
    return (_randn(d_h, d_in, seed=seed, scale=s), _randn(d_h, d_h, seed=seed + 1, scale=s),
            _randn(d_h, seed=seed + 2, scale=s))


def rnn_step(fn) -> None:
    """Exercise 1: rnn_step(x_t, h, W_xh, W_hh, b) -> tanh(x_t W_xhᵀ + h W_hhᵀ + b)."""
    for seed, (B, d_in, d_h) in enumerate([(1, 3, 4), (4, 5, 8), (2, 6, 6)]):
        W_xh, W_hh, b = _params(d_in, d_h, 10 * seed)
        x_t, h = _randn(B, d_in, seed=100 + seed), _randn(B, d_h, seed=200 + seed)
        want = torch.tanh(x_t @ W_xh.T + h @ W_hh.T + b)
        got = call(fn, x_t.clone(), h.clone(), W_xh.clone(), W_hh.clone(), b.clone(), name="rnn_step")
        t = to_tensor(got, "rnn_step(x_t, h, W_xh, W_hh, b)", dtype=torch.float64)
        expect_shape(t, want.shape, "rnn_step(...)", hint="wanted (batch, d_hidden): one new summary per sequence.")
        pre = x_t @ W_xh.T + h @ W_hh.T + b
        if torch.allclose(t, pre):
            fail("rnn_step returns the sum before the non-linearity: wrap it in torch.tanh(...).")
        if torch.allclose(t, torch.tanh(x_t @ W_xh.T + h @ W_hh.T)):
            fail("rnn_step leaves out the bias b: add it inside the tanh.")
        if torch.allclose(t, torch.tanh(x_t @ W_xh.T + b)):
            fail("rnn_step ignores the previous summary h: add h @ W_hh.T, or nothing is carried on.")
        if d_in == d_h and torch.allclose(t, torch.tanh(x_t @ W_xh + h @ W_hh + b)):
            fail("the weights are used untransposed: W_xh has shape (d_hidden, d_in), so use x_t @ W_xh.T.")
        expect_close(t, want, "rnn_step(...)", atol=1e-9,
                     hint="h_new = tanh(x_t @ W_xh.T + h @ W_hh.T + b).")
    # the same computation as torch's RNN cell
    cell = nn.RNNCell(3, 5).double()
    x_t, h = _randn(2, 3, seed=7), _randn(2, 5, seed=8)
    with torch.no_grad():
        want = cell(x_t, h)
        got = call(fn, x_t, h, cell.weight_ih.detach(), cell.weight_hh.detach(),
                   (cell.bias_ih + cell.bias_hh).detach(), name="rnn_step")
    expect_close(got, want, "rnn_step vs torch.nn.RNNCell", atol=1e-9)
    passed("rnn_step: h_new = tanh(x_t W_xhᵀ + h W_hhᵀ + b), the same as torch.nn.RNNCell.")


def run_rnn(fn) -> None:
    """Exercise 2: run_rnn(x, W_xh, W_hh, b) -> (outputs (B, n, d_h), h_last (B, d_h))."""
    with forbid((recurrent.RunningSummaryRNN, "forward"), (nn.RNN, "forward"), exercise="run_rnn"):
        for seed, (B, n, d_in, d_h) in enumerate([(1, 4, 3, 5), (3, 7, 4, 6), (2, 1, 2, 3)]):
            W_xh, W_hh, b = _params(d_in, d_h, 30 + 10 * seed)
            x = _randn(B, n, d_in, seed=300 + seed)
            h = torch.zeros(B, d_h, dtype=torch.float64)
            outs = []
            for t in range(n):
                h = torch.tanh(x[:, t] @ W_xh.T + h @ W_hh.T + b)
                outs.append(h)
            want_out, want_h = torch.stack(outs, dim=1), h
            got = call(fn, x.clone(), W_xh.clone(), W_hh.clone(), b.clone(), name="run_rnn")
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                fail(f"run_rnn should return a pair (outputs, h_last), got {type(got).__name__}.")
            out = to_tensor(got[0], "outputs", dtype=torch.float64)
            h_last = to_tensor(got[1], "h_last", dtype=torch.float64)
            if out.shape == (n, B, d_h) and n != B:
                fail(f"outputs has shape {tuple(out.shape)} = (n, batch, d_hidden): stack the states along "
                     "dim=1 to get (batch, n, d_hidden).")
            expect_shape(out, want_out.shape, "outputs", hint="wanted (batch, n, d_hidden): one summary per position.")
            expect_shape(h_last, want_h.shape, "h_last", hint="wanted (batch, d_hidden): the summary after the last token.")
            if n > 1:
                no_carry = torch.tanh(x @ W_xh.T + b)
                if torch.allclose(out, no_carry):
                    fail("every output ignores the previous state: pass each step's h on to the next step.")
            expect_close(out, want_out, "outputs", atol=1e-9,
                         hint="start from h = zeros(batch, d_hidden); at each t: h = rnn_step(x[:, t], h, ...); keep every h.")
            expect_close(h_last, want_h, "h_last", atol=1e-9, hint="h_last is the state after the final step.")
    passed("run_rnn: a running summary, updated position by position, equal to the loop it should be.")


def gradient_vs_distance(fn) -> None:
    """Exercise 3: gradient_vs_distance(f, x) -> (n,), ‖∂ f(x)[0, -1] / ∂ x[0, j]‖ for every j."""
    torch.manual_seed(0)
    rnn = recurrent.RunningSummaryRNN(4, 6).double()
    W = _randn(3, 4, 4, seed=50, scale=0.5)

    def rnn_outputs(x):
        return rnn(x)[0]

    def attention_outputs(x):
        q, k, v = x @ W[0], x @ W[1], x @ W[2]
        return torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1) @ v

    with forbid((recurrent, "gradient_vs_distance"), exercise="gradient_vs_distance"):
        for name, f, n in (("an RNN", rnn_outputs, 7), ("an attention layer", attention_outputs, 5)):
            x = _randn(1, n, 4, seed=60 + n)
            J = torch.autograd.functional.jacobian(lambda t: f(t)[0, -1], x)  # (d_out, 1, n, d)
            want = J.pow(2).sum(dim=(0, 1, 3)).sqrt()
            got = call(fn, f, x.clone(), name="gradient_vs_distance")
            t = to_tensor(got, f"gradient_vs_distance on {name}", dtype=torch.float64)
            expect_shape(t, (n,), f"gradient_vs_distance on {name}",
                         hint="wanted one norm per input position, shape (n,).")
            if torch.allclose(t, want.flip(0), atol=1e-9) and not torch.allclose(want, want.flip(0)):
                fail("your norms come out in reverse: entry j should belong to input position j "
                     "(the caller flips them to get distances).")
            x_req = x.clone().requires_grad_(True)
            (g_sum,) = torch.autograd.grad(f(x_req)[0, -1].sum(), x_req)
            if torch.allclose(t, g_sum[0].norm(dim=-1), atol=1e-9):
                fail("you took the gradient of the SUM of the last output's coordinates; the measure is the "
                     "norm of the whole Jacobian block: one backward pass per output coordinate, then add "
                     "the squared gradients (or use torch.autograd.functional.jacobian).")
            expect_close(t, want, f"gradient_vs_distance on {name}", atol=1e-8, rtol=1e-6,
                         hint="g[j] = sqrt(sum over output coordinates i and features of (d out[0, -1, i] / d x[0, j])²).")
    passed("gradient_vs_distance: the Jacobian norm of the last output for every input position.")


def memory_numbers(fn) -> None:
    """Exercise 4: memory_numbers(n, d, num_layers) -> (rnn_numbers, attention_numbers)."""
    for n, d, layers in [(1, 1, 1), (16, 32, 1), (1000, 64, 2), (4096, 4096, 32)]:
        got = call(fn, n, d, layers, name="memory_numbers")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"memory_numbers should return a pair (rnn_numbers, attention_numbers), got {type(got).__name__}.")
        try:
            rnn, attn = (int(v) for v in got)
        except (TypeError, ValueError):
            fail(f"memory_numbers should return two whole numbers, got {got!r}.")
        if rnn != d * layers:
            if rnn == d:
                fail("the RNN keeps one state of d numbers per layer: multiply by num_layers.")
            fail(f"for d={d}, num_layers={layers} the RNN keeps {d * layers} numbers (d per layer), you said {rnn}; "
                 "it does not depend on n.")
        if attn != 2 * n * d * layers:
            if attn == n * d * layers:
                fail("attention keeps a key AND a value for every position: 2 · n · d per layer.")
            fail(f"for n={n}, d={d}, num_layers={layers} attention keeps 2·n·d·layers = {2 * n * d * layers} "
                 f"numbers, you said {attn}.")
    passed("memory_numbers: d per layer for the RNN, 2·n·d per layer for attention's keys and values.")
