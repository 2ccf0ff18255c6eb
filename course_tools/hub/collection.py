"""The instructor's collection of hand-ins, and `course grade` of it keyed by learner.

A collection is a folder the hub's hand-in service writes (`handin.py`), one folder per learner:

    collection/.course-collection
    collection/ana/2026-12-01T20-30-05.123456Z_01_soft_dictionary.ipynb
    collection/ana/2026-12-01T20-41-17.004211Z_01_soft_dictionary.ipynb   # a second hand-in

    collection/.records/ana.jsonl     # what the hub recorded while ana worked (records.py)

Nothing is ever overwritten: every hand-in is a new file named by its UTC time (microseconds,
so names sort in time order). `course grade collection/` grades each learner's latest hand-in of
each notebook through the grader's pipeline (sandboxed as any `course grade`) and reports by
learner: a table, `--csv` (one row per learner, notebook and exercise) or `--json` (an object
keyed by learner name).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from course_tools.hub import COLLECTION_MARKER

STAMP = "%Y-%m-%dT%H-%M-%S"
HANDIN_FILE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{6}Z)_(.+\.ipynb)$")
# What a hand-in may be called, and who may hand in (the hub's usernames are checked the same way)
NOTEBOOK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,120}\.ipynb$")
LEARNER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class Handin:
    learner: str
    notebook: str   # the name it was handed in under, e.g. 01_soft_dictionary.ipynb
    stamp: str      # UTC, as in the file name: 2026-12-01T20-30-05.123456Z
    path: Path

    @property
    def handed_in(self) -> str:
        """ISO 8601 in UTC, to the second: 2026-12-01T20:30:05Z."""
        day, clock = self.stamp.split("T")
        return f"{day}T{clock[:8].replace('-', ':')}Z"


class Collection:
    """The folder of hand-ins: only the hub's service (root) writes it, nobody else reads it."""

    def __init__(self, root: Path, *, create: bool = False):
        self.root = Path(root)
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)
            marker = self.root / COLLECTION_MARKER
            if not marker.exists():
                marker.write_text(json.dumps({"kind": "attention-course hand-in collection",
                                              "layout": "<learner>/<UTC time>_<notebook>"}) + "\n")

    def add(self, learner: str, notebook: str, data: bytes, *, now: float | None = None) -> Handin:
        """File one hand-in under the learner's name; never replaces an earlier one."""
        if not LEARNER_NAME.match(learner):
            raise ValueError(f"learner name {learner!r} is not one the hub hands out")
        if not NOTEBOOK_NAME.match(notebook):
            raise ValueError(f"{notebook!r} is not a notebook file name (letters, digits, "
                             "'.', '_', '-' and spaces, ending in .ipynb)")
        folder = self.root / learner
        folder.mkdir(mode=0o700, exist_ok=True)
        moment = time.time() if now is None else now
        for _ in range(1000):
            stamp = stamp_of(moment)
            path = folder / f"{stamp}_{notebook}"
            try:  # O_EXCL: two hand-ins in the same microsecond still both land
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                moment += 1e-6
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return Handin(learner, notebook, stamp, path)
        raise RuntimeError(f"could not find a free name for {notebook!r} in {folder}")

    def handins(self, learner: str | None = None) -> list[Handin]:
        """Every hand-in (of one learner), oldest first within each learner."""
        found = []
        folders = [self.root / learner] if learner else sorted(self.root.iterdir())
        for folder in folders:
            if not folder.is_dir() or not LEARNER_NAME.match(folder.name):
                continue
            for path in sorted(folder.iterdir()):
                m = HANDIN_FILE.match(path.name)
                if m and path.is_file():
                    found.append(Handin(folder.name, m.group(2), m.group(1), path))
        return found

    def latest(self) -> list[tuple[Handin, int]]:
        """Each learner's latest hand-in of each notebook, with how many hand-ins it had."""
        groups: dict[tuple[str, str], list[Handin]] = {}
        for h in self.handins():
            groups.setdefault((h.learner, h.notebook), []).append(h)
        return [(hs[-1], len(hs)) for _, hs in sorted(groups.items())]


