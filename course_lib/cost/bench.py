"""Benchmark: what a sliding window and linear attention buy back, in time and memory, on a CPU.

    python -m course_lib.cost.bench                 # both tables, n = 1024 .. 16384
    python -m course_lib.cost.bench --quick         # small sizes (a smoke test)

window: causal attention restricted to the last W keys, one head, d = 64, float32.
  tiled (window W)   chapter 08's tiled loop told the window: key blocks entirely outside it are
                     never computed, so the work per query is ~W keys whatever n is;
  SDPA + dense mask  torch's scaled_dot_product_attention given the same window as an (n, n)
                     boolean mask: it still scores all n² pairs, then throws most away.
linear: causal attention by softmax (SDPA, is_causal), by linear attention's parallel form (the
  masked n x n grid of φ(q)·φ(k), measured up to n = 4096 only: at 8 heads its grid outgrows
  memory) and by its recurrent form (a (d, d_v) state per head, one token a step), 8 heads: the
  loop's cost per step hardly depends on the number of heads, softmax's grows with it.

Each row: n, method, time_ms (the median of a few runs, the methods taking turns), time_min_ms
and time_max_ms (the fastest and slowest run), us_per_token (the median time divided by n: flat
where the cost is linear in n), peak_mib (torch's profiler: the most memory allocated at once
during the call, inputs excluded). The summary gives
each method's growth factor per doubling of n, and where the recurrent form overtakes softmax.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.flash import tiled_attention
from course_lib.flash.bench import environment_line, format_table, save_csv
from course_lib.linear_attention import linear_attention, linear_attention_recurrent
from course_lib.masks import sliding_window_mask
from course_lib.measure import Timing, peak_bytes, set_threads, time_call

SIZES = (1024, 2048, 4096, 8192, 16384)
QUICK_SIZES = (256, 512, 1024, 2048)
COLUMNS = ["n", "method", "time_ms", "time_min_ms", "time_max_ms", "us_per_token", "peak_mib"]
LINEAR_LIMITS = {"linear, parallel": 4096}  # its (8, n, n) grid: 512 MiB at n = 4096
MiB = 2 ** 20


def window_methods(window: int, block_size: int) -> dict:
    """name -> f(q, k, v, mask): two ways to compute the same sliding-window attention."""
    return {f"tiled (window {window})":
            lambda q, k, v, mask: tiled_attention(q, k, v, block_size=block_size, window=window)[0],
            "SDPA + dense mask":
            lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)}


def linear_methods() -> dict:
    """name -> f(q, k, v, mask): causal softmax attention and the two forms of linear attention."""
    return {"softmax (SDPA)": lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v,
                                                                                   is_causal=True),
            "linear, parallel": lambda q, k, v, mask: linear_attention(q, k, v, causal=True),
            "linear, recurrent": lambda q, k, v, mask: linear_attention_recurrent(q, k, v)}


def measure(methods: dict, sizes, d: int = 64, heads: int = 1, window: int | None = None,
            repeats: int = 5, memory: bool = True, seed: int = 0, max_seconds: float = 2.0,
            limits: dict | None = None) -> list[dict]:
    """Time (and peak memory) of every method at every n: one row per (n, method).

    q, k, v: (1, heads, n, d) float32. The methods take turns within each repeat, so a busy
    machine slows them alike; once a call takes more than `max_seconds` that method is not
    repeated again at that n. limits: method name -> the largest n to run it at.
    """
    torch.manual_seed(seed)
    limits = limits or {}
    rows = []
    for n in sizes:
        q, k, v = (torch.randn(1, heads, n, d) for _ in range(3))  # (B=1, H, n, d)
        mask = sliding_window_mask(n, window) if window else None
        todo = {name: fn for name, fn in methods.items() if n <= limits.get(name, n)}
        for fn in todo.values():                                     # warm-up
            fn(q[..., :64, :], k[..., :64, :], v[..., :64, :],
               None if mask is None else mask[:64, :64])
        samples = {name: [] for name in todo}
        for _ in range(repeats):
            for name, fn in todo.items():
                if samples[name] and min(samples[name]) > max_seconds:
                    continue
                samples[name].append(time_call(lambda: fn(q, k, v, mask),  # noqa: B023
                                               repeats=1, warmup=0).median)
        for name, fn in todo.items():
            t = Timing.of(samples[name])
            peak = peak_bytes(lambda: fn(q, k, v, mask)) if memory else -1  # noqa: B023
            rows.append({"n": int(n), "method": name, "time_ms": 1e3 * t.median,
                         "time_min_ms": 1e3 * t.low, "time_max_ms": 1e3 * t.high,
                         "us_per_token": 1e6 * t.median / n,
                         "peak_mib": peak / MiB if peak >= 0 else math.nan})
    return rows


def growth_per_doubling(rows: list[dict], method: str, what: str = "time_ms") -> float:
    """Geometric mean of value(2n) / value(n) over the measured doublings of one method."""
    values = {r["n"]: r[what] for r in rows if r["method"] == method}
    ratios = [values[2 * n] / values[n] for n in values if 2 * n in values and values[n] > 0]
    if not ratios:
        raise ValueError(f"no doubling of n was measured for {method!r}")
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def crossover(rows: list[dict], cheap: str, costly: str) -> int | None:
    """The smallest measured n from which `cheap` is faster than `costly` at every larger n."""
    t = {(r["n"], r["method"]): r["time_ms"] for r in rows}
    ns = sorted(n for n in {r["n"] for r in rows} if (n, cheap) in t and (n, costly) in t)
    for i, n in enumerate(ns):
        if all(t[(m, cheap)] < t[(m, costly)] for m in ns[i:]):
            return n
    return None


def summary(window_rows: list[dict], linear_rows: list[dict]) -> str:
    lines = []
    for name in dict.fromkeys(r["method"] for r in window_rows):
        lines.append(f"window: {name:22s} time x{growth_per_doubling(window_rows, name):.2f}, "
                     f"peak memory x{growth_per_doubling(window_rows, name, 'peak_mib'):.2f} "
                     "per doubling of n")
    for name in dict.fromkeys(r["method"] for r in linear_rows):
        lines.append(f"linear: {name:22s} time x{growth_per_doubling(linear_rows, name):.2f} "
                     "per doubling of n")
    n = crossover(linear_rows, "linear, recurrent", "softmax (SDPA)")
    lines.append("linear: the recurrent form is faster than softmax attention from n = "
                 f"{n} on" if n else "linear: the recurrent form is not faster than softmax "
                 "attention at any measured n (measure longer sequences)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.cost.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="sequence lengths n")
    parser.add_argument("--window", type=int, default=256, help="the sliding window W")
    parser.add_argument("--block-size", type=int, default=128, help="tiled_attention's block")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per method")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--csv", type=Path, default=Path("bench-results") / "cost_cpu.csv")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    print(environment_line("cpu"))
    window_rows = measure(window_methods(args.window, args.block_size), sizes,
                          window=args.window, repeats=args.repeats)
    print(f"sliding window W = {args.window}, block {args.block_size}, one head, d = 64, fp32")
    print(format_table(window_rows, COLUMNS, markdown=args.markdown))
    linear_rows = measure(linear_methods(), sizes, heads=8, repeats=args.repeats, memory=False,
                          limits=LINEAR_LIMITS)
    print("causal softmax vs linear attention, 8 heads, d = d_v = 64, fp32")
    print(format_table(linear_rows, COLUMNS[:-1], markdown=args.markdown))
    print(summary(window_rows, linear_rows))
    for r in window_rows:
        r["table"] = "window"
    for r in linear_rows:
        r["table"] = "linear"
    print(f"saved {save_csv(window_rows + linear_rows, args.csv)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
