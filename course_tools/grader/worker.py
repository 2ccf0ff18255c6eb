"""Stage 4, run (the worker's side): one assembled notebook in a fresh, limited kernel.

`python -m course_tools.grader.worker --worker CTL_DIR` is started by `run.py`, one per
submission. It reads its spec from CTL_DIR/spec.json and a one-time token from its stdin, starts
the kernel (inside the sandbox's command when there is one, through `launcher.py`) on ipc
sockets, runs the cells (`KernelRun`: each cell under its own limit, the kernel restarted and
the earlier cells replayed when it dies or hangs), moves each probe's files out of the kernel's
reach as soon as its cell ends, notes after every cell what appeared where the kernel should not
write (`Watch`), and writes CTL_DIR/result.json with the token. It never prints: anything on its
stdout was written by someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from course_tools.grader import guard, memory
from course_tools.grader.limits import (
    DISK_FILES,
    DISK_MB,
    FILE_MB,
    MAX_RESTARTS,
    MESSAGE_MB,
    STARTUP_S,
    WORKER_MB,
    grace,
)

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LAUNCHER = str(Path(__file__).resolve().with_name("launcher.py"))
DEAD = ("died", "stuck")  # statuses after which the kernel is restarted
QUOTA = "quota"  # the submission filled its folders: the kernel is stopped, the rest skipped


def kill_group(pid: int) -> None:
    """Kill a process and its group (POSIX); on Windows, just the process."""
    sig = getattr(signal, "SIGKILL", signal.SIGTERM)
    try:
        os.killpg(pid, sig)
    except (OSError, AttributeError):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _kernel_manager_class():
    from jupyter_client.manager import AsyncKernelManager

    class LimitedKernelManager(AsyncKernelManager):
        memory_mb = 0
        sandbox: list[str] = []  # the bwrap command up to its "--", or [] without a sandbox

        def client(self, **kwargs):
            # The client's sockets come from the manager's context (guard.message_context,
            # which drops over-large messages), not from a fresh default one.
            kwargs.setdefault("context", self.context)
            return super().client(**kwargs)

        def format_kernel_cmd(self, extra_arguments=None):
            # Always this environment's ipykernel (never whatever a "python3" kernelspec names).
            cmd = [
                sys.executable,
                "-m",
                "ipykernel_launcher",
                "-f",
                os.path.realpath(self.connection_file),
                *(extra_arguments or []),
            ]
            if os.name != "posix":
                return cmd
            return [*self.sandbox, sys.executable, "-I", LAUNCHER, str(self.memory_mb),
                    str(FILE_MB), *cmd]

    return LimitedKernelManager


def _client_class():
    from nbclient import NotebookClient

    class GradingClient(NotebookClient):
        """Keeps only error outputs (a cell printing gigabytes cannot fill the worker's memory)
        and ignores widget traffic."""

        def output(self, outs, msg, display_id, cell_index):
            if msg["msg_type"] != "error":
                return None
            return super().output(outs, msg, display_id, cell_index)

        def handle_comm_msg(self, outs, msg, cell_index):
            return None

    return GradingClient


def _failing_line(traceback: list[str]) -> str:
    """The `---->` line of the last frame of an IPython traceback, without colours."""
    for frame in reversed(traceback or []):
        for line in ANSI.sub("", frame).splitlines():
            if line.lstrip().startswith("---->") or line.lstrip().startswith("->"):
                return re.sub(r"^\s*-*>\s*\d*\s*", "", line).strip()[:200]
    return ""


def _status_of(cell, limit: float, seconds: float) -> dict:
    """What an executed cell's outputs say: ok, a timeout (interrupted at its limit) or an error."""
    errors = [o for o in cell.outputs if o.get("output_type") == "error"]
    if not errors:
        return {"status": "ok"}
    e = errors[-1]
    if e.get("ename") == "KeyboardInterrupt" and seconds >= limit:
        return {"status": "timeout"}
    return {
        "status": "error",
        "ename": e.get("ename", ""),
        "evalue": ANSI.sub("", e.get("evalue", ""))[:4000],
        "line": _failing_line(e.get("traceback", [])),
    }


def _skipped(reason: str, n: int) -> list[dict]:
    return [{"status": "skipped", "reason": reason}] * n


class KernelRun:
    """The cells of one submission in one kernel, each under its own limit (`spec["limits"]`).

    `run()` goes through the cells in order. A cell that kills the kernel or ignores the
    interrupt ("died", "stuck") costs a restart: a fresh kernel replays the cells that ran
    normally before it (probes excepted: their files are already collected) and the run goes on,
    at most MAX_RESTARTS times."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.limits = [float(t) for t in spec["limits"]]
        self.memory_mb = int(spec["memory_mb"])
        self.nb = nbformat.v4.new_notebook()
        self.nb.cells = [nbformat.v4.new_code_cell(s, metadata={"limit": t})
                         for s, t in zip(spec["cells"], self.limits)]
        self.client = _client_class()(
            self.nb,
            timeout_func=lambda cell: cell.metadata["limit"],
            interrupt_on_timeout=True,
            allow_errors=True,
            record_timing=False,
            startup_timeout=STARTUP_S,
            shutdown_kernel="immediate",
            iopub_timeout=5,
        )
        self.watch = Watch(spec)
        self.statuses: list[dict] = []
        self.restarts = 0
        self.over: str | None = None  # why the submission's folders are over the quota
        self.folders = [f for f in spec.get("disk") or [] if f]
        self.disk_mb = int(spec.get("disk_mb") or DISK_MB)

    async def start(self) -> None:
        ipc = self.spec.get("ipc")
        if ipc:  # sockets as files in a folder the sandbox shares: no TCP port to reach
            for old in Path(ipc).iterdir():
                old.unlink()
            km = _kernel_manager_class()(kernel_name="python3", transport="ipc",
                                         connection_file=str(Path(ipc) / "kernel.json"))
        else:
            km = _kernel_manager_class()(kernel_name="python3")
        km.memory_mb = self.memory_mb
        km.context = guard.message_context(MESSAGE_MB)  # shared by the client's sockets
        km.sandbox = list(self.spec.get("sandbox") or [])
        self.client.km = km
        await self.client.async_start_new_kernel(
            cwd=self.spec["cwd"], env=self.spec["env"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        await self.client.async_start_new_kernel_client()

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.client._async_cleanup_kernel(), 20)
        except Exception:  # noqa: BLE001 - already dead is fine
            pgid = getattr(getattr(self.client.km, "provisioner", None), "pgid", None)
            if pgid:
                kill_group(pgid)
        self.client.kc = self.client.km = None

    async def execute(self, i: int) -> dict:
        """Run cell i once: its status, with the kernel's own error when it raised."""
        from nbclient.exceptions import DeadKernelError

        cell, limit = self.nb.cells[i], self.limits[i]
        before = asyncio.all_tasks()
        t0 = time.monotonic()
        disk = asyncio.ensure_future(self.guard_disk())
        measured = (self.spec.get("measure") or [False] * (i + 1))[i]
        growth = memory.Growth(getattr(self.client.km.provisioner, "pid", None) if measured
                               else None)
        try:
            with growth:
                await asyncio.wait_for(self.client.async_execute_cell(
                    cell, i, store_history=False), limit + grace(limit))
        except (DeadKernelError, asyncio.TimeoutError, asyncio.CancelledError):
            for task in asyncio.all_tasks() - before - {asyncio.current_task()}:
                task.cancel()
            if self.over is not None:
                return {"status": QUOTA, "reason": self.over}
            return {"status": "stuck" if time.monotonic() - t0 >= limit else "died"}
        except Exception as e:  # noqa: BLE001 - report, never crash the worker
            return {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        finally:
            disk.cancel()
        self.over = self.over or guard.over_quota(self.folders, self.disk_mb, DISK_FILES)
        if self.over is not None:
            return {"status": QUOTA, "reason": self.over}
        return {**_status_of(cell, limit, time.monotonic() - t0),
                **({"grew_mb": growth.mb} if measured else {})}

    async def guard_disk(self) -> None:
        """While a cell runs: stop the kernel as soon as its folders hold more than the quota
        (RLIMIT_FSIZE caps one file; this caps them all)."""
        while self.over is None:
            await asyncio.sleep(0.25)
            self.over = guard.over_quota(self.folders, self.disk_mb, DISK_FILES)
        pgid = getattr(getattr(self.client.km, "provisioner", None), "pgid", None)
        if pgid:
            kill_group(pgid)

    async def run_cell(self, i: int, replay: bool = False) -> dict:
        """Execute cell i, collect its probe files (not on a replay) and look for intrusions."""
        t0 = time.monotonic()
        if not replay:
            deliver(self.spec, i)
        st = await self.execute(i)
        st["seconds"] = round(time.monotonic() - t0, 3)
        if not replay:
            collect(self.spec, i)
        found = self.watch.check()
        if found:
            st["intrusions"] = found
        return st

    async def recover(self, i: int) -> bool:
        """After cell i-1 killed or hung the kernel: restart it and replay what ran normally
        before, so the later cells find the state they expect. False: give up (the remaining
        cells are marked skipped)."""
        await self.stop()
        left = len(self.nb.cells) - i
        if self.restarts >= MAX_RESTARTS:
            reason = f"not run: the kernel died or hung {self.restarts + 1} times before this cell"
            self.statuses += _skipped(reason, left)
            return False
        self.restarts += 1
        try:
            await self.start()
        except Exception as e:  # noqa: BLE001
            reason = f"not run: the kernel could not be restarted ({type(e).__name__})"
            self.statuses += _skipped(reason, left)
            return False
        for j in range(i - 1):
            if self.statuses[j]["status"] in ("ok", "error") and not self.spec["collect"][j]:
                if (await self.run_cell(j, replay=True))["status"] in DEAD:
                    reason = "not run: the kernel died again while replaying earlier cells"
                    self.statuses += _skipped(reason, left)
                    return False
        return True

    async def run(self) -> dict:
        """{"statuses": one dict per cell, "error": None or why the kernel failed, "started":
        whether the first kernel started at all (if not, nothing of the submission ran)}."""
        try:
            await self.start()
            self.watch.baseline()
        except Exception as e:  # noqa: BLE001 - e.g. a memory cap too small for Python itself
            reason = (
                f"the kernel could not start ({type(e).__name__}: {str(e)[:200]}); "
                f"is the memory cap of {self.memory_mb} MB too small?"
            )
            return {"statuses": _skipped(reason, len(self.nb.cells)), "error": reason,
                    "started": False}
        try:
            i = 0
            while i < len(self.nb.cells):
                st = await self.run_cell(i)
                self.statuses.append(st)
                i += 1
                if st["status"] == QUOTA:
                    self.statuses += _skipped(f"not run: the submission {st['reason']}",
                                              len(self.nb.cells) - i)
                    break
                if st["status"] in DEAD and not await self.recover(i):
                    break
        finally:
            await self.stop()
        return {"statuses": self.statuses, "error": None, "started": True}


def deliver(spec: dict, i: int) -> None:
    """Just before cell i: put its probe's cases where the kernel reads them. Each probe's
    cases wait in the grader's folder until then, so no cell sees the hidden cases of a later
    check, and `collect` removes them again after the cell."""
    for name in spec.get("deliver", [[]] * (i + 1))[i]:
        src = Path(spec["ctl"]) / "cases" / name
        if src.is_file():
            os.replace(src, Path(spec["io"]) / name)


def collect(spec: dict, i: int) -> None:
    """Move cell i's probe files out of the kernel's reach (later writes change nothing), and
    remove the cases it was handed."""
    for name in spec.get("deliver", [[]] * (i + 1))[i]:
        with contextlib.suppress(OSError):
            (Path(spec["io"]) / name).unlink()
    for name in spec["collect"][i]:
        for suffix in ("", ".tampered"):
            src = Path(spec["io"]) / (name + suffix)
            if src.is_file() and not src.is_symlink():
                os.replace(src, Path(spec["ctl"]) / "collected" / (name + suffix))


def _digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


class Watch:
    """What the kernel should not change: the traps' contents (sandbox) and the course files
    (no sandbox; a changed file is put back from the grader's snapshot at once)."""

    def __init__(self, spec: dict):
        self.traps: dict[str, str] = spec.get("traps") or {}
        self.files: dict[str, list[str]] = spec.get("watch") or {}  # path -> [sha256, copy]
        self.snapshot = spec.get("snapshot")
        self.seen: set[str] = set()

    def _listing(self) -> set[str]:
        found = set()
        for trap in self.traps:
            for folder, dirs, files in os.walk(trap):
                for name in dirs + files:
                    found.add(os.path.join(folder, name))
        return found

    def baseline(self) -> None:
        self.seen = self._listing()  # the mount points bubblewrap made

    def check(self) -> list[str]:
        found = []
        now = self._listing()
        for path in sorted(now - self.seen):
            trap = next(t for t in self.traps if path.startswith(t + os.sep))
            found.append("wrote " + self.traps[trap].rstrip("/") + path[len(trap):])
        self.seen |= now
        for path, (digest, copy) in self.files.items():
            if _digest(path) != digest:
                found.append(f"changed the course file {path}")
                try:
                    Path(path).write_bytes((Path(self.snapshot) / copy).read_bytes())
                except OSError as e:
                    found.append(f"(and the grader could not restore it: {e})")
        return found


def _adopt_orphans() -> None:
    """Become the child subreaper (Linux): what a kernel starts and leaves behind, even in a
    session of its own, is reparented to the worker when the kernel dies, and killed at the end."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except Exception:  # noqa: BLE001 - not Linux: the sandbox's namespace or nothing
        pass


def _die_with_grader() -> None:
    """Linux: SIGKILL this worker when the grader that started it dies (its kernels then die
    with it: the launcher's PR_SET_PDEATHSIG, bubblewrap's --die-with-parent)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux
        pass


def _kill_children() -> None:
    me = str(os.getpid())
    for _ in range(5):
        found = False
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                ppid = status.read_text().split("PPid:")[1].split()[0]
            except (OSError, IndexError):
                continue
            if ppid == me:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(int(status.parent.name), signal.SIGKILL)
                with contextlib.suppress(OSError, ChildProcessError):
                    os.waitpid(int(status.parent.name), os.WNOHANG)
        if not found:
            return
        time.sleep(0.05)


def _worker_main(ctl: str) -> int:
    guard.unblock_signals()  # the grader's SignalShield blocks them; kernels must not inherit it
    token = sys.stdin.readline().strip()  # before any kernel exists; never written anywhere
    sys.stdout = sys.stderr  # a library's print must not look like a forgery on the real fd 1
    guard.limit_self(WORKER_MB)  # what a kernel's messages may cost this process
    _adopt_orphans()
    _die_with_grader()
    spec = json.loads((Path(ctl) / "spec.json").read_text(encoding="utf-8"))
    if sys.platform == "win32":  # pyzmq's asyncio sockets need a selector loop on Windows
        asyncio.set_event_loop_policy(asyncio.WindowsSelectorEventLoopPolicy())
    result = asyncio.run(KernelRun(spec).run())
    if os.path.isdir("/proc"):
        _kill_children()
    result["token"] = token
    tmp = Path(ctl) / "result.json.part"
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, Path(ctl) / "result.json")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(sys.argv[2]))
    print("usage: python -m course_tools.grader.worker --worker CTL_DIR (internal; use `course "
          "grade`)", file=sys.stderr)
    sys.exit(2)
