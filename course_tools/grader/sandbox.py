"""The kernel's sandbox (Linux, bubblewrap): what a submission's code can see, write and reach.

Inside, the kernel sees the system read-only (/usr, /etc, ...), the Python it runs on and the
grader's own `course_lib` read-only (bound at <scratch>/lib/course_lib, first on its path, so a
checkout that was never installed grades as well), and its submission's own writable folders
(its working copy, the probe files, its HOME and TMPDIR, the kernel's socket files). Nothing
else of the machine: no `solutions/`, no grader files, no other submission, no network
(`--unshare-net`; the kernel talks to the grader over ipc socket files), its own process
namespace (`--unshare-pid`, so no grader process is visible or can be signalled) and an
unprivileged user. The places a cheat would write to (/tmp, the course folder, the grader's
working folder, HOME) are empty host folders bound writable: anything that appears in them is a
write outside the scratch folder, and flags the submission.

Without bubblewrap (macOS, Windows, a Linux without the package) the kernel runs as the grader's
user, and `NOT_SANDBOXED` says so once per run.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

NOT_SANDBOXED = (
    "course grade: the kernel is NOT sandboxed ({why}): a submission's code runs with your "
    "permissions, so it can read solutions/ and your files, write outside its scratch folder "
    "(the grader restores the course files it changes, and flags it) and use the network; "
    "install bubblewrap (Debian: apt-get install bubblewrap) to grade untrusted work."
)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None when bubblewrap works here, else why not (cached: one trial run per process)."""
    if not sys.platform.startswith("linux"):
        return f"no bubblewrap on {sys.platform}"
    if os.environ.get("COURSE_GRADE_NO_SANDBOX"):
        return "COURSE_GRADE_NO_SANDBOX is set"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap is not installed"
    trial = [bwrap, *_system_binds(), "--unshare-all", "--unshare-user", "--uid", "65534",
             "--die-with-parent", "--", sys.executable, "-c", "pass"]
    try:
        done = subprocess.run(trial, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap does not run: {type(e).__name__}"
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        return "bwrap does not run here" + (f": {tail[0][:160]}" if tail else "")
    return None


def _system_binds() -> list[str]:
    args = []
    for d in SYSTEM:
        if os.path.lexists(d):
            args += ["--ro-bind", d, d]
    for d in _python_dirs():
        args += ["--ro-bind", d, d]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for dev in sorted(glob.glob("/dev/nvidia*")) + ["/dev/dri"]:  # a GPU, where there is one
        if os.path.exists(dev):
            args += ["--dev-bind", dev, dev]
    return args


def _python_dirs() -> list[str]:
    """The interpreter and its environment (the venv holds torch, ipykernel, ...)."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    dirs.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return sorted(d for d in dirs if not d.startswith(SYSTEM))


@dataclass
class Layout:
    """One submission's folders. `root` is private to the grader; the kernel sees only `work`
    (its working copy), `io` (the probes' case and outcome files), `ipc` (its sockets), `home`
    (HOME, TMPDIR) and, in the sandbox, `lib` (course_lib, read-only). `ctl` (spec, result,
    collected outcomes) stays out of its reach."""

    root: Path
    work: Path = field(init=False)
    io: Path = field(init=False)
    ipc: Path = field(init=False)
    home: Path = field(init=False)
    lib: Path = field(init=False)
    ctl: Path = field(init=False)
    traps: Path = field(init=False)

    def __post_init__(self):
        for name in ("work", "io", "ipc", "home", "lib", "ctl", "traps"):
            path = self.root / name
            path.mkdir(mode=0o700)
            setattr(self, name, path)
        (self.home / "tmp").mkdir()
        (self.lib / "course_lib").mkdir()  # where the sandbox binds the grader's course_lib

    @classmethod
    def create(cls) -> Layout:
        return cls(Path(tempfile.mkdtemp(prefix="course-grade-")).resolve())


# The grader's environment variables a kernel gets (issue 23: nothing else of the grader's
# environment, which may hold tokens, passwords or paths, reaches a submission): where programs
# and libraries are, the locale, and the numeric, GPU and Triton settings the course reads.
ENV_NAMES = {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONHASHSEED", "MPLBACKEND",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
             "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
             "DNNL_MAX_CPU_ISA", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
             "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
             "COURSE_FLASH_AUTOTUNE", "COURSE_GRADE_RUN", "SYSTEMROOT", "COMSPEC", "PATHEXT",
             "WINDIR"}
ENV_PREFIXES = ("LC_", "TRITON_", "NVIDIA_", "CUDA_", "PYTORCH_", "TORCH_", "TORCHINDUCTOR_",
                "OMP_", "MKL_", "KMP_")


def allowed_env(base: dict[str, str]) -> dict[str, str]:
    """The part of `base` a kernel may see (ENV_NAMES, ENV_PREFIXES)."""
    return {k: v for k, v in base.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


def kernel_env(layout: Layout, base: dict[str, str], python_path: list[str]) -> dict[str, str]:
    """The kernel's environment: the allowed part of the grader's (`allowed_env`), with HOME and
    TMPDIR in its scratch folder."""
    env = allowed_env(base)
    home = layout.home
    # Caches a library would otherwise put in /tmp or ~ (and that the grader's own environment
    # may name: torch records its inductor cache in os.environ once it has used it).
    env.update(HOME=str(home), TMPDIR=str(home / "tmp"), IPYTHONDIR=str(home / ".ipython"),
               MPLCONFIGDIR=str(home / ".mpl"), XDG_CACHE_HOME=str(home / ".cache"),
               TORCHINDUCTOR_CACHE_DIR=str(home / ".cache" / "torchinductor"),
               TRITON_CACHE_DIR=str(home / ".cache" / "triton"))
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(python_path)
    else:
        env.pop("PYTHONPATH", None)
    return env


def hidden_places(course_root: Path, extra: list[Path]) -> list[str]:
    """Where a cheat would look or write: /tmp (other submissions' scratch folders), the course
    folder (solutions/), the grader's working folder, HOME, and any folder the caller names."""
    places = {"/tmp", "/var/tmp", "/dev/shm", str(course_root), os.getcwd(),
              os.path.expanduser("~"), *map(str, extra)}
    real = {os.path.realpath(p) for p in places if p and os.path.isdir(p)}
    return sorted(p for p in real if p != "/")


def wrap(layout: Layout, *, course_lib: Path, python_path: list[str], hide: list[str],
         launcher: str, installed: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The bubblewrap command to put before the kernel's (it ends with "--"), and the traps
    (host folder -> the place it stands for), whose contents the worker watches. `course_lib`
    is bound read-only at layout.lib/course_lib; `launcher` (the kernel's launcher script) and
    the `python_path` folders are bound read-only where they are. `installed`: where the course
    is installed as a package (site-packages), hidden under the same copy."""
    args = [shutil.which("bwrap") or "bwrap", *_system_binds()]
    traps: dict[str, str] = {}
    for k, place in enumerate(hide):
        trap = layout.traps / str(k)
        trap.mkdir()
        args += ["--bind", str(trap), place]
        traps[str(trap)] = place
    for d in _python_dirs():  # the venv may lie under a hidden place (the course folder)
        if any(d == h or d.startswith(h.rstrip("/") + "/") for h in hide):
            args += ["--ro-bind", d, d]
    for d in (launcher, *python_path):  # wherever they are (outside the system folders too)
        if os.path.exists(d):
            args += ["--ro-bind", d, d]
    for d in (layout.work, layout.io, layout.ipc, layout.home):
        args += ["--bind", str(d), str(d)]
    args += ["--ro-bind", str(course_lib), str(layout.lib / "course_lib")]
    if installed is not None and installed != course_lib:
        args += ["--ro-bind", str(course_lib), str(installed)]
    # ipykernel would take the namespace's init (pid 1) for a dead parent: no parent polling,
    # the kernel dies with bubblewrap instead (--die-with-parent).
    args += ["--remount-ro", "/", "--chdir", str(layout.work), "--unsetenv", "JPY_PARENT_PID",
             "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
             "--die-with-parent", "--"]
    return args, traps
