"""Stage 4, run (the worker's side): one assembled notebook in a fresh, limited kernel.

`python -m course_tools.grader.worker --worker CTL_DIR` is started by `run.py`, one per
submission. It reads its spec from CTL_DIR/spec.json and a one-time token from its stdin, starts
the kernel (inside the sandbox's command when there is one) on ipc sockets, runs the cells, moves
each probe's files out of the kernel's reach as soon as its cell ends, notes after every cell
what appeared where the kernel should not write, and writes CTL_DIR/result.json with the token.
It never prints: anything on its stdout was written by someone else.
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

GRACE_S = 10  # after interrupting a timed-out cell, wait at most this long before killing it
MAX_RESTARTS = 3  # kernel restarts per submission before the remaining cells are skipped
STARTUP_S = 60  # seconds allowed for a kernel to start
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


# Runs in the kernel's own process before ipykernel: cap memory, no core files, and die with the
# worker (PR_SET_PDEATHSIG), then become the kernel. The cap is RLIMIT_DATA (every writable
# private mapping: the heap, NumPy and torch buffers, thread stacks), not RLIMIT_AS: address space
# that is only reserved (glibc reserves an arena per thread; CUDA reserves tens of GB) does not
# count, so the cap means what an instructor expects from "memory" (measured here: with a 1 GB
# cap, a learner gets 750 MB under RLIMIT_DATA and 300 MB under RLIMIT_AS after importing torch);
# on a GPU box, CUDA's reservations should not hit it either (not tested on a GPU). Linux only:
# macOS does not enforce it, Windows has no rlimits; there the kernel runs without a cap.
_LAUNCHER = """
import os, sys
mb, cmd = int(sys.argv[1]), sys.argv[2:]
try:
    import resource
    if mb > 0 and sys.platform.startswith("linux"):
        resource.setrlimit(resource.RLIMIT_DATA, (mb << 20, mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except (ImportError, ValueError, OSError, AttributeError):
    pass
try:
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except Exception:
    pass
os.execv(cmd[0], cmd)
"""


def _kernel_manager_class():
    from jupyter_client.manager import AsyncKernelManager

    class LimitedKernelManager(AsyncKernelManager):
        memory_mb = 0
        sandbox: list[str] = []  # the bwrap command up to its "--", or [] without a sandbox

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
            return [*self.sandbox, sys.executable, "-c", _LAUNCHER, str(self.memory_mb), *cmd]

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


async def _run_cells(spec: dict) -> dict:
    """Run the cells; {"statuses": one dict per cell, "error": None or why the kernel failed}."""
    from nbclient.exceptions import DeadKernelError

    timeout = float(spec["timeout"])
    memory_mb = int(spec["memory_mb"])
    grace = float(spec.get("grace", GRACE_S))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in spec["cells"]]
    client = _client_class()(
        nb,
        timeout=timeout,
        interrupt_on_timeout=True,
        allow_errors=True,
        record_timing=False,
        startup_timeout=STARTUP_S,
        shutdown_kernel="immediate",
        iopub_timeout=5,
    )
    launch = {
        "cwd": spec["cwd"],
        "env": spec["env"],
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
        "stdin": subprocess.DEVNULL,
    }
    ipc = spec.get("ipc")
    watch = Watch(spec)

    async def start() -> None:
        if ipc:  # sockets as files in a folder the sandbox shares: no TCP port to reach
            for old in Path(ipc).iterdir():
                old.unlink()
            km = _kernel_manager_class()(kernel_name="python3", transport="ipc",
                                         connection_file=str(Path(ipc) / "kernel.json"))
        else:
            km = _kernel_manager_class()(kernel_name="python3")
        km.memory_mb = memory_mb
        km.sandbox = list(spec.get("sandbox") or [])
        client.km = km
        await client.async_start_new_kernel(**launch)
        await client.async_start_new_kernel_client()

    async def stop() -> None:
        try:
            await asyncio.wait_for(client._async_cleanup_kernel(), 20)
        except Exception:  # noqa: BLE001 - already dead is fine
            pgid = getattr(getattr(client.km, "provisioner", None), "pgid", None)
            if pgid:
                kill_group(pgid)
        client.kc = client.km = None

    async def run(i: int, replay: bool = False) -> dict:
        t0 = time.monotonic()
        st = await execute(i)
        st["seconds"] = round(time.monotonic() - t0, 3)
        if not replay:
            collect(spec, i)
        found = watch.check()
        if found:
            st["intrusions"] = found
        return st

    async def execute(i: int) -> dict:
        cell = nb.cells[i]
        before = asyncio.all_tasks()
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(
                client.async_execute_cell(cell, i, store_history=False), timeout + grace
            )
        except (DeadKernelError, asyncio.TimeoutError, asyncio.CancelledError):
            for task in asyncio.all_tasks() - before - {asyncio.current_task()}:
                task.cancel()
            stuck = time.monotonic() - t0 >= timeout
            return {"status": "stuck" if stuck else "died"}
        except Exception as e:  # noqa: BLE001 - report, never crash the worker
            return {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        if not errors:
            return {"status": "ok"}
        e = errors[-1]
        if e.get("ename") == "KeyboardInterrupt" and time.monotonic() - t0 >= timeout:
            return {"status": "timeout"}
        return {
            "status": "error",
            "ename": e.get("ename", ""),
            "evalue": ANSI.sub("", e.get("evalue", ""))[:4000],
            "line": _failing_line(e.get("traceback", [])),
        }

    statuses: list[dict] = []
    restarts = 0
    try:
        await start()
        watch.baseline()
    except Exception as e:  # noqa: BLE001 - e.g. a memory cap too small for Python itself
        reason = (
            f"the kernel could not start ({type(e).__name__}: {str(e)[:200]}); "
            f"is the memory cap of {memory_mb} MB too small?"
        )
        return {
            "statuses": [{"status": "skipped", "reason": reason}] * len(nb.cells),
            "error": reason,
        }
    try:
        i = 0
        while i < len(nb.cells):
            st = await run(i)
            statuses.append(st)
            i += 1
            if st["status"] not in ("died", "stuck"):
                continue
            await stop()
            if restarts >= MAX_RESTARTS:
                reason = f"not run: the kernel died or hung {restarts + 1} times before this cell"
                statuses += [{"status": "skipped", "reason": reason}] * (len(nb.cells) - i)
                break
            restarts += 1
            try:
                await start()
            except Exception as e:  # noqa: BLE001
                reason = f"not run: the kernel could not be restarted ({type(e).__name__})"
                statuses += [{"status": "skipped", "reason": reason}] * (len(nb.cells) - i)
                break
            # Rebuild the state the later cells expect: replay what ran normally before.
            for j in range(i - 1):
                if statuses[j]["status"] in ("ok", "error") and not spec["collect"][j]:
                    replay = await run(j, replay=True)
                    if replay["status"] in ("died", "stuck"):
                        reason = "not run: the kernel died again while replaying earlier cells"
                        statuses += [{"status": "skipped", "reason": reason}] * (len(nb.cells) - i)
                        i = len(nb.cells)
                        break
    finally:
        await stop()
    return {"statuses": statuses, "error": None}


def collect(spec: dict, i: int) -> None:
    """Move cell i's probe files out of the kernel's reach (later writes change nothing)."""
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
    token = sys.stdin.readline().strip()  # before any kernel exists; never written anywhere
    sys.stdout = sys.stderr  # a library's print must not look like a forgery on the real fd 1
    _adopt_orphans()
    spec = json.loads((Path(ctl) / "spec.json").read_text(encoding="utf-8"))
    if sys.platform == "win32":  # pyzmq's asyncio sockets need a selector loop on Windows
        asyncio.set_event_loop_policy(asyncio.WindowsSelectorEventLoopPolicy())
    result = asyncio.run(_run_cells(spec))
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
