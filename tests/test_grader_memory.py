"""The kernel's memory, read from outside it (course_tools/grader/memory.py): what a check that
must not build the score grid is judged on when grading (issue 23, "measure from outside")."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from course_tools.grader.memory import Growth

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

HOLD = """
import sys, time
sys.stdin.readline()                      # wait until the sampler has its baseline
{body}
print("done", flush=True)
sys.stdin.readline()
"""


def _grown(body: str) -> float:
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(body=body)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        time.sleep(0.3)  # Python is up
        with Growth(proc.pid) as g:
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "done"
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(10)
    finally:
        proc.kill()
    return g.mb


def test_a_grid_held_for_a_moment_is_seen():
    # 256 MB filled, then freed at once: the peak still counts
    assert _grown("x = bytearray(256 * 2**20)\ndel x") >= 200


def test_memory_used_in_a_forked_child_counts():
    body = ("import os\npid = os.fork()\nif pid == 0:\n    x = bytearray(256 * 2**20)\n"
            "    time.sleep(0.2)\n    os._exit(0)\nos.waitpid(pid, 0)")
    assert _grown(body) >= 200


def test_a_small_computation_grows_little():
    assert _grown("x = [i * i for i in range(10_000)]") < 20


def test_nothing_is_measured_without_a_process():
    with Growth(None) as g:
        pass
    assert g.mb is None
