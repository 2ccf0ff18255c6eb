"""The staged GPU check (tools/gpu_check.sh -> course_tools.gpu): its dry run on a CPU walks every
stage; a stage that crashes or runs past its limit is recorded, its processes are gone, and the
next stage still runs; the summary judges the targets from the rows it is given."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from course_tools.gpu import check, report
from course_tools.gpu.plan import DRY_LIMITS, LIMITS, STAGES, Plan, estimate

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed (it ships for Linux only)")
def test_dry_run_walks_every_stage(tmp_path):
    # Its speed is a measurement (docs/benchmarks.md), not asserted here: each stage's own dry
    # limit (DRY_LIMITS) already fails the run, as a "timeout" row, when a stage hangs.
    env = dict(os.environ, OUT=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    # The dry run stands in for a GPU, which the test command's second numeric setting never
    # reaches. On a CPU with AMX (AVX-512 BF16), torch 2.13's bf16 SDPA backward refuses to run
    # under ATEN_CPU_CAPABILITY=default ("pack_vnni2 is only supported when avx512 is
    # supported"), so SDPA's rows would be errors there and nowhere else.
    env.pop("ATEN_CPU_CAPABILITY", None)
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--dry-run"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    rows = report.read_rows(tmp_path)
    ran = {r["stage"]: r["status"] for r in rows if r["step"] == "stage"}
    assert ran == {name: "ok" for name in STAGES}
    steps = {r["step"] for r in rows}
    assert {"machine", "sdpa_choice", "matmul", "compiled", "precompiled", "correctness",
            "config_check", "time", "pytest"} <= steps
    assert {r["kernel"] for r in rows if r["step"] == "config_check"} == {"fwd", "dkdv", "dq"}
    assert any(r.get("tma") for r in rows if r["step"] == "config_check")
    timed = {(r["provider"], r["mode"]) for r in rows if r["step"] == "time"}
    assert {("flash", "fwd"), ("flash", "bwd"), ("flash tma", "fwd"), ("sdpa", "bwd")} <= timed
    # no cuDNN on a CPU: the pinned run fails, is recorded, and the stage goes on
    assert any(r["step"] == "error" and "CUDNN" in r["what"] for r in rows)
    # the interpreter's truncating bf16 stores are labelled, never a plain "NO"
    verdicts = {r["verdict"] for r in rows if r["step"] in ("correctness", "config_check")}
    assert verdicts <= {"yes", report.TRUNCATION}
    assert [r["returncode"] for r in rows if r["step"] == "pytest"] == [0]
    assert all(r["error"] is None for r in rows if r["step"] == "compiled")
    summary = (tmp_path / "summary.md").read_text()
    for heading in ("machine:", "## stages", "## bf16 correctness", "Every table entry forced",
                    "## TFLOP/s", "## errors", "Kernel tests (", "Precompiled"):
        assert heading in summary, heading
    assert "| NO |" not in summary


def _stage(name, code, limit):
    return check.Stage(name, [sys.executable, "-c", textwrap.dedent(code)], limit)


ROW = """
import sys
from course_tools.gpu.report import Recorder
Recorder(sys.argv[1] if len(sys.argv) > 1 else {out!r}, {name!r}).add("hello", n=1)
"""


HANG_LIMIT_S = 20


def test_a_stage_that_crashes_or_hangs_is_recorded_killed_and_the_next_still_runs(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    env = check.stage_env(dry_run=True)
    runner = check.Runner(tmp_path, env)
    crash = _stage("crash", ROW.format(out=str(tmp_path), name="crash") + "import os\nos.abort()\n",
                   30)
    # The worker starts first and the row follows: importing the recorder (torch, through
    # course_lib) takes seconds on a slow machine, and the limit must not cut it short.
    hang = _stage("hang", f"""
