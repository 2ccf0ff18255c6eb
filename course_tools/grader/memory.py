"""How much a kernel's memory grows while one cell runs, read from outside the kernel.

A check that must not build the n × n score grid (`Check.memory_mb`) cannot ask the learner's
process how much it allocated: a NumPy grid is invisible to torch's profiler, and
`course_lib.measure.peak_bytes` is the learner's to replace. So the worker samples the resident
memory of every process of the kernel (the kernel, and whatever it forked) from /proc, every
5 ms while the probe cell runs, and reports the largest total above the total when the cell
began. A learner's code cannot touch that count; it can only stay below it, which is the point.
Without /proc (macOS) the same is read from `ps -A -o pid=,ppid=,rss=` every 20 ms, which still
sees a grid that takes a fraction of a second to fill. Without either (Windows) nothing is
measured and the check's own in-kernel measurement stands.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

INTERVAL_S = 0.005  # a full grid of the checked size takes far longer than this to fill
PS_INTERVAL_S = 0.02  # one `ps` run takes a few milliseconds itself
RESCAN_S = 0.1  # how often the set of the kernel's processes is read again
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(status.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        found.setdefault(ppid, []).append(int(status.parent.name))
    return found


def tree(root: int) -> list[int]:
    """`root` and all its descendants."""
    children, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def resident(pids: list[int]) -> int:
    """Bytes resident in memory, over `pids` (a process gone meanwhile counts 0)."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def ps_resident(root: int) -> int:
    """Bytes resident over `root` and its descendants, from one run of `ps` (0 if it fails)."""
    try:
        out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,rss="], capture_output=True,
                             text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for line in out.splitlines():
        try:
            pid, ppid, kb = (int(x) for x in line.split())
        except ValueError:
            continue
        children.setdefault(ppid, []).append(pid)
        rss[pid] = kb * 1024
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            total += rss.get(pid, 0)
            todo += children.get(pid, [])
    return total


def reader() -> str | None:
    """How this machine's process memory is read: "proc", "ps" or None."""
    if os.path.isdir("/proc/self"):
        return "proc"
    return "ps" if shutil.which("ps") else None


class Growth:
    """`with Growth(pid) as g: ...`; then `g.mb`: the most the tree of `pid` held above what it
    held at the start, in MB (None where neither /proc nor `ps` is there). `via` picks the
    reader ("proc" or "ps"; default: what `reader()` finds)."""

    def __init__(self, root: int | None, via: str | None = None):
        self.via = via or reader()
        self.root = root if root and self.via else None
        self.mb: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Growth:
        if self.root is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._ready = threading.Event()
            self._thread.start()
            self._ready.wait(2)
        return self

    def _sample(self) -> None:
        if self.via == "ps":
            return self._sample_ps()
        pids, scanned = tree(self.root), time.monotonic()
        start = peak = resident(pids)
        self._ready.set()
        while not self._stop.wait(INTERVAL_S):
            if time.monotonic() - scanned > RESCAN_S:
                pids, scanned = tree(self.root), time.monotonic()
            peak = max(peak, resident(pids))
        self.mb = round((max(peak, resident(pids)) - start) / 2**20, 1)

    def _sample_ps(self) -> None:
        start = peak = ps_resident(self.root)
        self._ready.set()
        while not self._stop.wait(PS_INTERVAL_S):
            peak = max(peak, ps_resident(self.root))
        self.mb = round((max(peak, ps_resident(self.root)) - start) / 2**20, 1)

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
