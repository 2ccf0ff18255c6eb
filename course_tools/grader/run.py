"""Stage 4, run (the grader's side): one worker subprocess per submission, in a scratch folder.

The grader writes the submission's copy and the probes' cases into the submission's folders
(`sandbox.Layout`), starts `python -m course_tools.grader.worker` with a one-time token on its
stdin, waits, and reads the worker's result file only if the worker exited normally and the
token matches. The worker never prints, so anything on its stdout is someone else's forgery.
Then the probes are judged here (`probes.judge`), and the scratch folder is deleted.

The kernel imports a copy of the `course_lib` the grader imported, whether or not the course is
installed: when grading, the copy `strip.py` makes for the submission's chapter (no exercise's
answer, no judge, no reference in it); for `course check`, the whole of it. In the sandbox that
copy is bound read-only at <scratch>/lib/course_lib, first on the kernel's PYTHONPATH; without
it, the copy is the run's private one. The preflight cell checks the kernel imported it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from course_tools.grader import guard, preflight, probes, sandbox, strip
from course_tools.grader.assemble import Plan
from course_tools.grader.limits import DISK_MB, cell_limit, run_deadline
from course_tools.grader.worker import LAUNCHER, kill_group


@dataclass
class Settings:
    """What every submission of one `grade()` call shares."""

    timeout: float = 60
    memory_mb: int = 4096
    disk_mb: int = DISK_MB  # all of a submission's files together (limits.py)
    jobs: int = 1
    python_path: list[str] = field(default_factory=list)  # extra import folders for the kernel
    hide: list[Path] = field(default_factory=list)  # solutions/, the submissions' folders
    protect: list[Path] = field(default_factory=list)  # the submissions: put back if changed
    sandbox: bool = True  # False: never, even where it works
    why_not_sandboxed: str | None = None
    course_lib: Path = field(init=False)  # the folder of the course_lib the grader imported
    given_path: list[str] = field(init=False)  # python_path as given (before any private copy)
    snapshot: Path | None = None
    watch: dict[str, list[str]] = field(default_factory=dict)  # path -> [sha256, snapshot name]
    per_cell: set[str] = field(default_factory=set)  # watched after every cell
    run_token: str = field(default_factory=lambda: secrets.token_hex(8))  # marks its processes
    shield: object | None = None  # the grade's guard.SignalShield, without a sandbox
    site: guard.SiteWatch | None = None  # start-up files in site-packages, without a sandbox
    strip: bool = True  # grading: kernels import strip.py's copy; False (course check): all of it
    # pipeline.given_names: the names the course's own cells spell, and per chapter import
    given: tuple[set[str], dict[str, set[str]]] = field(default_factory=lambda: (set(), {}))
    stripped: dict[tuple[str, ...], Path] = field(default_factory=dict)  # chapters -> its copy
    _strip_root: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        import course_lib

        self.course_lib = Path(course_lib.__file__).resolve().parent
        self.given_path = list(self.python_path)
        self.why_not_sandboxed = sandbox.unavailable() if self.sandbox else "--unsafe-no-sandbox"
        if self.why_not_sandboxed and os.name == "posix":
            self._private_copy()
        elif self.why_not_sandboxed and not _is_site_dir(self.course_lib.parent):
            self.python_path = [str(self.course_lib.parent), *self.python_path]  # a checkout

    @property
    def sandboxed(self) -> bool:
        return self.why_not_sandboxed is None

    def kernel_lib(self, layout: sandbox.Layout,
                   chapters: tuple[str, ...] = ()) -> tuple[list[str], Path, Path]:
        """The kernel's import path (its PYTHONPATH), the course_lib it must import there, and
        the folder that holds it on this side (the sandbox binds it read-only)."""
        lib = self.lib_for(chapters)
        if self.sandboxed:
            return [str(layout.lib), *self.python_path], layout.lib / "course_lib", lib
        rest = self.python_path[1:] if self.snapshot is not None else self.python_path
        return [str(lib.parent), *rest], lib, lib

    def lib_for(self, chapters: tuple[str, ...]) -> Path:
        """The course_lib a kernel for `chapters` imports: strip.py's copy when grading (made
        once per run and chapter set), else the grader's own (or, without a sandbox, the
        private copy)."""
        if not self.strip:
            return self.snapshot / "live" / "course_lib" if self.snapshot else self.course_lib
        with self._lock:
            if chapters not in self.stripped:
                if self._strip_root is None:
                    self._strip_root = Path(tempfile.mkdtemp(prefix="course-grade-strip-"))
                dest = self._strip_root / ("-".join(chapters) or "none")
                words, uses = self.given
                lib = strip.build(self.course_lib, dest, chapters, keep=words,
                                  uses=set().union(*(uses.get(c, set()) for c in chapters)))
                if self.snapshot is not None:  # no sandbox: its files are watched like the rest
                    self._watch([q for q in lib.rglob("*") if q.is_file()], per_cell=True)
                self.stripped[chapters] = lib
            return self.stripped[chapters]

    def _private_copy(self) -> None:
        """Without a sandbox a kernel can reach every file the grader's user can. So the kernels
        import a private copy of course_lib (and of the --python-path folders), made here; the
        worker checks its files after every cell and puts back, and flags, any a kernel changed.
        The live course is never written. The submissions are checked (and put back) once each
        submission is done. Nothing else is watched."""
        self.snapshot = Path(tempfile.mkdtemp(prefix="course-grade-lib-"))
        live = self.snapshot / "live"
        copies = [(self.course_lib, live / "course_lib")]
        copies += [(Path(d), self.snapshot / f"path{k}") for k, d in enumerate(self.python_path)]
        for src, dst in copies:
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        self.python_path = [str(live), *(str(dst) for _, dst in copies[1:])]
        self.site = guard.SiteWatch(guard.site_dirs(), self.snapshot / "quarantine")
        (self.snapshot / "originals").mkdir()
        files = [q for _, dst in copies for q in dst.rglob("*") if q.is_file()]
        self._watch(files, per_cell=True)
        self._watch([q for q in self.protect if q.is_file()], per_cell=False)  # the submissions

    def _watch(self, files: list[Path], *, per_cell: bool) -> None:
        for path in dict.fromkeys(files):
            if str(path) in self.watch:
                continue
            data, name = path.read_bytes(), str(len(self.watch))
            (self.snapshot / "originals" / name).write_bytes(data)
            self.watch[str(path)] = [hashlib.sha256(data).hexdigest(), name]
            if per_cell:
                self.per_cell.add(str(path))

    def restore(self) -> list[str]:
        """Put back any watched file a kernel changed (no sandbox); returns what was changed."""
        changed = []
        for path, (digest, name) in self.watch.items():
            try:
                now = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            except OSError:
                now = None
            if now != digest:
                changed.append(path)
                Path(path).write_bytes((self.snapshot / "originals" / name).read_bytes())
        return changed

    def close(self) -> None:
        if self.snapshot is not None:
            self.restore()
            remove(self.snapshot)
        if self._strip_root is not None:
            remove(self._strip_root)


def _is_site_dir(folder: Path) -> bool:
    """Whether `folder` is where installed packages live (never put on a kernel's PYTHONPATH)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return any(folder == Path(paths[k]).resolve() for k in ("purelib", "platlib") if k in paths)


@dataclass
class RunResult:
    statuses: list[dict]  # one per plan cell
    error: str | None = None
    started: bool = True  # False: the kernel never started, nothing of the submission ran
    flags: list[str] = field(default_factory=list)  # tampering with the run itself: all exercises
    verdicts: dict[int, probes.Verdict] = field(default_factory=dict)  # plan cell -> verdict


def _worker_env(jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env["MPLBACKEND"] = "agg"  # no figures are shown while grading; skip rendering them
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, jobs))))
    env.pop("JPY_PARENT_PID", None)
    return env


