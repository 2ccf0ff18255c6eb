"""The GPU check's record: results.jsonl, appended one row at a time by each stage's process
(a killed stage keeps what it wrote), and summary.md built from it (see `course_tools.gpu.check`).

No CUDA here: the orchestrator writes the summary even when every stage crashed.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from course_tools.gpu.plan import PROVIDERS

RESULTS = "results.jsonl"
TRUNCATION = "interpreter bf16 truncation"


class Recorder:
    """Appends rows to OUT/results.jsonl, each flushed and synced at once; every row names the
    stage that wrote it."""

    def __init__(self, out: Path, stage: str, echo: bool = True):
        self.out, self.stage, self.echo = Path(out), stage, echo
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []

    def add(self, step: str, **row) -> dict:
        row = {"stage": self.stage, "step": step, **row}
        self.rows.append(row)
        with open(self.out / RESULTS, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.echo:
            print(_short(row), flush=True)
        return row


def read_rows(out: Path) -> list[dict]:
    path = Path(out) / RESULTS
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill: skip it
            continue
    return rows


def drop_stages(out: Path, stages) -> None:
    """Forget the rows of `stages` (before re-running them with --stages)."""
    keep = [r for r in read_rows(out) if r.get("stage") not in set(stages)]
    (Path(out) / RESULTS).write_text("".join(json.dumps(r, default=str) + "\n" for r in keep))


def verdict(flash_err: dict, sdpa_err: dict, truncation: dict | None = None) -> str:
    """'yes' when every error is at most 2x SDPA-bf16's (+1e-5). In Triton's interpreter the
    kernel's fp32 -> bf16 stores truncate where a GPU rounds to nearest; `truncation` is, per
    output, the error truncation alone puts on the fp32 reference, and a row within 2x SDPA's
    error plus that is labelled as the interpreter's doing, not failed. Otherwise 'NO'."""
    keys = [k for k in flash_err if k in sdpa_err]
    if all(flash_err[k] <= 2 * sdpa_err[k] + 1e-5 for k in keys):
        return "yes"
    if truncation and all(flash_err[k] <= 2 * sdpa_err[k] + truncation[k] + 1e-5 for k in keys):
        return TRUNCATION
    return "NO"


