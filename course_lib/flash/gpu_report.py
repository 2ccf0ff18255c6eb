"""The GPU check's record: results.jsonl written line by line, and summary.md built from it
(see `course_lib.flash.gpu_check`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

PROVIDERS = ("flash", "sdpa", "sdpa FLASH_ATTENTION", "sdpa CUDNN_ATTENTION")


class Recorder:
    """results.jsonl, one line per result, flushed at once: a killed run keeps what it made."""

    def __init__(self, out: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []
        self.file = open(out / "results.jsonl", "w")

    def add(self, step: str, **row) -> dict:
        row = {"step": step, **row}
        self.rows.append(row)
        self.file.write(json.dumps(row, default=str) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        print(_short(row), flush=True)
        return row


def _short(row: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def _rate(x: float) -> str:
    return f"{x:.1f}" if x >= 1 or math.isnan(x) else f"{x:.2g}"


def summary(rows: list[dict], plan, notes: list[str]) -> str:
    """The markdown summary of `rows`; `plan` gives the batch and heads timed."""
    lines = ["# GPU check", ""]
    for row in rows:
        if row["step"] == "machine":
            lines += ["machine: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "step"),
                      ""]
    choices = [f"d={r['d']} causal={r['causal']}: {r['backend']}" for r in rows
               if r["step"] == "sdpa_choice"]
    if choices:
        lines += ["SDPA's default backend (bf16): " + "; ".join(choices), ""]
    for r in rows:
        if r["step"] == "matmul":
            lines += [f"bf16 matmul {r['n']}^3: {_rate(r['tflops'])} TFLOP/s", ""]
    checks = [r for r in rows if r["step"] == "correctness"]
    if checks:
        lines += ["## bf16 correctness", "", "Max abs error against an fp32 reference, "
                  "flash / SDPA bf16; pass: flash <= 2 x SDPA (+1e-5) for all four.", "",
                  "| d | causal | n | out flash / sdpa | dq | dk | dv | pass "
                  "| flash first call s (compile + autotune) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in checks:
            cells = [f"{r['flash_err'][k]:.2e} / {r['sdpa_err'][k]:.2e}"
                     for k in ("out", "dq", "dk", "dv")]
            lines.append(f"| {r['d']} | {r['causal']} | {r['n']} | " + " | ".join(cells)
                         + f" | {'yes' if r['passed'] else 'NO'} | {r['flash_first_call_s']:.1f} |")
        lines.append("")
    configs = [r for r in rows if r["step"] == "config_check"]
    if configs:
        bad = [f"{r['kernel']} {tuple(r['config'])} d={r['d']} causal={r['causal']} n={r['n']}: "
               f"{r['flash_err']} vs SDPA {r['sdpa_err']}" for r in configs if not r["passed"]]
        lines += [f"Every table entry forced (bf16): {len(configs) - len(bad)} of {len(configs)} "
                  "within 2x SDPA's error" + (":" if bad else "."), ""]
        lines += [f"- {b}" for b in bad] + ([""] if bad else [])
    times = [r for r in rows if r["step"] == "time"]
    if times:
        lines += ["## TFLOP/s (bf16, batch x heads = "
                  f"{plan.batch} x {plan.heads}; first call of the kernel = compile + autotune)",
                  "", "| d | causal | n | mode | " + " | ".join(PROVIDERS)
                  + " | flash / FA2 | target | flash first call s |",
                  "|---|---|---|---|" + "---|" * len(PROVIDERS) + "---|---|---|"]
        groups = {}
        for r in times:
            groups.setdefault((r["d"], r["causal"], r["n"], r["mode"]), {})[r["provider"]] = r
        for (d, causal, n, mode), got in groups.items():
            rate = {p: got[p]["tflops"] if p in got else math.nan for p in PROVIDERS}
            ratio = rate["flash"] / rate["sdpa FLASH_ATTENTION"]
            want = 1.0 if mode == "fwd" else 0.8
            target = "-" if n < 4096 or math.isnan(ratio) else \
                (f">= {want}: met" if ratio >= want else f">= {want}: missed")
            first = got.get("flash", {}).get("first_call_s", math.nan)
            lines.append(f"| {d} | {causal} | {n} | {mode} | "
                         + " | ".join(_rate(rate[p]) for p in PROVIDERS)
                         + f" | {ratio:.2f} | {target} | {first:.1f} |")
        lines.append("")
    errors = [r for r in rows if r["step"] == "error"]
    if errors:
        lines += ["## errors", ""] + [f"- {r['what']}: {r['error']}" for r in errors] + [""]
    lines += ["## notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)
