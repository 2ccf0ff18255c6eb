"""Chapter 08's kernel on a real GPU, in stages that fit one short machine loan.

    python -m course_tools.gpu --out DIR                      # a CUDA machine (tools/gpu_check.sh)
    python -m course_tools.gpu --dry-run --out DIR            # every stage on a CPU, tiny sizes
    python -m course_tools.gpu --stages timing,pytest ...     # re-run some stages
    python -m course_tools.gpu --estimate                     # print the plan and its estimate

Each stage (see `course_tools.gpu.plan.STAGES`) runs in its own child process, in its own
process group, under its own time limit: a stage that faults (a CUDA error makes every later
CUDA call in its process fail), crashes or runs past its limit is recorded, its whole process
group is killed, and the next stage starts in a fresh process. Stages append their rows to
DIR/results.jsonl as they go; DIR/summary.md is rewritten after every stage (and on SIGTERM);
each stage's output is in DIR/logs/STAGE.log. This process makes no CUDA call (importing
course_lib asks torch.cuda.is_available(), nothing more) and never imports Triton.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from course_tools.gpu import report
from course_tools.gpu.plan import DRY_LIMITS, LIMITS, STAGES, WHAT, Plan, estimate

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 5.0      # SIGTERM, then this long, then SIGKILL
DEADLINE_S = 560.0  # the whole check, inside a 10-minute command


@dataclass
class Stage:
    name: str
    argv: list
    limit_s: float
    estimate_s: float | None = None   # seconds on the GPU machine; None in a dry run


def stage_env(dry_run: bool) -> dict:
    """The children's environment: the course from this working tree, the machine's own torch
    and Triton; compiled kernels on a GPU, the interpreter in a dry run; autotuning results
    cached on disk, so a later stage reuses what an earlier one tuned."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    env["PYTHONUNBUFFERED"] = "1"
    if dry_run:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies excluded) of process group `pgid`, from /proc (Linux)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def _group_alive(pgid: int) -> bool:
    if Path("/proc/self/stat").exists():
        return bool(group_members(pgid))
    try:  # pragma: no cover - no /proc: zombies count as alive here
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's whole process group (its workers too), SIGKILL after GRACE_S."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while time.monotonic() < end and _group_alive(proc.pid):
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.05)
        if not _group_alive(proc.pid):
            break
    if proc.poll() is None:
        proc.wait()


class Runner:
    """Runs stages one at a time; `current` is the running child (for the SIGTERM handler)."""

    def __init__(self, out: Path, env: dict):
        self.out, self.env = Path(out), env
        self.current: subprocess.Popen | None = None
        self.rec = report.Recorder(self.out, "check", echo=False)

    def run_stage(self, stage: Stage) -> dict:
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{stage.name}.log"
        start = time.monotonic()
        with open(log, "w") as f:
            self.current = proc = subprocess.Popen(
                stage.argv, stdout=f, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
                start_new_session=True)  # its own process group: killed whole at its limit
            try:
                proc.wait(timeout=stage.limit_s)
                status = "ok" if proc.returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                _kill_group(proc)  # also whatever it left running after it exited
                self.current = None
        seconds = time.monotonic() - start
        rc = proc.returncode
        note = {"timeout": f"killed at its {stage.limit_s:.0f} s limit",
                "failed": f"exit {rc}" + (" (CUDA context lost)" if rc == 3 else "")
                          + (f" (signal {-rc})" if rc is not None and rc < 0 else "")
                }.get(status, "")
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        row = self.rec.add("stage", stage=stage.name, status=status, returncode=rc,
                           seconds=seconds, limit_s=stage.limit_s, estimate_s=stage.estimate_s,
                           note=note, log=str(log.relative_to(self.out)),
                           tail=tail if status != "ok" else [])
        guess = "" if stage.estimate_s is None else f"estimate {stage.estimate_s:.0f} s, "
        print(f"gpu_check: {stage.name}: {status} in {seconds:.1f} s ({guess}limit "
              f"{stage.limit_s:.0f} s) {note}".rstrip(), flush=True)
        return row


def write_summary(out: Path, notes: list[str]) -> Path:
    path = Path(out) / "summary.md"
    path.write_text(report.summary(report.read_rows(out), notes))
    return path