def stamp_of(moment: float) -> str:
    t = datetime.fromtimestamp(moment, tz=timezone.utc)
    return f"{t.strftime(STAMP)}.{t.microsecond:06d}Z"


def is_collection(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / COLLECTION_MARKER).is_file()


# ---------------------------------------------------------------- grading, keyed by learner


def grade_collection(root: Path, **grade_options):
    """Grade each learner's latest hand-ins; -> [(Handin, count, SubmissionResult)].

    Predictions are judged on the hub's record of each learner (records.py: the first commit
    the service kept, with its clock's times), not on the record lines in the hand-in."""
    from course_tools.grader import predictions
    from course_tools.grader.pipeline import grade
    from course_tools.hub.records import Records

    latest = Collection(root).latest()
    records = Records(root)
    kept = {h.path: records.for_grading(h.learner) for h, _ in latest}
    with predictions.from_service(kept):
        results = grade([h.path for h, _ in latest], **grade_options) if latest else []
    by_path = {r.submission: r for r in results}
    return [(h, n, by_path[str(h.path)]) for h, n in latest]


def format_csv(graded) -> str:
    from course_tools.grader.report import SafeWriter

    buf = io.StringIO()
    w = SafeWriter(buf)  # a feedback or name starting with "=" must not become a formula
    w.writerow(["learner", "notebook", "handed_in", "handins", "exercise", "score", "max_score",
                "flagged", "feedback"])
    for h, n, r in graded:
        head = [h.learner, h.notebook, h.handed_in, n]
        if not r.exercises:
            w.writerow([*head, "", 0, 0, "", r.error or ""])
        for e in r.exercises:
            ex = e.to_json()
            w.writerow([*head, e.id, ex["score"], ex["max_score"], "yes" if e.flagged else "",
                        e.feedback])
    return buf.getvalue()


def format_json(graded) -> str:
    out: dict[str, dict] = {}
    for h, n, r in graded:
        learner = out.setdefault(h.learner, {"score": 0, "max_score": 0, "notebooks": []})
        entry = r.to_json()
        entry.update(submission=str(h.path), notebook=h.notebook, handed_in=h.handed_in,
                     handins=n)
        learner["notebooks"].append(entry)
        learner["score"] += entry["score"]
        learner["max_score"] += entry["max_score"]
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


def format_table(graded) -> str:
    from course_tools.grader.report import format_table as table

    for h, n, r in graded:
        times = "1 hand-in" if n == 1 else f"the latest of {n} hand-ins"
        r.submission = f"{h.learner}: {h.notebook} (handed in {h.handed_in}, {times})"
    lines = [table([r for _, _, r in graded]).rstrip("\n"), ""]
    totals: dict[str, list[float]] = {}
    for h, _, r in graded:
        t = totals.setdefault(h.learner, [0, 0])
        t[0] += r.score
        t[1] += r.max_score
    for learner, (score, best) in totals.items():
        lines.append(f"{learner:<24} {score:g}/{best:g}")
    return "\n".join(lines) + "\n"


def main_grade(args) -> int:
    """`course grade COLLECTION`: what `pipeline.main_grade` does, reported by learner."""
    (root,) = args.submissions
    try:
        graded = grade_collection(
            Path(root), timeout=args.timeout, memory_mb=args.memory_mb, jobs=args.jobs,
            solutions_dir=args.solutions, python_path=args.python_path,
            sandbox=not args.no_sandbox,
            warn=lambda line: print(line, file=sys.stderr, flush=True))
    except RuntimeError as e:  # the grader's GradingEnvironmentError: as `course grade` does
        if type(e).__name__ != "GradingEnvironmentError":
            raise
        print(f"course grade: {e}", file=sys.stderr)
        return 2
    if not graded:
        print(f"course grade: {root}: the collection holds no hand-ins yet", file=sys.stderr)
    fmt = format_json if args.json else format_csv if args.csv else format_table
    sys.stdout.write(fmt(graded))
    return 0
