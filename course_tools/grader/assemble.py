"""Stage 3, assemble: the cells to run, locked ones from the source, answers from the submission.

`assemble` walks the source notebook cell by cell and asks one small function per kind of cell
what to run for it: `answer_cell` (the submission's copy of an answer), `graded_cell` (probes
judged in the grader, or a test cell run in the kernel), `setup_cell` (the source's own code).
`learner_cells` says which of the submission's cells are the learner's own, and after which
source cell each runs. The plan opens with the grader's preflight cell (`preflight.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from course_tools.exercises import hints_in, strip_solution
from course_tools.grader.calls import (
    CheckCall,
    check_calls,
    checker_modules,
    imported_names,
    setup_sources,
)
from course_tools.grader.read import Source, cell_text, cell_type, grade_id, meta
from course_tools.grader.results import CELL_MISSING


@dataclass
class RunCell:
    source: str
    # "preflight" (the grader's, first), "setup" (the source's), "answer", "test" (run in the
    # kernel), "probe" (judged here), "extra" (a cell the learner added)
    role: str
    grade_id: str | None = None
    exercise: str | None = None  # the graded cell an answer/test belongs to
    call: CheckCall | None = None  # a probe's check call; run.py writes its source and cases
    probe: Any = None              # the probes.Probe once prepared
    imports: tuple[str, ...] = ()  # the preflight's checker modules; run.py writes its source


@dataclass
class Plan:
    cells: list[RunCell]
    missing: dict[str, str]  # graded grade_id -> why it is missing
    answers_missing: dict[str, list[str]]  # graded grade_id -> answer ids not in the submission
    hints: dict[str, str]  # graded grade_id -> hint text
    in_kernel: list[str] = field(default_factory=list)  # graded cells judged in the kernel


@dataclass
class LearnerCells:
    """The submission as the assembler reads it."""

    cells: list[dict]  # its cells (malformed entries dropped)
    first: dict[str, int]  # grade_id of the source -> index of the first cell carrying it
    after: dict[str | None, list[str]]  # the learner's own code, by the grade_id it follows


def exercise_of(source: Source) -> dict[int, str]:
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


def learner_cells(source: Source, nb: Any) -> LearnerCells:
    """Which submission cell stands for which source cell, and the learner's own code cells,
    each under the grade_id of the last source cell before it (None: before them all). A
    cell without a grade_id that is an unchanged copy of a source cell is not the learner's."""
    sub_cells = [c for c in nb.get("cells", []) if isinstance(c, dict)]
    first: dict[str, int] = {}
    for k, c in enumerate(sub_cells):
        gid = grade_id(c)
        if gid and gid in source.ids and gid not in first:
            first[gid] = k
    plain_source = {
        c.source.strip() for c in source.nb.cells if c.cell_type == "code" and not grade_id(c)
    }
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
    return LearnerCells(sub_cells, first, after)


def answer_cell(cell: Any, gid: str, ex: str | None, learner: LearnerCells, plan: Plan) -> None:
    """A solution cell of the source: the submission's copy runs, never the source's."""
    if ex and cell.cell_type == "code":
        plan.hints[ex] = "; ".join(filter(None, [plan.hints.get(ex), *hints_in(cell.source)]))
    k = learner.first.get(gid)
    sub = learner.cells[k] if k is not None else None
    if cell.cell_type != "code":
        return
    if sub is not None and cell_type(sub) == "code":
        plan.cells.append(RunCell(cell_text(sub.get("source")), "answer", gid, ex))
    elif ex:
        plan.answers_missing.setdefault(ex, []).append(gid)
    if meta(cell).get("grade") and sub is None:
        plan.missing[gid] = f"{CELL_MISSING}: the answer cell `{gid}` is not in the submission"


def graded_cell(i: int, cell: Any, gid: str, learner: LearnerCells, plan: Plan, *,
                names: dict[str, Any] | None, where: str) -> None:
    """A graded test cell of the source. Grading (`names`: what the set-up cells so far
    imported): a cell of check calls becomes one probe per call, judged in the grader; any
    other cell runs in the kernel as it is. `course check` (`names` None): the cell runs in the
    kernel as the learner sees it, hidden tests removed."""
    if gid not in learner.first:
        plan.missing[gid] = (f"{CELL_MISSING}: the graded cell `{gid}` was deleted or its "
                             "grade_id changed; copy it back from a fresh exercise notebook")
        return
    calls = check_calls(cell.source, names) if names is not None else None
    if calls:
        plan.cells.extend(RunCell("", "probe", gid, gid, call=c) for c in calls)
    elif names is not None:
        plan.cells.append(RunCell(cell.source, "test", gid, gid))
        plan.in_kernel.append(gid)
    else:
        plan.cells.append(RunCell(strip_solution(cell.source, where=f"{where} cell {i}"),
                                  "test", gid, gid))


def setup_cell(cell: Any, gid: str | None, ex: str | None, plan: Plan) -> None:
    """Any other code cell of the source runs as the source has it (an edited copy in the
    submission does not count)."""
    if cell.cell_type == "code" and cell.source.strip():
        plan.cells.append(RunCell(cell.source, "setup", gid, ex))


def assemble(source: Source, nb: Any, *, hidden: bool = True) -> Plan:
    """The cells to run: locked cells from the source, answers and added cells from `nb`.

    With `hidden` (grading) each graded test cell made of check calls becomes one probe per call:
    the test cell itself never runs, the Check judges in the grader. Without it (`course check`)
    the test cells run in the kernel as the learner sees them, hidden tests removed."""
    learner = learner_cells(source, nb)
    owner = exercise_of(source)
    preflight = RunCell("", "preflight", imports=tuple(checker_modules(setup_sources(source))))
    plan = Plan([preflight, *(RunCell(t, "extra") for t in learner.after.get(None, []))],
                {}, {}, {})
    setup_so_far: list[str] = []  # the names check calls refer to
    for i, cell in enumerate(source.nb.cells):
        gid, m, ex = grade_id(cell), meta(cell), owner.get(i)
        if m.get("solution"):
            if not gid:  # cannot be matched to the submission; never run the source's solution
                continue
            answer_cell(cell, gid, ex, learner, plan)
        elif m.get("grade") and gid and cell.cell_type == "code":
            names = imported_names(setup_so_far) if hidden else None
            graded_cell(i, cell, gid, learner, plan, names=names, where=source.name)
        else:
            setup_cell(cell, gid, ex, plan)
            if cell.cell_type == "code" and cell.source.strip():
                setup_so_far.append(cell.source)
        if gid:
            plan.cells.extend(RunCell(t, "extra", None, ex) for t in learner.after.get(gid, []))
    return plan
