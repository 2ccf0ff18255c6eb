"""Measuring: wall time, the peak memory torch allocates while a call runs, and thread counts.

    best_time(fn, repeats=3)      best wall-clock seconds of fn() (every benchmark's one timer)
    peak_bytes(fn)                largest bytes torch held at once while fn() ran
    set_threads(n) / threads(n)   torch's CPU thread count, set (for a notebook) or for a block

Peak memory on the CPU comes from torch's own profiler: with `profile_memory=True` it records
every allocation and free of torch's CPU allocator (with its size and time). Adding them up in
time order gives the bytes live at each moment; the largest value is the peak *extra* memory
the call needed, on top of its inputs. Python's tracemalloc cannot see these allocations, and
the process's resident size moves in pages and is shared with everything else, so this is the
honest number for "how big did the intermediate tensors get".
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

import torch

__all__ = ["peak_bytes", "best_time", "set_threads", "threads"]


def peak_bytes(fn: Callable[[], object]) -> int:
    """Largest number of bytes torch had allocated at once while `fn()` ran (inputs excluded).

    The result of `fn` is dropped inside the measurement, so it counts at its peak and is then
    freed. Returns -1 if this torch's profiler does not expose memory events.
    """
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
        del result
    try:
        events = prof.profiler.kineto_results.events()
        changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    except AttributeError:  # a torch whose profiler internals differ
        return -1
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    return int(peak)


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side logs start/stop lines with timestamps straight to file descriptor 2
    (they would land in notebook outputs); point fd 2 at /dev/null while it runs."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (some embedded interpreters): leave it alone
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def best_time(fn: Callable[[], object], repeats: int = 3, warmup: int = 1,
              max_seconds: float | None = None) -> float:
    """Best wall time in seconds over `repeats` calls after `warmup` calls (CPU).

    The minimum is the least disturbed run: on a shared machine the others are slowed by
    whatever else is running. `max_seconds` stops repeating once that much time was spent.
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    spent = 0.0
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best = min(best, took)
        spent += took
        if max_seconds is not None and spent > max_seconds:
            break
    return best


def set_threads(n: int | None) -> int:
    """Use n intra-op CPU threads from now on (None: leave torch's setting); return the old count.

    One thread makes float sums add up in one fixed order whatever the machine's core count, and
    for the course's small tensors it is also about the fastest.
    """
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    return before


@contextlib.contextmanager
def threads(n: int | None):
    """Run the block on n intra-op CPU threads (None: torch's current setting), then restore."""
    before = set_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
