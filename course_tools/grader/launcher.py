"""The kernel's launcher: `python -I launcher.py MEMORY_MB FILE_MB KERNEL_CMD...` (POSIX).

It runs in the kernel's own process before ipykernel (inside the sandbox's command when there is
one, which binds this file read-only): cap memory, cap the size of any file it writes
(RLIMIT_FSIZE: a larger write fails with EFBIG, which Python raises as OSError), no core files,
die with the worker (PR_SET_PDEATHSIG), then become the kernel with `execv`. It imports only the
standard library (`-I`: not even its own folder is on the path), so it runs wherever the
kernel's Python runs.

The cap is RLIMIT_DATA (every writable private mapping: the heap, NumPy and torch buffers, thread
stacks), not RLIMIT_AS: address space that is only reserved (glibc reserves an arena per thread;
CUDA reserves tens of GB) does not count, so the cap means what an instructor expects from
"memory" (measured here: with a 1 GB cap, a learner gets 750 MB under RLIMIT_DATA and 300 MB under
RLIMIT_AS after importing torch); on a GPU box, CUDA's reservations should not hit it either (not
tested on a GPU). Linux only: macOS does not enforce it; Windows has no rlimits, and there the
worker starts the kernel without this launcher.
"""

import os
import sys


def limit(memory_mb: int, file_mb: int = 0) -> None:
    """Cap the data segment at `memory_mb` (Linux; 0: no cap), every file written at `file_mb`
    (0: no cap) and switch off core files."""
    try:
        import resource

        if memory_mb > 0 and sys.platform.startswith("linux"):
            resource.setrlimit(resource.RLIMIT_DATA, (memory_mb << 20, memory_mb << 20))
        if file_mb > 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError, AttributeError):
        pass


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the worker that started it dies."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the worker's own clean-up kills the kernel
        pass


def main(argv: list[str]) -> None:
    memory_mb, file_mb, cmd = int(argv[0]), int(argv[1]), argv[2:]
    limit(memory_mb, file_mb)
    die_with_parent()
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
