"""Chapter 06's serial-vs-parallel measurement: the FLOP formulas are what torch counts, and the
timing rows carry what the lecture prints."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from course_lib.parallel import attention_flops, rnn_flops, serial_vs_parallel


@pytest.mark.parametrize("n,d,batch", [(5, 8, 1), (17, 16, 3)])
def test_flop_formulas_match_torchs_counter(n, d, batch):
    x, W_xh, W_hh = torch.randn(batch, n, d), torch.randn(d, d), torch.randn(d, d)
    with FlopCounterMode(display=False) as rnn_counter:
        h = torch.zeros(batch, d)
        for t in range(n):
            h = torch.tanh(x[:, t] @ W_xh.T + h @ W_hh.T)
    with FlopCounterMode(display=False) as attention_counter:
        torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(d), dim=-1) @ x
    assert rnn_counter.get_total_flops() == rnn_flops(n, d, batch)
    assert attention_counter.get_total_flops() == attention_flops(n, d, batch)


def test_rows_carry_times_work_and_waiting():
    rows = serial_vs_parallel(ns=(4, 12), d=8, batch=2, repeats=1)
    assert [r["n"] for r in rows] == [4, 12]
    for r in rows:
        assert r["rnn_ms"] > 0 and r["rnn_one_call_ms"] > 0 and r["attention_ms"] > 0
        for name in ("rnn", "rnn_one_call", "attention"):
            t = r[f"{name}_timing"]
            assert t.repeats == 1 and t.low <= t.median <= t.high
            assert r[f"{name}_ms"] == 1e3 * t.median
        assert r["rnn_waiting_steps"] == r["n"] and r["attention_waiting_steps"] == 3
        assert r["rnn_flops"] == 4 * 2 * r["n"] * 8 * 8
        assert r["grid_bytes"] == 4 * 2 * r["n"] ** 2


@pytest.mark.parametrize("kwargs,match", [({"ns": ()}, "ns should be positive"),
                                          ({"ns": (0,)}, "ns should be positive"),
                                          ({"d": 0}, "d, batch and repeats should be positive")])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        serial_vs_parallel(**kwargs)
