"""The kernel's memory, read from outside it (course_tools/grader/memory.py): what a check that
must not build the score grid is judged on when grading (issue 23, "measure from outside")."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from course_tools.grader.memory import Growth

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
# /proc (Linux) and `ps` (macOS, imitated here on Linux, where ps reads the same numbers)
VIA = pytest.mark.parametrize("via", ["proc", "ps"])

HOLD = """
import sys, time
sys.stdin.readline()                      # wait until the sampler has its baseline
{body}
print("done", flush=True)
sys.stdin.readline()
"""


def _grown(body: str, via: str = "proc") -> float:
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(body=body)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        time.sleep(0.3)  # Python is up
        with Growth(proc.pid, via=via) as g:
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "done"
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(10)
    finally:
        proc.kill()
    return g.mb


@VIA
def test_a_grid_held_for_a_moment_is_seen(via):
    # 256 MB filled, then freed at once: the peak still counts. `ps` reads every 20 ms, so
    # there it is held for 0.1 s (a grid of that size takes longer than that to compute)
    hold = "time.sleep(0.1)\n" if via == "ps" else ""
    assert _grown(f"x = bytearray(256 * 2**20)\n{hold}del x", via) >= 200


@VIA
def test_memory_used_in_a_forked_child_counts(via):
    body = ("import os\npid = os.fork()\nif pid == 0:\n    x = bytearray(256 * 2**20)\n"
            "    time.sleep(0.2)\n    os._exit(0)\nos.waitpid(pid, 0)")
    assert _grown(body, via) >= 200


@VIA
def test_a_small_computation_grows_little(via):
    assert _grown("x = [i * i for i in range(10_000)]", via) < 20


def test_nothing_is_measured_without_a_process():
    with Growth(None) as g:
        pass
    assert g.mb is None