def plan_stages(names, dry_run: bool, python: str, out: Path, deadline: float) -> list[Stage]:
    plan = Plan.dry() if dry_run else Plan.gpu()
    limits = DRY_LIMITS if dry_run else LIMITS
    stages = []
    for name in names:
        limit = float(limits[name])
        argv = [python, "-m", "course_tools.gpu.stages", name, "--out", str(out),
                "--limit", str(limit)] + (["--dry-run"] if dry_run else [])
        stages.append(Stage(name, argv, limit, None if dry_run else estimate(plan, name)))
    return stages


def print_estimate(cores: int = 16) -> float:
    plan = Plan.gpu(cores=cores)
    total = 0.0
    print(f"The GPU check on an H200 machine with {cores} cores, stage by stage "
          "(estimate / limit, seconds):")
    for name in STAGES:
        seconds = estimate(plan, name)
        total += seconds
        print(f"  {name:14} {seconds:6.0f} / {LIMITS[name]:3d}  {WHAT[name]}")
    print(f"  {'total':14} {total:6.0f} / {sum(LIMITS.values()):3d}  (machine start excluded)")
    return total


def parse_stages(text: str | None) -> list[str]:
    if not text:
        return list(STAGES)
    names = [s for s in text.replace(",", " ").split() if s]
    unknown = [s for s in names if s not in STAGES]
    if unknown:
        raise SystemExit(f"gpu_check: unknown stage(s) {', '.join(unknown)}; the stages are "
                         f"{', '.join(STAGES)}")
    return [s for s in STAGES if s in names]  # always in the check's order


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results/gpu"))
    parser.add_argument("--dry-run", action="store_true", help="every stage on a CPU, tiny")
    parser.add_argument("--stages", help=f"a subset, comma-separated, of: {', '.join(STAGES)}")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help="seconds for the whole check; a stage gets at most what is left")
    parser.add_argument("--estimate", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--python", default=sys.executable, help="the stages' interpreter")
    args = parser.parse_args(argv)
    if args.estimate:
        print_estimate()
        return 0
    names = parse_stages(args.stages)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stages:  # keep the other stages' rows: the summary covers them all
        report.drop_stages(out, names)
    else:
        (out / report.RESULTS).write_text("")
    runner = Runner(out, stage_env(args.dry_run))
    start = time.monotonic()
    stages = plan_stages(names, args.dry_run, args.python, out, args.deadline)
    notes = [f"{'dry run (CPU, Triton interpreter)' if args.dry_run else 'GPU run'}; stages: "
             + ", ".join(names)]
    if not args.dry_run:
        notes.append(f"estimate {sum(s.estimate_s for s in stages):.0f} s, deadline "
                     f"{args.deadline:.0f} s")
        print("gpu_check: " + ", ".join(f"{s.name} ~{s.estimate_s:.0f} s" for s in stages)
              + f" (estimate {sum(s.estimate_s for s in stages):.0f} s)", flush=True)

    def stop(signum, _frame):  # `timeout` sends SIGTERM: kill the stage, keep the summary
        if runner.current is not None:
            _kill_group(runner.current)
        notes.append(f"stopped by signal {signum}")
        write_summary(out, notes)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    for stage in stages:
        left = args.deadline - (time.monotonic() - start)
        if left < 5:
            notes.append(f"not started (deadline spent): {stage.name}")
            continue
        stage.limit_s = min(stage.limit_s, left)
        runner.run_stage(stage)
        write_summary(out, notes)
    notes.append(f"the check took {time.monotonic() - start:.0f} s")
    path = write_summary(out, notes)
    print(f"gpu_check: wrote {path}", flush=True)
    return exit_status(report.read_rows(out), args.dry_run)


def exit_status(rows: list[dict], dry_run: bool) -> int:
    """0 when every stage finished and nothing failed its bound (a dry run: every stage
    finished, the interpreter's bf16 truncation labelled, not failed); 1 otherwise."""
    stages_ok = all(r["status"] == "ok" for r in rows if r["step"] == "stage")
    judged = [r for r in rows if r["step"] in ("correctness", "config_check")]
    bounds_ok = all(r["verdict"] != "NO" for r in judged)
    if not dry_run:
        bounds_ok = all(r["verdict"] == "yes" for r in judged)
    tests_ok = all(r["returncode"] == 0 or r.get("skipped") for r in rows if r["step"] == "pytest")
    return 0 if stages_ok and bounds_ok and tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
