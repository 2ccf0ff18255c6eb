"""What this machine offers the course: versions, CPU/GPU, Triton, and notebook set-up."""

from __future__ import annotations

import importlib.util
import os
import platform
import random
import sys
from pathlib import Path

import numpy as np
import torch

from course_lib.measure import set_threads


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and PyTorch so every notebook prints the same numbers on every run."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_notebook(seed: int = 0, threads: int = 1) -> None:
    """The first call of every notebook: seeds, one CPU thread, print precision, a plotting style.

    One thread makes float reductions happen in the same order on every machine, so a laptop with
    16 cores prints the same digits as the 2-core machine the outputs were saved on (the course's
    tensors are small; extra threads buy little). Printing 4 decimals hides what is left.
    Benchmarks that compare against multi-threaded code set their own thread count.
    """
    seed_everything(seed)
    set_threads(threads)
    torch.set_printoptions(precision=4, sci_mode=False)
    np.set_printoptions(precision=4, suppress=True)
    try:
        import matplotlib.pyplot as plt

        plt.rcParams.update({"figure.dpi": 90, "axes.grid": False, "figure.figsize": (6, 3.5)})
    except ImportError:  # matplotlib is a dependency; stay importable without it anyway
        pass


def pick_device() -> torch.device:
    """CUDA when a GPU is present, else the CPU. Every chapter runs on either."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def triton_available() -> bool:
    """Whether the `triton` package is importable here (never touches its GPU driver)."""
    return importlib.util.find_spec("triton") is not None


def choose_triton_mode() -> None:
    """Without a CUDA GPU, make Triton run its kernels through its CPU interpreter.

    Triton fixes interpreted-or-compiled once, when it is first imported, and other libraries
    import it as a side effect (torch's profiler and FLOP counter do). So this runs when
    `course_lib` is imported, before any course module can pull Triton in; it sets
    TRITON_INTERPRET=1 only if nobody set it, and costs nothing if Triton is never used.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_status() -> str:
    """One line saying how chapter 08's Triton kernel will run here.

    Never touches `triton.runtime.driver` (that fails without a GPU driver); only asks whether
    the package is installed and whether CUDA is available.
    """
    if not triton_available():
        return "not installed (Linux only): chapter 08 runs its pure-torch tiled reference instead"
    if torch.cuda.is_available():
        return "installed, compiled kernels on " + torch.cuda.get_device_name(0)
    return "installed, no GPU: kernels run through Triton's CPU interpreter (TRITON_INTERPRET=1)"


def environment_report() -> dict[str, str]:
    """Versions and hardware, as a dict of short strings (chapter 00 prints it)."""
    def version(name: str) -> str:
        try:
            from importlib.metadata import version as v

            return v(name)
        except Exception:
            return "not installed"

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU only)"
    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "matplotlib": version("matplotlib"),
        "ipywidgets": version("ipywidgets"),
        "triton": version("triton"),
        "gpu": gpu,
        "triton status": triton_status(),
        "cpu capability": _cpu_capability(),
        "environment": _environment(),
    }


def _cpu_capability() -> str:
    """The vector instructions torch's own kernels use here (AVX512, AVX2, DEFAULT, ...): they
    decide the order in which sums are added, so the last digits of a result depend on them."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # an older torch
        return "unknown"


def _environment() -> str:
    """Which Python runs the notebook, without printing a path of this machine."""
    prefix = Path(sys.prefix).resolve()
    if prefix == Path(__file__).resolve().parents[1] / ".venv":
        return "the course's .venv (made by `make lab` or `make test`)"
    if os.environ.get("CONDA_DEFAULT_ENV"):
        return f"conda environment {os.environ['CONDA_DEFAULT_ENV']!r}"
    if sys.prefix != sys.base_prefix:
        return f"a virtual environment named {prefix.name!r}"
    return "the system's Python (no virtual environment)"
