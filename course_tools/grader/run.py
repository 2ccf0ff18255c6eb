"""Stage 4, run (the grader's side): a worker subprocess per submission, in a scratch folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from course_tools.grader.assemble import Plan
from course_tools.grader.worker import GRACE_S, MAX_RESTARTS, RESULT_MARK, STARTUP_S, kill_group


def _worker_env(jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env["MPLBACKEND"] = "agg"  # no figures are shown while grading; skip rendering them
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, jobs))))
    env.pop("JPY_PARENT_PID", None)
    return env


def run_in_worker(
    name: str, data: bytes, plan: Plan, *, timeout: float, memory_mb: int, jobs: int
) -> tuple[list[dict], str | None]:
    """Run the plan's cells in a worker subprocess, in a scratch copy; return per-cell statuses."""
    n = len(plan.cells)
    scratch = Path(tempfile.mkdtemp(prefix="course-grade-"))
    control = Path(
        tempfile.mkdtemp(prefix="course-grade-ctl-")
    )  # not reachable by ../ from the kernel
    work = scratch / "work"
    work.mkdir()
    (work / (name if name.endswith(".ipynb") else "submission.ipynb")).write_bytes(data)
    spec = {
        "cells": [c.source for c in plan.cells],
        "cwd": str(work),
        "timeout": timeout,
        "memory_mb": memory_mb,
        "grace": min(GRACE_S, max(2.0, timeout / 2)),
    }
    (control / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    # Enough for every cell to time out, plus restarts and replays.
    deadline = STARTUP_S * (MAX_RESTARTS + 2) + (timeout + GRACE_S) * (n + 2) * 2
    cmd = [
        sys.executable,
        "-m",
        "course_tools.grader.worker",
        "--worker",
        str(control / "spec.json"),
    ]
    error = None
    statuses: list[dict] = []
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(control),
            env=_worker_env(jobs),
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            error = f"grading did not finish within {deadline:.0f} s; the rest was not run"
        for line in out.decode("utf-8", "replace").splitlines():
            if line.startswith(RESULT_MARK):
                reply = json.loads(line[len(RESULT_MARK) :])
                statuses, error = reply["statuses"], reply["error"] or error
        if not statuses and error is None:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
            error = f"the grading worker stopped (exit status {proc.returncode})" + (
                ": " + " | ".join(tail) if tail else ""
            )
    finally:
        _remove(scratch)
        _remove(control)
    if len(statuses) < n:
        reason = error or "not run"
        statuses = statuses + [{"status": "skipped", "reason": reason}] * (n - len(statuses))
    return statuses, error


def _remove(path: Path) -> None:
    def make_writable(func, p, _exc):  # a cell may have chmod-ed its files
        try:
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    try:
        for d in [path, *(q for q in path.rglob("*") if q.is_dir() and not q.is_symlink())]:
            os.chmod(d, 0o700)
    except OSError:
        pass
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)
