"""Predictions committed first: the grader's side of `course_lib.checks`' record lines.

A predict exercise's check records its FIRST run in the kernel and prints one record line in its
cell's output (`course_lib.checks.parse_records` reads it). Grading re-runs the submission's
answer cells, so the value the probe gets back is whatever the answer cell holds now; `review`
replaces it with what the submitted notebook recorded, and fails the commit when

* the submission carries no record (the check cell never ran, or its output was cleared): the
  prediction was never committed before the answer showed;
* a cell that reveals the answer (the Check's `reveals`) ran before the commit: its execution
  count in the submission is lower than the record's.

One hook in the pipeline calls it, between the run and the score:
`run.verdicts = predictions.review(nb, plan, run.verdicts, path=path)`.

A hand-in from the course's hub is judged on the hub's record instead (`from_service`, which
`course grade` of a hub collection sets up: course_tools/hub/collection.py): the value the
hub's service kept at the learner's first commit, and the service's times of that commit and of
the first run of each cell that reveals the answer. The notebook's record lines are then not
read at all, so a hand-edited output, a restart or a second kernel changes nothing; no commit
on the hub's record is no commit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from course_tools.grader.probes import Verdict
from course_tools.grader.read import cell_text, grade_id


def _outputs_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs") or []:
        if not isinstance(out, dict):
            continue
        if out.get("output_type") == "stream":
            parts.append(cell_text(out.get("text")))
        elif isinstance(out.get("data"), dict):
            parts.append(cell_text(out["data"].get("text/plain")))
    return "\n".join(parts)


def submitted(nb: Any) -> dict[str, dict]:
    """grade_id -> {"count": execution count, "records": {name: (at, value)}} of the
    submission's cells (the first cell per grade_id)."""
    from course_lib.checks import parse_records

    found: dict[str, dict] = {}
    for cell in (nb.get("cells") or []) if isinstance(nb, dict) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        gid = grade_id(cell)
        if gid and gid not in found:
            count = cell.get("execution_count")
            found[gid] = {"count": count if isinstance(count, int) else None,
                          "records": parse_records(_outputs_text(cell))}
    return found


def judge_record(check: Any, gid: str, cells: dict[str, dict], info: dict,
                 flags: list[str]) -> Verdict:
    """The verdict on one committing check from the submission's record of it."""
    from course_lib.checks import CheckFailure

    record = cells.get(gid, {}).get("records", {}).get(check.name)
    if record is None:
        return Verdict(False, f"{check.name}: the submission holds no committed answer (the "
                       "check cell's output records your first run; run it once, before "
                       "anything shows the result, and keep its output)", flags)
    at, committed = record
    for reveal in info.get("reveals", ()):
        shown = cells.get(reveal, {}).get("count")
        if shown is not None and (at is None or shown < at):
            return Verdict(False, f"{check.name}: the cell `{reveal}` that shows the result ran "
                           f"(at [{shown}]) before your commit (at [{at}])", flags)
    outcome = [{"ok": {"value": committed, "at": at, "first": True}}]
    try:
        message = check.judge([None], outcome)
    except CheckFailure as e:
        return Verdict(False, str(e), flags)
    return Verdict(not flags, str(message), flags)


_SERVICE: dict[str, dict] = {}   # resolved submission path -> its learner's record on the hub
_SERVICE_LOCK = threading.Lock()


@contextlib.contextmanager
def from_service(records: dict[Path, dict]):
    """While inside, judge each of these submissions' commits on the hub's record of its
    learner ({"commits": {check id: {"value": repr, "t": time}}, "reveals": {grade_id: t}})."""
    keys = {str(Path(p).resolve()): r for p, r in records.items()}
    with _SERVICE_LOCK:
        _SERVICE.update(keys)
    try:
        yield
    finally:
        with _SERVICE_LOCK:
            for k in keys:
                _SERVICE.pop(k, None)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + " UTC"


def judge_service(check: Any, record: dict, info: dict, flags: list[str]) -> Verdict:
    """The verdict on one committing check from the hub's record of the learner."""
    from course_lib.checks import CheckFailure, plain_literal

    kept = (record.get("commits") or {}).get(check.id)
    try:
        committed, at = plain_literal(kept["value"]), float(kept["t"])
    except (TypeError, KeyError, ValueError):
        return Verdict(False, f"{check.name}: the hub holds no commit of it (the check cell's "
                       "first run on the hub records it; run it once, before anything shows "
                       "the result)", flags)
    for reveal in info.get("reveals", ()):
        shown = (record.get("reveals") or {}).get(reveal)
        if isinstance(shown, (int, float)) and shown < at:
            return Verdict(False, f"{check.name}: the cell `{reveal}` that shows the result ran "
                           f"(at {_clock(shown)}) before your commit (at {_clock(at)}), by the "
                           "hub's clock", flags)
    outcome = [{"ok": {"value": committed, "at": None, "first": True}}]
    try:
        message = check.judge([None], outcome)
    except CheckFailure as e:
        return Verdict(False, str(e), flags)
    return Verdict(not flags, str(message), flags)


def review(nb: Any, plan: Any, verdicts: dict[int, Verdict],
           path: Any = None) -> dict[int, Verdict]:
    """The probes' verdicts with every committing check judged on the submission's record (the
    hub's, for a submission `from_service` names)."""
    from course_lib.checks import commit_info

    with _SERVICE_LOCK:
        service = _SERVICE.get(str(Path(path).resolve())) if path is not None else None
    cells = None
    out = dict(verdicts)
    for i, cell in enumerate(plan.cells):
        call = getattr(cell, "call", None)
        if cell.role != "probe" or call is None:
            continue
        info = commit_info(call.check.id)
        if info is None:
            continue
        flags = list(verdicts[i].flags) if i in verdicts else []
        if service is not None:
            out[i] = judge_service(call.check, service, info, flags)
            continue
        cells = submitted(nb) if cells is None else cells
        out[i] = judge_record(call.check, cell.grade_id, cells, info, flags)
    return out
