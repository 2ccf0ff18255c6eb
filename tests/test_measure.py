"""course_lib.measure: the one timer (median and spread) and the machine-independent agreement."""

import pytest
import torch

from course_lib.measure import ROUNDING, Timing, agreement, best_time, time_call


def test_time_call_reports_median_and_spread_of_its_runs():
    calls = []
    t = time_call(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and t.repeats == 5
    assert 0 <= t.low <= t.median <= t.high < 1


def test_timing_of_samples_is_their_median_min_and_max():
    t = Timing.of([0.003, 0.001, 0.002, 0.010, 0.002])
    assert (t.median, t.low, t.high, t.repeats) == (0.002, 0.001, 0.010, 5)
    assert t.ms() == "2.00 ms (1.00-10.00)"
    with pytest.raises(ValueError, match="at least one"):
        Timing.of([])


def test_max_seconds_stops_repeating_but_one_run_always_counts():
    t = time_call(lambda: sum(range(10_000)), repeats=100, warmup=0, max_seconds=0.0)
    assert t.repeats == 1


def test_best_time_is_the_fastest_run():
    assert 0 < best_time(lambda: sum(range(1000)), repeats=2) < 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_agreement_prints_a_bound_within_rounding(dtype):
    a = torch.randn(4, 5, dtype=torch.float64)
    noise = torch.finfo(dtype).eps * 10
    text = agreement((a + noise).to(dtype), a.to(dtype))
    bound = f"{ROUNDING[dtype]:.0e}".replace("e-0", "e-")
    assert text == f"agrees to rounding (max |diff| < {bound})"


def test_agreement_prints_the_difference_when_it_is_more_than_rounding():
    a = torch.zeros(3, dtype=torch.float64)
    assert agreement(a + 0.25, a) == "DIFFERS: max |diff| = 2.5e-01, more than rounding (1e-13)"
    assert agreement(a + 0.25, a, tol=1.0) == "agrees to rounding (max |diff| < 1e+0)"
    assert agreement(a * float("nan"), a) == "DIFFERS: NaN in the difference"


def test_agreement_refuses_different_shapes():
    with pytest.raises(ValueError, match=r"got has shape \(3,\) but want has shape \(4,\)"):
        agreement(torch.zeros(3), torch.zeros(4))
