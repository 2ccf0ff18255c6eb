"""Chapter 09's FLOP accounting: FlopCounterMode on a real layer agrees with the closed form."""

import pytest
import torch

from course_lib.cost import (
    WIDTHS,
    Layer,
    attention_share,
    count_flops,
    crossover_from_counts,
    crossover_length,
    layer_flops,
    time_parts,
)


@pytest.mark.parametrize("n,d,h,d_mlp", [(128, 64, 4, None), (1000, 96, 3, 200),
                                         (4096, 768, 12, None), (131072, 4096, 32, None)])
def test_counted_equals_closed_form(n, d, h, d_mlp):
    counted, closed = count_flops(n, d, h, d_mlp), layer_flops(n, d, d_mlp)
    assert counted["total"] == closed["total"]
    assert counted["scores+blend"] == closed["scores"] + closed["blend"] == 4 * n * n * d
    for part in ("qkv", "out", "mlp"):
        assert counted[part] == closed[part]
    assert attention_share(counted) == pytest.approx(n / (n + 2 * d + (d_mlp or 4 * d)))


def test_a_causal_kernel_halves_the_grid():
    dense, causal = layer_flops(1000, 96), layer_flops(1000, 96, causal=True)
    assert 2 * causal["scores"] == dense["scores"] and 2 * causal["blend"] == dense["blend"]
    assert dense["total"] - causal["total"] == 2 * 1000 * 1000 * 96
    assert attention_share(causal) == pytest.approx(1000 / (1000 + 12 * 96))
    # the essay's "at a hundred thousand tokens": a 7B-wide layer, dense 80%, causal 67%
    assert attention_share(layer_flops(100_000, 4096)) == pytest.approx(0.8027, abs=1e-4)
    assert attention_share(layer_flops(100_000, 4096, causal=True)) == pytest.approx(0.6705,
                                                                                     abs=1e-4)


def test_counting_a_real_cpu_layer_gives_the_same_numbers():
    cpu = count_flops(64, 32, 2, device="cpu")
    assert cpu == count_flops(64, 32, 2)  # meta: same dispatch, same FLOPs


def test_crossover():
    for w in WIDTHS.values():
        n = crossover_from_counts(**w)
        assert n == crossover_length(w["d_model"]) == 6 * w["d_model"]
        before, at = count_flops(n - 1, **w), count_flops(n, **w)
        assert attention_share(at) >= 0.5 > attention_share(before)
    assert crossover_length(100, d_mlp=50) == 250


def test_layer_runs_and_time_parts_reports_shares():
    layer = Layer(16, 2)
    assert layer(torch.randn(2, 5, 16)).shape == (2, 5, 16)
    rows = time_parts([16, 32], d_model=16, num_heads=2, repeats=3)
    assert [r["n"] for r in rows] == [16, 32]
    assert all(0 < r["share"] < 1 and r["attention"] > 0 for r in rows)
    for r in rows:
        for part in ("projections", "mlp", "attention"):
            t = r["timings"][part]
            assert t.repeats == 3 and t.low <= t.median == r[part] <= t.high
        total = r["projections"] + r["mlp"] + r["attention"]
        assert r["share"] == pytest.approx(r["attention"] / total)
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        time_parts([16], d_model=16, num_heads=2, repeats=0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
        layer_flops(0, 64)
    with pytest.raises(ValueError, match="d_mlp must be a positive integer"):
        crossover_length(64, d_mlp=-1)


def test_bench_rows_growth_and_crossover(tmp_path, capsys):
    from course_lib.cost import bench

    rows = bench.measure(bench.window_methods(window=8, block_size=16), [64, 128], window=8,
                         repeats=1)
    assert [(r["n"], r["method"]) for r in rows] == [(64, "tiled (window 8)"),
                                                     (64, "SDPA + dense mask"),
                                                     (128, "tiled (window 8)"),
                                                     (128, "SDPA + dense mask")]
    assert all(r["time_ms"] > 0 and r["peak_mib"] >= 0 for r in rows)
    for r in rows:
        assert r["time_min_ms"] <= r["time_ms"] <= r["time_max_ms"]
        assert r["us_per_token"] == pytest.approx(1e3 * r["time_ms"] / r["n"])
    made = [{"n": n, "method": m, "time_ms": t} for n, m, t in
            [(1, "a", 1.0), (2, "a", 2.0), (4, "a", 4.0), (1, "b", 0.5), (2, "b", 2.0),
             (4, "b", 8.0)]]
    assert bench.growth_per_doubling(made, "a") == pytest.approx(2.0)
    assert bench.growth_per_doubling(made, "b") == pytest.approx(4.0)
    assert bench.crossover(made, "a", "b") == 4 and bench.crossover(made, "b", "a") is None
    assert bench.main(["--sizes", "32", "64", "--repeats", "1", "--csv",
                       str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert "per doubling of n" in out and (tmp_path / "c.csv").exists()
