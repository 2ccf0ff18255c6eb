"""How much a kernel's memory grows while one cell runs, read from outside the kernel (Linux).

A check that must not build the n × n score grid (`Check.memory_mb`) cannot ask the learner's
process how much it allocated: a NumPy grid is invisible to torch's profiler, and
`course_lib.measure.peak_bytes` is the learner's to replace. So the worker samples the resident
memory of every process of the kernel (the kernel, and whatever it forked) from /proc, every
5 ms while the probe cell runs, and reports the largest total above the total when the cell
began. A learner's code cannot touch that count; it can only stay below it, which is the point.
Elsewhere (no /proc) nothing is measured and the check's own in-kernel measurement stands.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

INTERVAL_S = 0.005  # a full grid of the checked size takes far longer than this to fill
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


class Growth:
    """`with Growth(pid) as g: ...`; then `g.mb`: the most the tree of `pid` held above what it
    held at the start, in MB (None where /proc is not there)."""

    def __init__(self, root: int | None):
        self.root = root if root and os.path.isdir("/proc") else None
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
        pids, scanned = tree(self.root), time.monotonic()
        start = peak = resident(pids)
        self._ready.set()
        while not self._stop.wait(INTERVAL_S):
            if time.monotonic() - scanned > RESCAN_S:
                pids, scanned = tree(self.root), time.monotonic()
            peak = max(peak, resident(pids))
        self.mb = round((max(peak, resident(pids)) - start) / 2**20, 1)

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