import subprocess, time
child = subprocess.Popen(["sleep", "120"])           # a worker of the stage
open({str(pid_file)!r}, "w").write(str(child.pid))
""" + ROW.format(out=str(tmp_path), name="hang") + "time.sleep(120)\n", HANG_LIMIT_S)
    after = _stage("after", ROW.format(out=str(tmp_path), name="after"), 30)
    rows = [runner.run_stage(s) for s in (crash, hang, after)]  # "timeout": cut at its limit
    assert [r["status"] for r in rows] == ["failed", "timeout", "ok"]
    assert "signal 6" in rows[0]["note"] and f"{HANG_LIMIT_S} s limit" in rows[1]["note"]
    # nothing left behind: the stage's worker went with it, and its process group is empty
    grandchild = int(pid_file.read_text())
    stat = Path(f"/proc/{grandchild}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert check.group_members(grandchild) == []
    # each stage's rows were kept as written, the killed ones' too
    hello = [r["stage"] for r in report.read_rows(tmp_path) if r["step"] == "hello"]
    assert hello == ["crash", "hang", "after"]
    assert runner.current is None


def test_stages_subset_keeps_the_other_stages_rows(tmp_path):
    assert check.parse_stages("timing,machine") == ["machine", "timing"]  # the check's order
    assert check.parse_stages(None) == list(STAGES)
    with pytest.raises(SystemExit, match="unknown stage"):
        check.parse_stages("timing,warp-drive")
    report.Recorder(tmp_path, "machine", echo=False).add("machine", device="x")
    report.Recorder(tmp_path, "timing", echo=False).add("time", n=1)
    report.drop_stages(tmp_path, ["timing"])
    assert [r["stage"] for r in report.read_rows(tmp_path)] == ["machine"]


def test_the_whole_check_fits_five_minutes_by_its_own_estimate():
    plan = Plan.gpu(cores=16)
    total = sum(estimate(plan, name) for name in STAGES)
    assert total < 300, total
    assert sum(LIMITS.values()) <= check.DEADLINE_S < 580  # inside the script's `timeout 580`
    assert set(LIMITS) == set(DRY_LIMITS) == set(STAGES)
    assert "timeout -k 10 580" in (ROOT / "tools" / "gpu_check.sh").read_text()
    # every launch the later stages make is precompiled: each config, even and ragged, causal
    # and not, both forwards
    variants = plan.variants()
    assert len(variants) == len(set(variants))
    assert {(v[0], v[5]) for v in variants} == {("fwd", False), ("fwd", True), ("dkdv", False),
                                                ("dq", False)}


def test_verdict_labels_the_interpreters_bf16_truncation():
    assert report.verdict({"out": 2e-3}, {"out": 1e-3}) == "yes"
    assert report.verdict({"out": 3e-3}, {"out": 1e-3}) == "NO"
    assert report.verdict({"out": 3e-3}, {"out": 1e-3}, {"out": 2e-3}) == report.TRUNCATION
    assert report.verdict({"out": 5e-3}, {"out": 1e-3}, {"out": 2e-3}) == "NO"


def test_truncation_drops_the_low_bits_where_rounding_would_round():
    from course_tools.gpu.stages import _truncated

    x = torch.tensor([1 + 2**-8 + 2**-9, -(1 + 2**-8 + 2**-9), 3.0])  # bf16's step at 1: 2^-7
    assert _truncated(x).tolist() == [1.0, -1.0, 3.0]
    assert x.to(torch.bfloat16).float().tolist() == [1 + 2**-7, -(1 + 2**-7), 3.0]


def _time(provider, mode, n, tflops):
    return {"stage": "timing", "step": "time", "provider": provider, "d": 64, "causal": False,
            "n": n, "mode": mode, "tflops": tflops, "first_call_s": 1.0, "timer": "t"}


def test_summary_judges_the_targets_against_flashattention2():
    rows = [_time("flash", "fwd", 4096, 300.0), _time("sdpa FLASH_ATTENTION", "fwd", 4096, 310.0),
            _time("flash tma", "fwd", 4096, 330.0),
            _time("flash", "bwd", 4096, 200.0), _time("sdpa FLASH_ATTENTION", "bwd", 4096, 240.0),
            _time("flash", "fwd", 2048, 100.0), _time("sdpa FLASH_ATTENTION", "fwd", 2048, 300.0)]
    text = report.summary(rows, notes=["a note"])
    lines = {tuple(c.strip() for c in line.split("|")[1:5]): line for line in text.splitlines()
             if line.startswith("| 64 |")}
    assert "0.97 | >= 1.0: missed | 1.10 |" in lines[("64", "False", "4096", "fwd")]
    assert "0.83 | >= 0.8: met | - |" in lines[("64", "False", "4096", "bwd")]
    assert "| - |" in lines[("64", "False", "2048", "fwd")]  # targets start at n = 4096
    assert "- a note" in text
    assert json.dumps(rows)  # rows are plain JSON, as the stages write them
