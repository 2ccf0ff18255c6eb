"""Stage 5, score: per-cell statuses -> one result per graded cell."""

from __future__ import annotations

from course_tools.grader.assemble import Plan
from course_tools.grader.read import Source
from course_tools.grader.results import FLAG, PASSED, ExerciseResult
from course_tools.grader.run import RunResult


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


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def score(source: Source, plan: Plan, run: RunResult, *, timeout: float, memory_mb: int,
          suspicious: dict[int, list[str]] | None = None) -> list[ExerciseResult]:
    """One result per graded cell. An exercise earns its points only when every check judged
    for it in the grader passed (or, for a test cell judged in the kernel, ran without error)
    and nothing flagged tampering before its judgement: the run itself (a forged result), a
    probe's report, a write outside the scratch folder, or a suspicious answer cell."""
    statuses = run.statuses
    judged_at: dict[str, int] = {}
    trouble: dict[str, list[str]] = {}
    for i, (cell, st) in enumerate(zip(plan.cells, statuses)):
        if cell.role in ("test", "probe"):
            judged_at[cell.grade_id] = i
        elif cell.exercise and st.get("status") not in ("ok", "skipped", None):
            what = _status_text(st, timeout, memory_mb)
            who = (f"your answer cell `{cell.grade_id}`" if cell.role == "answer" else
                   "a set-up cell" if cell.role == "setup" else "a cell you added")
            trouble.setdefault(cell.exercise, []).append(f"{who}: {what}")
    # Tampering noticed at cell j affects every exercise judged at or after j.
    noticed = [(i, list(st.get("intrusions") or [])) for i, st in enumerate(statuses)]
    noticed += list((suspicious or {}).items())
    results = []
    for gid, points, _ in source.graded:
        hint = plan.hints.get(gid, "")
        if gid in plan.missing:
            results.append(ExerciseResult(gid, 0, points, plan.missing[gid], hint=hint))
            continue
        at = judged_at.get(gid, len(plan.cells))
        flags = list(run.flags) + [f for j, found in noticed if j <= at for f in found]
        messages = []
        passed = True
        for i, (cell, st) in enumerate(zip(plan.cells, statuses)):
            if cell.grade_id != gid or cell.role not in ("test", "probe"):
                continue
            verdict = run.verdicts.get(i)
            if cell.role == "test":
                ok = st.get("status") == "ok"
                if st.get("ename") == "ReferenceCall":
                    flags.append(_status_text(st, timeout, memory_mb))
                message = "" if ok else _status_text(st, timeout, memory_mb)
            elif verdict is None:
                ok, message = False, _status_text(st, timeout, memory_mb)
            else:
                ok = verdict.passed
                flags += verdict.flags
                message = "" if ok else (verdict.message or _status_text(st, timeout, memory_mb))
            passed = passed and ok
            messages.append(message)
        if gid not in judged_at:
            passed, messages = False, [_status_text({"status": "skipped"}, timeout, memory_mb)]
        flags = _dedupe(flags)
        if passed and not flags:
            results.append(ExerciseResult(gid, points, points, PASSED, hint=hint))
            continue
        parts = list(trouble.get(gid, []))
        if gid in plan.answers_missing:
            parts.append("answer cell missing: "
                         + ", ".join(f"`{a}`" for a in plan.answers_missing[gid]))
        text = "; ".join(_dedupe(messages)) or "not run"
        if flags:
            rest = "; ".join(m for m in _dedupe(messages) if m not in flags)
            text = FLAG + "; ".join(flags) + (f" ({rest})" if rest else "")
        feedback = text + ("" if not parts else " [" + "; ".join(parts) + "]")
        results.append(ExerciseResult(gid, 0, points, feedback, flagged=bool(flags), hint=hint))
    return results
