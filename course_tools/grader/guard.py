"""Limits on what one submission may take from the machine, and the grader's own safety (issue 23).

The worker's side (`worker.py`): its own memory (`limit_self`), the largest message it accepts
from a kernel (`message_context`), and the disk a submission's folders may fill (`disk_use`,
checked several times a second while each cell runs). The grader's side (`run.py`,
`pipeline.py`): every process a submission started is killed after it (`kill_run`: the worker's
descendants, its session and process group, and any process carrying the run's token in its
environment), and, without a sandbox, a submission cannot stop the grader with a catchable
signal (`SignalShield`) or freeze it with SIGSTOP (`watchdog`, a small process that sends
SIGCONT and, should the grader die, kills what its kernels left behind).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

RUN_TOKEN = "COURSE_GRADE_RUN"  # the environment variable that marks a submission's processes


def limit_self(memory_mb: int) -> None:
    """Cap this process's data segment at `memory_mb` (soft limit only: a kernel it starts may
    raise its own cap up to the hard limit, which stays as it was). Linux only."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = memory_mb << 20
        if hard == resource.RLIM_INFINITY or cap <= hard:
            resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


def message_context(max_mb: int):
    """A zmq context whose sockets drop any message larger than `max_mb` (ZMQ_MAXMSGSIZE): a
    kernel cannot make the worker hold a 100 MB error message."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    ctx.setsockopt(zmq.MAXMSGSIZE, max_mb << 20)
    return ctx


def disk_use(folders: list[str], max_files: int) -> tuple[int, int]:
    """(bytes on disk, number of entries) under `folders`, counting stops past `max_files`."""
    used = count = 0
    stack = [f for f in folders if f]
    while stack and count <= max_files:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            count += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            used += getattr(st, "st_blocks", 0) * 512 or st.st_size
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return used, count


def over_quota(folders: list[str], disk_mb: int, max_files: int) -> str | None:
    """Why the folders hold too much, or None."""
    used, count = disk_use(folders, max_files)
    if used > disk_mb << 20:
        return f"wrote more than {disk_mb} MB into its folders (the limit per submission)"
    if count > max_files:
        return f"made more than {max_files} files in its folders (the limit per submission)"
    return None


# ------------------------------------------------------------------------------ processes

def _stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, pgid, sid, state) of a process, from /proc (None when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[1]), int(fields[2]), int(fields[3]), fields[0]
    except (IndexError, ValueError):
        return None


def _pids() -> list[int]:
    try:
        return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _token_of(pid: int) -> str | None:
    """The run token in a process's environment, or None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    mark = f"{RUN_TOKEN}=".encode()
    return next((e[len(mark):].decode("ascii", "replace") for e in env if e.startswith(mark)),
                None)


def _carries(pid: int, token: str) -> bool:
    try:
        return f"{RUN_TOKEN}={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def run_processes(root: int, token: str | None, me: int | None = None) -> set[int]:
    """Every process of one submission's run: the descendants of its worker `root`, the members
    of its session and process group, and any process with the run's token (Linux; elsewhere
    only `root`). Never this process or an ancestor of it."""
    me = os.getpid() if me is None else me
    if not os.path.isdir("/proc"):
        return {root}
    table = {pid: st for pid in _pids() if (st := _stat(pid))}
    found = {root}
    for pid, (_, pgid, sid, _) in table.items():
        if pgid == root or sid == root or (token and _carries(pid, token)):
            found.add(pid)
    grew = True
    while grew:  # the descendants of everything found
        grew = False
        for pid, (ppid, _, _, _) in table.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    ancestors, pid = set(), me
    while pid > 1 and pid not in ancestors:
        ancestors.add(pid)
        pid = table.get(pid, (0,))[0]
    return found - ancestors


def kill_run(root: int, token: str | None) -> int:
    """SIGKILL every process of one submission's run, a few rounds (a fork during the first is
    caught by the next); returns how many were killed."""
    killed: set[int] = set()
    for _ in range(4):
        found = run_processes(root, token)
        live = {p for p in found if (_stat(p) or (0, 0, 0, "Z"))[3] != "Z"}
        if not live:
            break
        for pid in live:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed |= live
        time.sleep(0.02)
    for pid in killed:  # reap our own children
        with contextlib.suppress(OSError, ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return len(killed)


# -------------------------------------------------------------- the grader's own safety

SHIELDED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1",
                                               "SIGUSR2", "SIGALRM", "SIGXCPU", "SIGVTALRM",
                                               "SIGPROF")
                 if hasattr(signal, n))


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = set()
    while pid > 1 and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        st = _stat(pid)
        pid = st[0] if st else 0
    return False