def _short(row: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def _rate(x: float) -> str:
    return f"{x:.1f}" if x >= 1 or math.isnan(x) else f"{x:.2g}"


def _stage_table(rows) -> list[str]:
    runs = [r for r in rows if r["step"] == "stage"]
    if not runs:
        return []
    lines = ["## stages", "", "| stage | status | seconds | estimate s | limit s | note |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        guess = "-" if r["estimate_s"] is None else f"{r['estimate_s']:.0f}"
        lines.append(f"| {r['stage']} | {r['status']} | {r['seconds']:.1f} | {guess} | "
                     f"{r['limit_s']:.0f} | {r.get('note', '')} |")
    total = sum(r["seconds"] for r in runs)
    guesses = [r["estimate_s"] for r in runs if r["estimate_s"] is not None]
    estimate = f" (estimate {sum(guesses):.0f} s)" if guesses else ""
    return lines + ["", f"Stages took {total:.0f} s in all{estimate}.", ""]


def _correctness(rows) -> list[str]:
    checks = [r for r in rows if r["step"] == "correctness"]
    if not checks:
        return []
    lines = ["## bf16 correctness", "", "Max abs error against an fp32 reference, flash / SDPA "
             "bf16; pass: flash <= 2 x SDPA (+1e-5) for every output it makes (the TMA forward: "
             "out only).", "", "| d | causal | n | kernel | out flash / sdpa | dq | dk | dv | "
             "pass | first call s (compile + autotune) |", "|---" * 10 + "|"]
    for r in checks:
        cells = [f"{r['flash_err'][k]:.2e} / {r['sdpa_err'][k]:.2e}" if k in r["flash_err"]
                 else "-" for k in ("out", "dq", "dk", "dv")]
        lines.append(f"| {r['d']} | {r['causal']} | {r['n']} | {r['kernel']} | "
                     + " | ".join(cells) + f" | {r['verdict']} | {r['first_call_s']:.1f} |")
    return lines + [""]


def _configs(rows) -> list[str]:
    configs = [r for r in rows if r["step"] == "config_check"]
    if not configs:
        return []
    bad = [r for r in configs if r["verdict"] != "yes"]
    labelled = sum(r["verdict"] == TRUNCATION for r in bad)
    lines = [f"Every table entry forced (bf16): {len(configs) - len(bad)} of {len(configs)} "
             "within 2x SDPA's error" + (f", {labelled} more within it plus the {TRUNCATION}"
                                          if labelled else "") + (":" if bad else "."), ""]
    lines += [f"- {r['kernel']}{' tma' if r.get('tma') else ''} {tuple(r['config'])} d={r['d']} "
              f"causal={r['causal']} n={r['n']}: {r['verdict']}, {r['flash_err']} vs SDPA "
              f"{r['sdpa_err']}" for r in bad]
    return lines + ([""] if bad else [])


def _times(rows, batch, heads) -> list[str]:
    times = [r for r in rows if r["step"] == "time"]
    if not times:
        return []
    timer = times[0].get("timer", "")
    lines = [f"## TFLOP/s (bf16, batch x heads = {batch} x {heads}; {timer})", "",
             "| d | causal | n | mode | " + " | ".join(PROVIDERS)
             + " | flash / FA2 | target | tma / cp.async | flash first call s |",
             "|---|---|---|---|" + "---|" * len(PROVIDERS) + "---|---|---|---|"]
    groups: dict = {}
    for r in times:
        groups.setdefault((r["d"], r["causal"], r["n"], r["mode"]), {})[r["provider"]] = r
    for (d, causal, n, mode), got in groups.items():
        rate = {p: got[p]["tflops"] if p in got else math.nan for p in PROVIDERS}
        ratio = rate["flash"] / rate["sdpa FLASH_ATTENTION"]
        want = 1.0 if mode == "fwd" else 0.8
        target = "-" if n < 4096 or math.isnan(ratio) else \
            (f">= {want}: met" if ratio >= want else f">= {want}: missed")
        tma = f"{rate['flash tma'] / rate['flash']:.2f}" if mode == "fwd" else "-"
        first = got.get("flash", {}).get("first_call_s", math.nan)
        lines.append(f"| {d} | {causal} | {n} | {mode} | "
                     + " | ".join(_rate(rate[p]) for p in PROVIDERS)
                     + f" | {ratio:.2f} | {target} | {tma} | {first:.1f} |")
    return lines + [""]


def summary(rows: list[dict], notes: list[str]) -> str:
    """The markdown summary of `rows`."""
    lines = ["# GPU check", ""]
    for row in rows:
        if row["step"] == "machine":
            lines += ["machine: " + ", ".join(f"{k} {v}" for k, v in row.items()
                                              if k not in ("step", "stage")), ""]
    choices = [f"d={r['d']} causal={r['causal']}: {r['backend']}" for r in rows
               if r["step"] == "sdpa_choice"]
    if choices:
        lines += ["SDPA's default backend (bf16): " + "; ".join(choices), ""]
    for r in rows:
        if r["step"] == "matmul":
            lines += [f"bf16 matmul {r['n']}^3: {_rate(r['tflops'])} TFLOP/s ({r['timer']})", ""]
    compiled = [r for r in rows if r["step"] == "precompiled"]
    if compiled:
        r = compiled[-1]
        lines += [f"Precompiled {r['compiles']} kernel variants on {r['workers']} processes in "
                  f"{r['seconds']:.1f} s ({r['failed']} failed).", ""]
    plan = next((r for r in rows if r["step"] == "plan"), {"batch": "?", "heads": "?"})
    lines += _stage_table(rows) + _correctness(rows) + _configs(rows)
    lines += _times(rows, plan["batch"], plan["heads"])
    for r in rows:
        if r["step"] == "pytest":
            lines += [f"Kernel tests (`{r['cmd']}`): {r['last_line']} (exit {r['returncode']}, "
                      f"{r['seconds']:.0f} s).", ""]
    errors = [r for r in rows if r["step"] == "error"]
    if errors:
        lines += ["## errors", ""] + [f"- {r['stage']}: {r['what']}: {r['error']}"
                                      for r in errors] + [""]
    tuned = [r for r in rows if r["step"] == "autotune"]
    if tuned:
        lines += ["## the autotuner's picks", ""] + [
            f"- {r['kernel']} key {r['key']}: {r['config']}" for r in tuned] + [""]
    lines += ["## notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)
