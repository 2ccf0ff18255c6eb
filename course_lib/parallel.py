"""Serial versus parallel, measured honestly on a CPU (chapter 06).

Three timings per sequence length n, for a batch of B sequences of width d:

* `rnn`: the RNN's n updates h_t = tanh(x_t W_xhᵀ + h_{t-1} W_hhᵀ), one after another, because
  each needs the state the previous one produced (4·B·n·d² FLOPs);
* `rnn_one_call`: exactly the same n updates, with the same numbers out, computed in one call
  from the states the loop produced: the same work with nothing left to wait for;
* `attention`: one layer of attention over the n positions, softmax(X Xᵀ/√d) X
  (4·B·n²·d FLOPs: the score grid and the blend).

The first two differ only in waiting; the last two differ in the amount of work as well.
"""

from __future__ import annotations

import math

import torch

from course_lib.measure import time_call


def rnn_flops(n: int, d: int, batch: int) -> int:
    """Multiply-adds x2 of n updates: two (B, d) @ (d, d) products each."""
    return 4 * batch * n * d * d


def attention_flops(n: int, d: int, batch: int) -> int:
    """Multiply-adds x2 of the score grid (B, n, n) and the blend of the values."""
    return 4 * batch * n * n * d


@torch.no_grad()
def serial_vs_parallel(ns=(64, 128, 256, 512, 1024), d: int = 64, batch: int = 4,
                       repeats: int = 5, seed: int = 0) -> list[dict]:
    """Median wall times (ms) over `repeats` runs of the three computations above, per length n.

    Runs with torch's current thread count (all cores unless changed). Each row carries, per
    computation, the median (`rnn_ms`, `rnn_one_call_ms`, `attention_ms`) and the whole
    `course_lib.measure.Timing` (`rnn_timing`, ...: median, fastest, slowest run), and also the
    FLOPs, the number of steps that must wait for each other, and the bytes of one score grid.
    Checks on the way that the one-call RNN gives the loop's numbers.
    """
    if not ns or any(not isinstance(n, int) or n < 1 for n in ns):
        raise ValueError(f"ns should be positive sequence lengths, got {ns!r}")
    if d < 1 or batch < 1 or repeats < 1:
        raise ValueError(f"d, batch and repeats should be positive, got d={d}, batch={batch}, "
                         f"repeats={repeats}")
    gen = torch.Generator().manual_seed(seed)
    W_xh = torch.randn(d, d, generator=gen) / math.sqrt(d)   # (d, d)
    W_hh = torch.randn(d, d, generator=gen) / math.sqrt(d)   # (d, d)

    def rnn_loop(x):                                          # x (B, n, d) -> states (B, n, d)
        h, states = x.new_zeros(x.shape[0], d), []
        for t in range(x.shape[1]):                           # step t waits for step t-1
            h = torch.tanh(x[:, t] @ W_xh.T + h @ W_hh.T)
            states.append(h)
        return torch.stack(states, dim=1)

    def rnn_one_call(x, previous):                            # previous: h_{t-1} for every t
        return torch.tanh(x @ W_xh.T + previous @ W_hh.T)     # (B, n, d): all updates at once

    def attention(x):                                         # (B, n, d) -> (B, n, d)
        return torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(d), dim=-1) @ x

    rows = []
    for n in ns:
        x = torch.randn(batch, n, d, generator=gen)
        states = rnn_loop(x)
        previous = torch.cat([states.new_zeros(batch, 1, d), states[:, :-1]], dim=1)
        if not torch.allclose(rnn_one_call(x, previous), states, atol=1e-5):
            raise RuntimeError("the one-call RNN should reproduce the loop")  # pragma: no cover
        timings = {"rnn": time_call(lambda x=x: rnn_loop(x), repeats),
                   "rnn_one_call": time_call(lambda x=x, p=previous: rnn_one_call(x, p), repeats),
                   "attention": time_call(lambda x=x: attention(x), repeats)}
        rows.append({
            "n": n,
            **{f"{name}_ms": 1e3 * t.median for name, t in timings.items()},
            **{f"{name}_timing": t for name, t in timings.items()},
            "rnn_flops": rnn_flops(n, d, batch), "attention_flops": attention_flops(n, d, batch),
            "rnn_waiting_steps": n, "attention_waiting_steps": 3,  # scores, softmax, blend
            "grid_bytes": 4 * batch * n * n,
        })
    return rows
