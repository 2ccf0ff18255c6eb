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
`run.verdicts = predictions.review(nb, plan, run.verdicts)`.
"""

from __future__ import annotations

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


def review(nb: Any, plan: Any, verdicts: dict[int, Verdict]) -> dict[int, Verdict]:
    """The probes' verdicts with every committing check judged on the submission's record."""
    from course_lib.checks import commit_info

    cells = None
    out = dict(verdicts)
    for i, cell in enumerate(plan.cells):
        call = getattr(cell, "call", None)
        if cell.role != "probe" or call is None:
            continue
        info = commit_info(call.check.id)
        if info is None:
            continue
        cells = submitted(nb) if cells is None else cells
        flags = list(verdicts[i].flags) if i in verdicts else []
        out[i] = judge_record(call.check, cell.grade_id, cells, info, flags)
    return out
