"""The grader's limits, in one place: what run.py (the grader) and worker.py (its subprocess) share.

A learner's cells (answers, added cells, probes, test cells) get the `--timeout` the instructor
chose. The course's own cells (the preflight and the set-up cells of the source notebook) get
`setup_limit(timeout)`, which is generous: on a busy 2-core machine importing torch and the
checkers alone can take longer than a learner's limit of a few seconds, and a learner must not
score 0 for the machine's load.
"""

from __future__ import annotations

GRACE_S = 10  # after interrupting a timed-out cell, wait at most this long before killing it
MAX_RESTARTS = 3  # kernel restarts per submission before the remaining cells are skipped
STARTUP_S = 60  # seconds allowed for a kernel to start
SETUP_S = 300  # seconds allowed for one of the course's own cells (at least the learner's limit)
COURSE_ROLES = ("preflight", "setup")  # the cells that come from the course, not the learner
# What one submission may take from the machine beyond its kernel's --memory-mb (issue 23).
FILE_MB = 128  # the largest file a kernel may write (RLIMIT_FSIZE; a result file is 64 MB at most)
DISK_MB = 512  # all the files in a submission's folders together, checked while each cell runs
DISK_FILES = 20_000  # ... and how many there may be
WORKER_MB = 768  # the worker's own memory (RLIMIT_DATA): what a kernel's messages may cost it
MESSAGE_MB = 16  # the largest message the worker accepts from a kernel (a larger one is dropped)
FEEDBACK_CHARS = 2_000  # one exercise's feedback in the report
MAX_FLAGS = 8  # tampering flags named per exercise (the rest are counted)


def setup_limit(timeout: float) -> float:
    """The per-cell limit of the course's own cells: SETUP_S, or the learner's if that is longer."""
    return max(float(timeout), float(SETUP_S))


def cell_limit(role: str, timeout: float) -> float:
    """The per-cell limit of a plan cell with this role, given the learner's `timeout`."""
    return setup_limit(timeout) if role in COURSE_ROLES else float(timeout)


def grace(timeout: float) -> float:
    """How long an interrupted cell may take to stop before its kernel is killed."""
    return min(GRACE_S, max(2.0, timeout / 2))


def run_deadline(limits: list[float]) -> float:
    """How long a whole submission may take: every cell timing out, plus restarts and replays."""
    return STARTUP_S * (MAX_RESTARTS + 2) + sum(t + GRACE_S for t in limits) * 2 + \
        (max(limits, default=0) + GRACE_S) * 4