def run_submission(name: str, data: bytes, plan: Plan, settings: Settings) -> RunResult:
    """Run the plan's cells in a worker subprocess, judge its probes, clean up."""
    layout = sandbox.Layout.create()
    try:
        (layout.work / (name if name.endswith(".ipynb") else "submission.ipynb")).write_bytes(data)
        (layout.ctl / "collected").mkdir()
        (layout.ctl / "cases").mkdir()  # each probe's cases wait here until its cell runs
        chapters = tuple(sorted({c for cell in plan.cells for m in cell.imports
                                 if (c := strip.chapter_of(m))}))
        path, course_lib, bound = settings.kernel_lib(layout, chapters)
        for cell in plan.cells:
            if cell.role == "probe":
                cell.probe = probes.prepare(cell.call, layout.io, layout.ctl / "cases")
                cell.source = cell.probe.source
            elif cell.role == "preflight":
                cell.source = preflight.source(cell.imports, course_lib)
        result = _run_worker(layout, plan, settings, path, bound)
        for i, (cell, st) in enumerate(zip(plan.cells, result.statuses)):
            if cell.role == "probe":
                result.verdicts[i] = probes.judge(
                    cell.probe, layout.ctl / "collected", st.get("status") == "ok",
                    grew_mb=st.get("grew_mb"),
                )
    finally:
        remove(layout.root)
    return result


