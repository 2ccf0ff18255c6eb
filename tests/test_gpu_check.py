"""The one-shot GPU check (tools/gpu_check.sh -> course_lib.flash.gpu_check): its dry run on a CPU
walks the whole flow, and its summary judges the targets from the rows it is given."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.flash import gpu_check

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed (it ships for Linux only)")
def test_dry_run_walks_every_step_and_writes_the_summary(tmp_path):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-m", "course_lib.flash.gpu_check", "--dry-run",
                           "--out", str(tmp_path), "--pytest-timeout", "240"],
                          capture_output=True, text=True, timeout=400, cwd=ROOT, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    steps = {r["step"] for r in rows}
    assert {"machine", "sdpa_choice", "matmul", "correctness", "config_check", "time",
            "pytest"} <= steps
    assert {r["kernel"] for r in rows if r["step"] == "config_check"} == {"fwd", "dkdv", "dq"}
    timed = {(r["provider"], r["mode"]) for r in rows if r["step"] == "time"}
    assert {("flash", "fwd"), ("flash", "bwd"), ("sdpa", "fwd"), ("sdpa", "bwd")} <= timed
    # no cuDNN on a CPU: the pinned run fails, is recorded, and the check goes on
    assert any(r["step"] == "error" and "CUDNN" in r["what"] for r in rows)
    assert [r["returncode"] for r in rows if r["step"] == "pytest"] == [0]
    summary = (tmp_path / "summary.md").read_text()
    for heading in ("machine:", "## bf16 correctness", "Every table entry forced", "## TFLOP/s",
                    "## errors", "kernel tests ("):
        assert heading in summary, heading


def _time(provider, mode, n, tflops):
    return {"step": "time", "provider": provider, "d": 64, "causal": False, "n": n,
            "mode": mode, "tflops": tflops, "first_call_s": 1.0}


def test_summary_judges_the_targets_against_flashattention2():
    rows = [_time("flash", "fwd", 4096, 300.0), _time("sdpa FLASH_ATTENTION", "fwd", 4096, 310.0),
            _time("flash", "bwd", 4096, 200.0), _time("sdpa FLASH_ATTENTION", "bwd", 4096, 240.0),
            _time("flash", "fwd", 2048, 100.0), _time("sdpa FLASH_ATTENTION", "fwd", 2048, 300.0)]
    text = gpu_check.summary(rows, gpu_check.Plan.gpu(), notes=["a note"])
    lines = {tuple(c.strip() for c in line.split("|")[1:5]): line for line in text.splitlines()
             if line.startswith("| 64 |")}
    assert "0.97 | >= 1.0: missed" in lines[("64", "False", "4096", "fwd")]
    assert "0.83 | >= 0.8: met" in lines[("64", "False", "4096", "bwd")]
    assert "| - |" in lines[("64", "False", "2048", "fwd")]  # targets start at n = 4096
    assert "- a note" in text
