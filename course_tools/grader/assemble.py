"""Stage 3, assemble: the cells to run, locked ones from the source, answers from the submission."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from course_tools.exercises import hints_in, strip_solution
from course_tools.grader.calls import CheckCall, check_calls, imported_names
from course_tools.grader.read import Source, cell_text, cell_type, grade_id, meta
from course_tools.grader.results import CELL_MISSING


@dataclass
class RunCell:
    source: str
    role: str  # "setup", "answer", "test" (run in the kernel), "probe" (judged here), "extra"
    grade_id: str | None = None
    exercise: str | None = None  # the graded cell an answer/test belongs to
    call: CheckCall | None = None  # a probe's check call; run.py writes its source and cases
    probe: Any = None              # the probes.Probe once prepared


@dataclass
class Plan:
    cells: list[RunCell]
    missing: dict[str, str]  # graded grade_id -> why it is missing
    answers_missing: dict[str, list[str]]  # graded grade_id -> answer ids not in the submission
    hints: dict[str, str]  # graded grade_id -> hint text
    in_kernel: list[str] = field(default_factory=list)  # graded cells judged in the kernel


def _exercise_of(source: Source) -> dict[int, str]:
    """Map each cell index to the graded cell it leads up to (answers belong to the next test)."""
    owner, pending = {}, []
    graded_at = {i: gid for gid, _, i in source.graded}
    for i in range(len(source.nb.cells)):
        pending.append(i)
        if i in graded_at:
            for j in pending:
                owner[j] = graded_at[i]
            pending = []
    return owner


def assemble(source: Source, nb: Any, *, hidden: bool = True) -> Plan:
    """The cells to run: locked cells from the source, answers and added cells from `nb`.

    With `hidden` (grading) each graded test cell made of check calls becomes one probe per call:
    the test cell itself never runs, the Check judges in the grader. Without it (`course check`)
    the test cells run in the kernel as the learner sees them, hidden tests removed."""
    sub_cells = [c for c in nb.get("cells", []) if isinstance(c, dict)]
    first: dict[str, int] = {}
    for k, c in enumerate(sub_cells):
        gid = grade_id(c)
        if gid and gid in source.ids and gid not in first:
            first[gid] = k
    # Unlabelled source code cells: the submission's unchanged copies of them are not extras.
    plain_source = {
        c.source.strip() for c in source.nb.cells if c.cell_type == "code" and not grade_id(c)
    }
    # Every other submission code cell is the learner's own: it runs after the cell it followed.
    after: dict[str | None, list[str]] = {}
    anchor: str | None = None
    for k, c in enumerate(sub_cells):
        gid = grade_id(c)
        if gid and first.get(gid) == k:
            anchor = gid
            continue
        text = cell_text(c.get("source"))
        if cell_type(c) != "code" or not text.strip():
            continue
        if not gid and text.strip() in plain_source:
            continue
        after.setdefault(anchor, []).append(text)

    owner = _exercise_of(source)
    cells = [RunCell(t, "extra") for t in after.get(None, [])]
    missing, answers_missing, hints = {}, {}, {}
    in_kernel: list[str] = []
    setup: list[str] = []  # the source's set-up cells so far: the names check calls refer to
    for i, cell in enumerate(source.nb.cells):
        gid, m = grade_id(cell), meta(cell)
        ex = owner.get(i)
        if m.get("solution"):
            if not gid:  # cannot be matched to the submission; never run the source's solution
                continue
            if ex and cell.cell_type == "code":
                hints[ex] = "; ".join(filter(None, [hints.get(ex), *hints_in(cell.source)]))
            k = first.get(gid)
            sub = sub_cells[k] if k is not None else None
            if cell.cell_type == "code":
                if sub is not None and cell_type(sub) == "code":
                    cells.append(RunCell(cell_text(sub.get("source")), "answer", gid, ex))
                elif ex:
                    answers_missing.setdefault(ex, []).append(gid)
                if m.get("grade") and sub is None:
                    missing[gid] = (
                        f"{CELL_MISSING}: the answer cell `{gid}` is not in the submission"
                    )
        elif m.get("grade") and gid and cell.cell_type == "code":
            calls = check_calls(cell.source, imported_names(setup)) if hidden else None
            if gid in first and calls:
                cells.extend(RunCell("", "probe", gid, gid, call=c) for c in calls)
            elif gid in first:
                text = (
                    cell.source
                    if hidden
                    else strip_solution(cell.source, where=f"{source.name} cell {i}")
                )
                cells.append(RunCell(text, "test", gid, gid))
                if hidden:
                    in_kernel.append(gid)
            else:
                missing[gid] = (
                    f"{CELL_MISSING}: the graded cell `{gid}` was deleted or its grade_id "
                    "changed; copy it back from a fresh exercise notebook"
                )
        elif cell.cell_type == "code" and cell.source.strip():
            cells.append(RunCell(cell.source, "setup", gid, ex))
            setup.append(cell.source)
        if gid:
            cells.extend(RunCell(t, "extra", None, ex) for t in after.get(gid, []))
    return Plan(cells, missing, answers_missing, hints, in_kernel)
