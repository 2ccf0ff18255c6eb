"""The benchmark command runs on a CPU, prints its table and writes a CSV (tiny sizes here)."""

import csv
import subprocess
import sys

import pytest
import torch

from course_lib.flash import bench
from course_lib.measure import best_time, peak_bytes, set_threads, threads


def test_peak_bytes_sees_torch_allocations():
    assert peak_bytes(lambda: torch.empty(2 ** 20)) >= 4 * 2 ** 20          # 4 MiB of float32
    a = torch.ones(1000)
    assert peak_bytes(lambda: a.add_(1)) < 4000                              # in place: nothing new


def test_best_time_is_a_positive_number():
    assert 0 < best_time(lambda: sum(range(1000)), repeats=2) < 1


def test_best_time_calls_warmup_then_repeats():
    calls = []
    assert best_time(lambda: calls.append(1), repeats=4, warmup=2) >= 0
    assert len(calls) == 6


def test_threads_sets_the_count_inside_and_restores_it_after():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with threads(None):                      # None: leave torch's setting alone
        assert torch.get_num_threads() == before
    try:
        with threads(other):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.get_num_threads() == before  # restored on an error too
    assert set_threads(other) == before and torch.get_num_threads() == other
    set_threads(before)


def test_one_triton_detection():
    """course_lib.flash.triton_available is course_lib.env's, and it agrees with importlib."""
    import importlib.util

    import course_lib.env as env
    import course_lib.flash as flash

    assert flash.triton_available is env.triton_available
    assert env.triton_available() == (importlib.util.find_spec("triton") is not None)


def test_run_cpu_rows_and_summary():
    rows = bench.run_cpu(sizes=(64, 128), repeats=1, block_size=32, progress=False)
    assert [r["n"] for r in rows] == [64] * 3 + [128] * 3
    assert {r["method"] for r in rows} == {"naive", "tiled (block 32)", "torch SDPA"}
    naive = {r["n"]: r["peak_mib"] for r in rows if r["method"] == "naive"}
    assert naive[128] >= 2 * 128 * 128 * 4 / 2 ** 20                        # two n x n grids
    assert all(r["time_ms"] > 0 for r in rows)
    summary = bench.cpu_summary(rows)
    assert "tiled time / SDPA time" in summary and "naive peak / tiled peak" in summary
    table = bench.format_table(rows, bench.CPU_COLUMNS, markdown=True)
    assert table.splitlines()[0] == ("| n | method | time_ms | time_min_ms | time_max_ms | "
                                     "ns_per_score | peak_mib | grid_mib |")
    for r in rows:
        assert r["time_min_ms"] <= r["time_ms"] <= r["time_max_ms"]
        assert r["ns_per_score"] == pytest.approx(1e6 * r["time_ms"] / r["n"] ** 2)


def test_flop_count():
    assert bench.attention_flops(1, 1, 1024, 64, False, "fwd") == 4 * 1024 ** 2 * 64
    assert bench.attention_flops(2, 3, 1024, 64, True, "fwd") == 2 * 2 * 3 * 1024 ** 2 * 64
    assert bench.attention_flops(1, 1, 1024, 64, False, "bwd") == 2.5 * 4 * 1024 ** 2 * 64


def test_command_line_on_cpu_writes_csv(tmp_path):
    out = tmp_path / "cpu.csv"
    result = subprocess.run([sys.executable, "-m", "course_lib.flash.bench", "--device", "cpu",
                             "--sizes", "64", "128", "--repeats", "1", "--no-progress",
                             "--csv", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "torch SDPA" in result.stdout and "saved" in result.stdout
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and set(rows[0]) == {"n", "method", "time_ms", "time_min_ms",
                                               "time_max_ms", "ns_per_score", "peak_mib",
                                               "grid_mib"}


def test_gpu_summary_and_table_from_recorded_rows():
    """The GPU half cannot run here; its summary and table are checked on made-up rows."""
    rows = []
    for n in (1024, 4096):
        for mode in ("fwd", "bwd"):
            sdpa = 250.0 if mode == "fwd" else 400.0
            for provider, rate in (("flash (triton)", 300.0), ("torch SDPA", sdpa)):
                rows.append({"dtype": "bf16", "d": 64, "causal": False, "n": n, "mode": mode,
                             "provider": provider, "batch": 4, "heads": 32, "time_ms": 1.0,
                             "tflops": rate})
    summary = bench.gpu_summary(rows, matmul_rate=600.0)
    assert "fwd: flash / SDPA at n >= 4096: min 1.20x" in summary
    assert "(target >= 1.0x: met)" in summary
    assert "bwd: flash / SDPA at n >= 4096: min 0.75x" in summary and "NOT met" in summary
    assert "= 50% of it (target >= 55%: NOT met)" in summary
    table = bench.format_table(rows, bench.GPU_COLUMNS, markdown=True)
    assert "| bf16 | 64 | False | 4096 | bwd | torch SDPA |" in table
