"""Measuring: wall time, peak memory, thread counts, and how closely two results agree.

    time_call(fn, repeats=5)      Timing of fn(): the median wall-clock seconds and the spread
                                  (every benchmark's one timer)
    best_time(fn, repeats=3)      the fastest of those runs, in seconds
    peak_bytes(fn)                largest bytes torch held at once while fn() ran
    set_threads(n) / threads(n)   torch's CPU thread count, set (for a notebook) or for a block
    agreement(got, want)          "agrees to rounding (max |diff| < 1e-13)": a bound, not digits

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
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Timing", "time_call", "best_time", "peak_bytes", "set_threads", "threads",
           "agreement", "ROUNDING"]


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


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of repeated calls: the median and the spread (fastest, slowest).

    The median is what a typical call costs; the spread says how much the machine disturbed the
    runs. A timing table that shows both lets a reader judge a ratio between two rows.
    """

    median: float
    low: float
    high: float
    repeats: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        """Summarise seconds measured elsewhere (e.g. methods timed in turn)."""
        if not samples:
            raise ValueError("samples should hold at least one time, got none")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def ms(self, digits: int = 2) -> str:
        """'3.21 ms (3.10-3.65)': the median and, in brackets, the fastest and slowest run."""
        return (f"{1e3 * self.median:.{digits}f} ms "
                f"({1e3 * self.low:.{digits}f}-{1e3 * self.high:.{digits}f})")


def time_call(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
              max_seconds: float | None = None) -> Timing:
    """Time `repeats` calls of fn() after `warmup` untimed ones; return their `Timing`.

    `max_seconds` stops repeating once that much time was spent (slow calls get fewer runs; at
    least one always runs). Times are wall-clock on the CPU: a GPU call must synchronise inside fn.
    """
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
        if max_seconds is not None and sum(samples) > max_seconds:
            break
    return Timing.of(samples)


def best_time(fn: Callable[[], object], repeats: int = 3, warmup: int = 1,
              max_seconds: float | None = None) -> float:
    """Fastest wall time in seconds over `repeats` calls after `warmup` calls (`time_call`'s low).

    The minimum is the least disturbed run; the lectures' tables print the median and spread.
    """
    return time_call(fn, repeats, warmup, max_seconds).low


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


# Bounds for "agrees to rounding", per dtype: far above the rounding noise of the course's sizes
# on any CPU or GPU (float64 differences there are ~1e-16 to 1e-15, float32 ~1e-7 to 1e-6), far
# below any real mistake (a wrong mask or scale changes results by 1e-2 or more).
ROUNDING = {torch.float64: 1e-13, torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def agreement(got: torch.Tensor, want: torch.Tensor, tol: float | None = None) -> str:
    """How closely `got` matches `want`, in words that are the same on every machine.

    The last digits of a difference at rounding level depend on the CPU's vector width, the
    thread count and the BLAS library, so they are not printed. Within `tol` (default: the bound
    in `ROUNDING` for the coarser dtype of the two) this says "agrees to rounding (max |diff| <
    tol)"; beyond it, it prints the difference itself, so a real disagreement is never hidden.
    """
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    if got.shape != want.shape:
        raise ValueError(f"got has shape {tuple(got.shape)} but want has shape "
                         f"{tuple(want.shape)}; they should be equal")
    if tol is None:
        tol = max(ROUNDING.get(got.dtype, 1e-5), ROUNDING.get(want.dtype, 1e-5))
    diff = (got.detach().double() - want.detach().double()).abs()
    if diff.isnan().any():
        return "DIFFERS: NaN in the difference"
    worst = diff.max().item() if diff.numel() else 0.0
    bound = f"{tol:.0e}".replace("e-0", "e-").replace("e+0", "e+")   # 1e-5, not 1e-05
    if worst < tol:
        return f"agrees to rounding (max |diff| < {bound})"
    return f"DIFFERS: max |diff| = {worst:.1e}, more than rounding ({bound})"