def _run_worker(layout: sandbox.Layout, plan: Plan, settings: Settings,
                path: list[str], course_lib: Path) -> RunResult:
    n = len(plan.cells)
    env = _worker_env(settings.jobs)
    run_token = f"{settings.run_token}-{secrets.token_hex(4)}"
    env[guard.RUN_TOKEN] = run_token  # the worker and its kernels carry it (sandbox.ENV_NAMES)
    limits = [cell_limit(c.role, settings.timeout) for c in plan.cells]
    spec = {
        "cells": [c.source for c in plan.cells],
        "limits": limits,  # the course's own cells get theirs, the learner's the --timeout
        "collect": [[c.probe.out] if c.role == "probe" else [] for c in plan.cells],
        "deliver": [[c.probe.inp] if c.role == "probe" else [] for c in plan.cells],
        "measure": [c.role == "probe" and c.probe.call.check.memory_mb is not None
                    for c in plan.cells],  # the kernel's memory, read from outside (memory.py)
        "disk": [str(layout.work), str(layout.io), str(layout.home), str(layout.ipc)],
        "cwd": str(layout.work),
        "io": str(layout.io),
        "ctl": str(layout.ctl),
        "ipc": str(layout.ipc) if sys.platform.startswith("linux") else None,  # tcp elsewhere
        "env": sandbox.kernel_env(layout, env, path),
        "memory_mb": settings.memory_mb,
        "disk_mb": settings.disk_mb,
        "watch": {p: v for p, v in settings.watch.items() if p in settings.per_cell},
        "snapshot": str(settings.snapshot / "originals" if settings.snapshot else ""),
    }
    if settings.sandboxed:
        hide = sandbox.hidden_places(settings.course_lib.parent, settings.hide)
        spec["sandbox"], spec["traps"] = sandbox.wrap(
            layout, course_lib=course_lib, python_path=settings.python_path, hide=hide,
            launcher=LAUNCHER, installed=settings.course_lib if _is_site_dir(
                settings.course_lib.parent) else None,
        )
    (layout.ctl / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    deadline = run_deadline(limits)  # every cell timing out, plus restarts and replays
    cmd = [sys.executable, "-m", "course_tools.grader.worker", "--worker", str(layout.ctl)]
    token = secrets.token_hex(16)
    result = RunResult([])
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(layout.ctl),
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate((token + "\n").encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        result.error = f"grading did not finish within {deadline:.0f} s; the rest was not run"
    finally:  # whatever the submission started, in any session or group: nothing outlives it
        guard.kill_run(proc.pid, run_token)
        kill_group(proc.pid)
    sent = settings.shield.sent_by(run_token) if hasattr(settings.shield, "sent_by") else []
    if sent:
        result.flags.append(f"the submission sent {', '.join(sent)} to the grader (ignored)")
    if out.strip():
        result.flags.append(
            f"something wrote {len(out)} bytes into the grading worker's output (a forged result?)"
        )
    reply = _read_reply(layout.ctl / "result.json", token, proc.returncode, result)
    if reply is not None:
        result.statuses, result.error = reply["statuses"], reply["error"] or result.error
        result.started = bool(reply.get("started", True))
    elif result.error is None:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        result.error = f"the grading worker stopped (exit status {proc.returncode})" + (
            ": " + " | ".join(tail) if tail else ""
        )
    if settings.snapshot is not None:
        result.flags += [f"changed the course file {p}" for p in settings.restore()]
    if settings.site is not None:
        result.flags += settings.site.check()
    if len(result.statuses) < n:
        reason = result.error or "not run"
        result.statuses += [{"status": "skipped", "reason": reason}] * (n - len(result.statuses))
    return result


def _read_reply(path: Path, token: str, returncode: int | None, result: RunResult) -> dict | None:
    if returncode != 0 or not path.is_file():
        return None
    try:
        reply = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        reply = None
    if not isinstance(reply, dict) or not secrets.compare_digest(str(reply.get("token")), token):
        result.flags.append("the grading worker's result was forged")
        return None
    return reply


def remove(path: Path) -> None:
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
