"""Stage 5, score: per-cell statuses -> one result per graded cell."""

from __future__ import annotations

from course_tools.grader.assemble import Plan
from course_tools.grader.read import Source
from course_tools.grader.results import FLAG, PASSED, ExerciseResult


def _error_text(st: dict) -> str:
    ename, evalue = st.get("ename") or "Error", (st.get("evalue") or "").strip()
    if ename in ("CheckFailure", "ReferenceCall") and evalue:
        return evalue
    if ename == "AssertionError":
        line = st.get("line", "")
        return (
            ("a test failed: " + evalue)
            if evalue
            else ("a test failed" + (f" at `{line}`" if line else "") + " (AssertionError)")
        )
    if ename == "NotImplementedError":
        return "not written yet" + (f" (hint: {evalue})" if evalue else "")
    if ename == "MemoryError":
        return f"MemoryError: ran out of memory (cap {st.get('memory_mb', '?')} MB)"
    return f"{ename}: {evalue}" if evalue else ename


def _status_text(st: dict, timeout: float, memory_mb: int) -> str:
    status = st.get("status")
    if status == "timeout":
        return f"timed out after {timeout:g} s and was interrupted: is there an endless loop?"
    if status == "stuck":
        return (
            f"timed out after {timeout:g} s and ignored the interrupt; the kernel was killed "
            "and restarted"
        )
    if status == "died":
        return (
            "the kernel died (os._exit, a crash, or memory beyond the "
            f"{memory_mb} MB cap); the grader restarted it and went on"
        )
    if status == "skipped":
        return st.get("reason") or "not run"
    return _error_text(dict(st, memory_mb=memory_mb))


def score(
    source: Source, plan: Plan, statuses: list[dict], *, timeout: float, memory_mb: int
) -> list[ExerciseResult]:
    """Turn per-cell statuses (aligned with plan.cells) into one result per graded cell."""
    by_test: dict[str, dict] = {}
    answer_trouble: dict[str, list[str]] = {}
    for cell, st in zip(plan.cells, statuses):
        if cell.role == "test":
            by_test[cell.grade_id] = st
        elif (
            cell.role == "answer"
            and cell.exercise
            and st.get("status") not in ("ok", "skipped", None)
        ):
            what = _status_text(st, timeout, memory_mb)
            answer_trouble.setdefault(cell.exercise, []).append(
                f"your answer cell `{cell.grade_id}`: {what}"
            )
    results = []
    for gid, points, _ in source.graded:
        hint = plan.hints.get(gid, "")
        if gid in plan.missing:
            results.append(ExerciseResult(gid, 0, points, plan.missing[gid], hint=hint))
            continue
        st = by_test.get(gid, {"status": "skipped", "reason": "not run"})
        if st.get("status") == "ok":
            results.append(ExerciseResult(gid, points, points, PASSED, hint=hint))
            continue
        flagged = st.get("ename") == "ReferenceCall"
        parts = answer_trouble.get(gid, [])
        if gid in plan.answers_missing:
            parts.append(
                "answer cell missing: " + ", ".join(f"`{a}`" for a in plan.answers_missing[gid])
            )
        text = _status_text(st, timeout, memory_mb)
        feedback = (
            (FLAG if flagged else "") + text + ("" if not parts else " [" + "; ".join(parts) + "]")
        )
        results.append(ExerciseResult(gid, 0, points, feedback, flagged=flagged, hint=hint))
    return results