class SignalShield:
    """The grader (POSIX, Linux's /proc) ignores a catchable signal sent by one of its own
    descendants (a submission's kernel or anything it started) and records it; a signal from
    anyone else (Ctrl-C at the terminal, `kill` from a shell) does what it always did.

    The shielded signals are blocked in every thread and taken by one thread with
    `sigwaitinfo`, which tells who sent them. The worker unblocks them first thing, so kernels
    start with none blocked. Use as a context manager around the grading; the waiting loop
    polls `interrupted` (set by a real Ctrl-C) and raises KeyboardInterrupt itself.

    A thread that was already running when the shield went up keeps its own signal mask, and the
    kernel may hand it a signal meant for the process: embed `grade()` in a process whose only
    thread is the caller's (the `course grade` command is; pytest-xdist's worker is not, so the
    attack tests grade in a forked child)."""

    def __init__(self):
        self.ignored: list[tuple[str, str | None]] = []  # (signal, the sender's run token)
        self.interrupted = threading.Event()
        self._thread: threading.Thread | None = None
        self._on = False

    def __enter__(self) -> SignalShield:
        if not (hasattr(signal, "sigwaitinfo") and os.path.isdir("/proc")) or \
                threading.current_thread() is not threading.main_thread():
            return self
        self._on = True
        signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
        self._thread = threading.Thread(target=self._wait, name="course-grade-signals",
                                        daemon=True)
        self._thread.start()
        return self

    def _wait(self) -> None:
        me = os.getpid()
        while self._on:
            info = signal.sigwaitinfo(SHIELDED)
            if not self._on:
                break
            sender = info.si_pid
            if sender and sender != me and _descends_from(sender, me):
                self.ignored.append((signal.Signals(info.si_signo).name, _token_of(sender)))
                continue
            if info.si_signo == signal.SIGINT:
                self.interrupted.set()
            else:  # the default action, as if never blocked (this thread unblocks it for itself)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, SHIELDED)
                signal.signal(info.si_signo, signal.SIG_DFL)
                os.kill(me, info.si_signo)

    def sent_by(self, token: str) -> list[str]:
        """The signals ignored that a process of the run with this token sent."""
        return list(dict.fromkeys(sig for sig, t in self.ignored if t == token))

    def __exit__(self, *exc) -> None:
        if not self._on:
            return
        self._on = False
        with contextlib.suppress(OSError, ProcessLookupError):  # wake the waiting thread
            signal.pthread_kill(self._thread.ident, signal.SIGUSR2)
        self._thread.join(timeout=2)
        while signal.sigtimedwait(SHIELDED, 0) is not None:  # drop what is still pending
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SHIELDED)


def unblock_signals() -> None:
    """Undo the shield's mask in a process the grader started (the worker), before any kernel."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SHIELDED)


WATCHDOG = r'''
import os, signal, sys, time
grader, token = int(sys.argv[1]), sys.argv[2]
os.setsid()
def stat(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    except OSError:
        return None
while True:
    state = stat(grader)
    if state is None or state == "Z" or os.getppid() != grader:
        break
    if state in ("T", "t"):
        os.kill(grader, signal.SIGCONT)
        sys.stderr.write("course grade: a submission stopped the grader (SIGSTOP); the watchdog "
                         "set it going again\n")
    time.sleep(0.2)
mark = f"{token}".encode()
for _ in range(3):
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if mark in open(f"/proc/{name}/environ", "rb").read():
                    os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.05)
'''


def watchdog(token: str) -> subprocess.Popen | None:
    """Start the watchdog (Linux): it sends SIGCONT to the grader whenever a submission stops it,
    and once the grader is gone (finished, or killed by a submission) kills every process that
    carries the run's `token`. Stop it with `.kill()` when grading is done."""
    if not os.path.isdir("/proc"):
        return None
    try:
        return subprocess.Popen([sys.executable, "-I", "-c", WATCHDOG, str(os.getpid()),
                                 f"{RUN_TOKEN}={token}"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, env={"PATH": os.defpath})
    except OSError:
        return None


# ------------------------------------------------- start-up files in shared places (no sandbox)

STARTUP_FILES = ("sitecustomize.py", "usercustomize.py")


def site_dirs() -> list[str]:
    """Where Python looks for start-up code that every later kernel would run: the
    site-packages folders of the grader's interpreter (the kernels run the same one)."""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


class SiteWatch:
    """Without a sandbox a kernel may drop a `sitecustomize.py`, `usercustomize.py` or `.pth`
    file into site-packages, which every later kernel would run at start (a blank scored 3/15
    that way). `check()` after each submission: a new start-up module is moved out of the way
    (into `quarantine`) and a changed one is put back; a new or changed `.pth` is only named
    (pip writes them too, and a package installed meanwhile must not lose its own). Each is
    named, to flag that submission."""

    def __init__(self, dirs: list[str], quarantine: Path):
        self.dirs, self.quarantine = dirs, quarantine
        self.files = self._listing()  # path -> bytes
        self._lock = threading.Lock()  # submissions finish in several threads

    def _listing(self) -> dict[str, bytes]:
        found = {}
        for d in self.dirs:
            with contextlib.suppress(OSError):
                for entry in os.scandir(d):
                    if entry.name in STARTUP_FILES or entry.name.endswith(".pth"):
                        with contextlib.suppress(OSError):
                            found[entry.path] = Path(entry.path).read_bytes()
        return found

    def check(self) -> list[str]:
        with self._lock:
            return self._check()

    def _check(self) -> list[str]:
        found = []
        now = self._listing()
        for path, data in now.items():
            if path.endswith(".pth"):
                if self.files.get(path) != data:
                    found.append(f"wrote the start-up file {path} (left in place: look at it)")
                    self.files[path] = data
                continue
            if path not in self.files:
                self.quarantine.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    os.replace(path, self.quarantine / f"{len(found)}-{Path(path).name}")
                found.append(f"put start-up code for every later kernel in {path} (removed)")
            elif data != self.files[path]:
                with contextlib.suppress(OSError):
                    Path(path).write_bytes(self.files[path])
                found.append(f"changed the start-up file {path} (put back)")
        return found
