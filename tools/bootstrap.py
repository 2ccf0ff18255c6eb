#!/usr/bin/env python3
"""Set up the course's virtual environment if needed, then open the lab or run the tests.

    python3 tools/bootstrap.py lab     # JupyterLab on the course, with the course's kernel
    python3 tools/bootstrap.py test    # the whole test suite (unit tests, nbval, exercises)
    python3 tools/bootstrap.py test-all  # the same and the sweeps it leaves out (nbgrader on
                                         # every chapter): before a workshop
    python3 tools/bootstrap.py setup   # only create/refresh .venv

Standard library only, so it runs on a fresh machine (Linux, macOS, Windows:
`py tools\\bootstrap.py`).
The environment lives in .venv and is rebuilt only when pyproject.toml or constraints.txt change.
Extra arguments after `test` go to pytest (e.g. `-k lookup`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".course-install-stamp"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def say(msg: str) -> None:
    print(f"[course] {msg}", flush=True)


def run(*cmd, **kw) -> None:
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kw)


def wanted_stamp() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
        h.update((ROOT / name).read_bytes())
    h.update(sys.version.encode())
    return h.hexdigest()


def setup() -> None:
    """Create .venv and install the course with the pinned versions, unless already done."""
    if sys.version_info < (3, 10):  # noqa: UP036 - this script runs before any venv exists
        sys.exit(f"The course needs Python 3.10 or newer; this is {sys.version.split()[0]}.")
    setup_hub_proxy()
    stamp = wanted_stamp()
    if PY.exists() and STAMP.exists() and STAMP.read_text() == stamp:
        return
    if VENV.exists() and not PY.exists():
        shutil.rmtree(VENV)
    if not PY.exists():
        say(f"creating a virtual environment in {VENV.name}/")
        run(sys.executable, "-m", "venv", VENV)
    say("installing the course and its pinned dependencies (first time: a few minutes)")
    run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    run(PY, "-m", "pip", "install", "--quiet", "-c", "constraints.txt", "-e", ".[test]")
    # Register the environment's kernel so JupyterLab runs notebooks with this interpreter.
    run(PY, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
        "--display-name", "Python 3 (attention course)")
    hide_nbgrader_ui()
    STAMP.write_text(stamp)
    say("environment ready")


def hide_nbgrader_ui() -> None:
    """nbgrader is a test dependency (tests/test_nbgrader.py runs its command line); its
    JupyterLab and server extensions would add an Nbgrader menu, a Validate button and a Create
    Assignment panel to the learners' JupyterLab and the hub's servers. Off, in .venv only."""
    jupyter = [PY, "-m", "jupyter"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    for ext in ("formgrader", "validate_assignment", "assignment_list", "course_list"):
        run(*jupyter, "server", "extension", "disable", "--sys-prefix",
            f"nbgrader.server_extensions.{ext}", **quiet)
    run(*jupyter, "labextension", "disable", "--level=sys_prefix", "@jupyter/nbgrader", **quiet)


def setup_hub_proxy() -> None:
    """The workshop hub's proxy (configurable-http-proxy, pinned in package-lock.json), when npm
    is here and node_modules/ is older than the lock file. Without npm, only `course hub` and its
    test need it: they say so."""
    npm, lock = shutil.which("npm"), ROOT / "package-lock.json"
    installed = ROOT / "node_modules" / ".package-lock.json"  # npm writes it after an install
    if npm is None or not lock.exists():
        return
    if installed.exists() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return
    say("installing the workshop hub's proxy (npm ci, package-lock.json)")
    try:
        run(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
    except (subprocess.CalledProcessError, OSError) as e:
        say(f"could not install the hub's proxy ({e}); everything but `course hub` works")


def lab(args: list[str]) -> None:
    setup()
    say("opening JupyterLab on notebooks/00_start_here.ipynb (Ctrl-C to stop)")
    # containers and hosted machines often run as root
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args = ["--allow-root", *args]
    run(BIN / "jupyter", "lab", "--notebook-dir", ROOT, "notebooks/00_start_here.ipynb", *args)


# The numeric setting the tests run under: not the one the notebooks were written with. Authors
# execute notebooks with their machine's own vector instructions (AVX-512, AVX2, NEON, ...) and
# thread count; the tests use torch's plain, unvectorised kernels and one thread, which add up sums
# in another order. A committed output whose digits depend on the CPU then fails on the author's
# own machine, before it fails on a learner's. Set either variable yourself to test another one.
SECOND_NUMERIC_SETTING = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}


def test(args: list[str], sweep: bool = False) -> None:
    setup()
    env = {**SECOND_NUMERIC_SETTING, **os.environ, "PYTHONHASHSEED": "0"}
    env.pop("MPLBACKEND", None)  # notebooks need the inline backend to emit their figures
    say("checking that exercises/ matches solutions/")
    run(BIN / "course", "build-exercises", "--check", env=env)
    say("linting the Python code (ruff, configured in pyproject.toml)")
    run(BIN / "ruff", "check", ".", env=env)
    setting = ", ".join(f"{k}={env[k]}" for k in SECOND_NUMERIC_SETTING)
    say(f"running the test suite: unit tests, notebooks (nbval), exercises, grader ({setting})")
    # One worker more than the cores: a third of the suite's time is spent waiting (kernels and
    # servers starting, timeouts of hostile submissions), which the extra worker fills.
    cpus = os.cpu_count() or 1
    workers = str(min(cpus + 1, 8)) if cpus >= 2 else "0"
    # a file at a time on each worker, the longest first (tests/conftest.py)
    run(PY, "-m", "pytest", "-n", workers, "--dist", "loadfile",
        *(["-m", "sweep or not sweep"] if sweep else []),
        "tests", "notebooks", "solutions",
        "--nbval", "--nbval-current-env", "--nbval-cell-timeout", "120",
        "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", *args, env=env)


def main() -> None:
    commands = {"lab": lab, "test": test, "test-all": lambda a: test(a, sweep=True),
                "setup": lambda a: setup()}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    command, args = sys.argv[1], sys.argv[2:]
    try:
        commands[command](args)
    except subprocess.CalledProcessError as e:
        sys.exit(e.returncode)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
