"""Stage 5, score: per-cell statuses -> one result per graded cell.

Three steps, each a small function with its own tests (tests/test_grader_stages.py):
`describe` turns one cell's status into words; `judge_cell` says whether one judged cell (a
probe, or a test cell run in the kernel) passed, with what message and tampering flags; `score`
gathers them per exercise, with what went wrong around them (`troubles`) and what tampering was
noticed before each judgement.
"""

from __future__ import annotations

from course_tools.grader.assemble import Plan, RunCell
from course_tools.grader.limits import FEEDBACK_CHARS, MAX_FLAGS, cell_limit
from course_tools.grader.probes import Verdict
from course_tools.grader.read import Source
from course_tools.grader.results import FLAG, PASSED, ExerciseResult
from course_tools.grader.run import RunResult

JUDGED = ("test", "probe")


def _error_text(st: dict, memory_mb: int) -> str:
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
        return f"MemoryError: ran out of memory (cap {memory_mb} MB)"
    return f"{ename}: {evalue}" if evalue else ename


def describe(st: dict, limit: float, memory_mb: int) -> str:
    """One cell's status in words, for a cell that ran under `limit` seconds."""
    status = st.get("status")
    if status == "timeout":
        return f"timed out after {limit:g} s and was interrupted: is there an endless loop?"
    if status == "stuck":
        return (
            f"timed out after {limit:g} s and ignored the interrupt; the kernel was killed "
            "and restarted"
        )
    if status == "died":
        return (
            "the kernel died (os._exit, a crash, or memory beyond the "
            f"{memory_mb} MB cap); the grader restarted it and went on"
        )
    if status == "skipped":
        return st.get("reason") or "not run"
    if status == "quota":
        return (f"the submission {st.get('reason') or 'filled its folders'}: the kernel was "
                "stopped and the rest was not run")
    return _error_text(st, memory_mb)


def judge_cell(cell: RunCell, st: dict, verdict: Verdict | None,
               words: str) -> tuple[bool, str, list[str]]:
    """(passed, message, tampering flags) of one judged cell; `words` describes its status.
    A test cell passes when it ran without error; a probe when the grader's verdict passed."""
    if cell.role == "test":
        ok = st.get("status") == "ok"
        flags = [words] if st.get("ename") == "ReferenceCall" else []
        return ok, "" if ok else words, flags
    if verdict is None:  # the probe's cell failed before any result came back
        return False, words, []
    ok = verdict.passed
    return ok, "" if ok else (verdict.message or words), list(verdict.flags)


def troubles(plan: Plan, statuses: list[dict], *, timeout: float,
             memory_mb: int) -> dict[str, list[str]]:
    """exercise -> what failed around it, outside its judged cells: an answer, a set-up cell or
    a cell the learner added (appended to its feedback in brackets)."""
    found: dict[str, list[str]] = {}
    for cell, st in zip(plan.cells, statuses):
        if cell.role in JUDGED or not cell.exercise or st.get("status") in ("ok", "skipped", None):
            continue
        what = describe(st, cell_limit(cell.role, timeout), memory_mb)
        who = (f"your answer cell `{cell.grade_id}`" if cell.role == "answer" else
               "a set-up cell" if cell.role == "setup" else "a cell you added")
        found.setdefault(cell.exercise, []).append(f"{who}: {what}")
    return found


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def cut(text: str, limit: int = FEEDBACK_CHARS) -> str:
    """`text` at most `limit` characters long (what a submission says is bounded in the report)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _bounded_flags(flags: list[str]) -> list[str]:
    """At most MAX_FLAGS flags, each cut short, and how many more there were."""
    flags = [cut(f, 300) for f in _dedupe(flags)]
    if len(flags) <= MAX_FLAGS:
        return flags
    return flags[:MAX_FLAGS] + [f"and {len(flags) - MAX_FLAGS} more"]


def _feedback(messages: list[str], flags: list[str], parts: list[str]) -> str:
    messages = [cut(m, FEEDBACK_CHARS // 2) for m in _dedupe(messages)]
    text = "; ".join(messages) or "not run"
    if flags:
        rest = "; ".join(m for m in messages if m not in flags)
        text = FLAG + "; ".join(flags) + (f" ({rest})" if rest else "")
    parts = [cut(p, 300) for p in parts[:MAX_FLAGS]]
    return cut(text + ("" if not parts else " [" + "; ".join(parts) + "]"))


def judged_cells(cells: list[RunCell]) -> dict[str, list[int]]:
    """graded grade_id -> the plan indexes of the cells that judge it (probes, test cells)."""
    judged: dict[str, list[int]] = {}
    for i, cell in enumerate(cells):
        if cell.role in JUDGED:
            judged.setdefault(cell.grade_id, []).append(i)
    return judged


def flags_for(cells: list[int], end: int, noticed: list[tuple[int, list[str]]],
              reached: dict[int, list[str]]) -> list[str]:
    """The flags one exercise judged at plan indexes `cells` carries: what was noticed at or
    before its last judgement (every exercise from there on), and what the code each of its
    probes runs names that its check forbids (that exercise only)."""
    at = cells[-1] if cells else end
    return ([f for j, found in noticed if j <= at for f in found]
            + [f for i in cells for f in reached.get(i, [])])


def score(source: Source, plan: Plan, run: RunResult, *, timeout: float, memory_mb: int,
          suspicious: dict[int, list[str]] | None = None,
          reached: dict[int, list[str]] | None = None) -> list[ExerciseResult]:
    """One result per graded cell. An exercise earns its points only when every check judged
    for it in the grader passed (or, for a test cell judged in the kernel, ran without error)
    and nothing flagged tampering before its judgement: the run itself (a forged result), a
    probe's report, a write outside the scratch folder, or a suspicious answer cell; and the
    code each of its probes runs names nothing its check forbids (`reached`, by probe cell)."""
    statuses = run.statuses
    judged = judged_cells(plan.cells[:len(statuses)])
    around = troubles(plan, statuses, timeout=timeout, memory_mb=memory_mb)
    # Tampering noticed at cell j affects every exercise judged at or after j.
    noticed = [(i, list(st.get("intrusions") or [])) for i, st in enumerate(statuses)]
    noticed += list((suspicious or {}).items())
    results = []
    for gid, points, _ in source.graded:
        hint = plan.hints.get(gid, "")
        if gid in plan.missing:
            results.append(ExerciseResult(gid, 0, points, plan.missing[gid], hint=hint))
            continue
        cells = judged.get(gid, [])
        flags = list(run.flags) + flags_for(cells, len(plan.cells), noticed, reached or {})
        passed, messages = bool(cells), []
        for i in cells:
            words = describe(statuses[i], timeout, memory_mb)
            ok, message, more = judge_cell(plan.cells[i], statuses[i], run.verdicts.get(i), words)
            passed, flags = passed and ok, flags + more
            messages.append(message)
        if not cells:
            messages = [describe({"status": "skipped"}, timeout, memory_mb)]
        flags = _bounded_flags(flags)
        if passed and not flags:
            results.append(ExerciseResult(gid, points, points, PASSED, hint=hint))
            continue
        parts = list(around.get(gid, []))
        if gid in plan.answers_missing:
            parts.append("answer cell missing: "
                         + ", ".join(f"`{a}`" for a in plan.answers_missing[gid]))
        results.append(ExerciseResult(gid, 0, points, _feedback(messages, flags, parts),
                                      flagged=bool(flags), hint=hint))
    return results
