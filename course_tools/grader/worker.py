"""Grade exercise notebooks honestly, and survive whatever a submission does.

`course grade` (instructors) and `course check` (learners) both come here. For each submission:

1. Read its bytes (never write them) and parse it. A file that is not a notebook becomes an
   error result, never a crash.
2. Match it to its source in `solutions/`: by the notebook's `course` metadata, else by the
   `grade_id`s of its cells, else by file name, so a renamed file still finds its source.
3. Assemble the notebook to run, in the source's order: every locked cell (set-up, test) comes
   from the source, with hidden tests put back when grading; each answer cell comes from the
   submission, and cells the learner added run after the cell they followed. A graded cell the
   submission deleted scores 0 with the feedback "cell missing".
4. Run it in a worker subprocess (`python -m course_lib.grading --worker`), in a fresh kernel
   whose working directory is a scratch folder holding a copy of the submission, with a per-cell
   time limit (the kernel is interrupted and later cells still run; a kernel that ignores the
   interrupt is killed and restarted) and a memory cap (RLIMIT_DATA, set in the kernel process
   before ipykernel starts; Linux only, elsewhere no cap). A kernel that dies (os._exit, a
   segfault) is restarted, the cells that ran before are replayed, and grading goes on.
5. Score: each graded cell earns its points when it runs without error, else 0 with the
   checker's message as feedback. An answer that runs the course's own reference is flagged
   (the checkers' `forbid` raises `ReferenceCall`).

The grader's own process only reads the submissions, and a submission's code runs in its own
scratch folder (deleted afterwards), so what it writes or deletes by relative path is its own
copy. Code that goes after absolute paths runs with the grader's permissions, as it would in
Jupyter: grade untrusted work in a container or as an unprivileged user.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # The worker never validates notebooks; skip jsonschema's optional IRI checker, whose grammar
    # takes seconds to import (nbclient imports nbformat, which imports jsonschema).
    sys.modules.setdefault("rfc3987_syntax", None)

import nbformat

from course_tools.exercises import BEGIN_SOLUTION, HINT, strip_solution

GRACE_S = 10           # after interrupting a timed-out cell, wait at most this long before killing the kernel
MAX_RESTARTS = 3       # kernel restarts per submission before the remaining cells are skipped
MAX_BYTES = 50 << 20   # a submission larger than this is not read
STARTUP_S = 60         # seconds allowed for a kernel to start
RESULT_MARK = "COURSE-GRADE-RESULT "
PASSED = "passed"
CELL_MISSING = "cell missing"
FLAG = "FLAGGED: "
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
GENERATED_FROM = re.compile(r"solutions/([^\s`/]+\.ipynb)")


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class ExerciseResult:
    id: str
    score: float
    max_score: float
    feedback: str
    flagged: bool = False   # ran the course's reference instead of the learner's own code
    hint: str = ""          # the `# HINT:` of its answer cells (shown by `course check`)

    def to_json(self) -> dict:
        return {"id": self.id, "score": _num(self.score), "max_score": _num(self.max_score),
                "feedback": self.feedback}


@dataclass
class SubmissionResult:
    submission: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None
    source: str | None = None   # the solutions/ notebook it was matched to
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(e.score for e in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(e.max_score for e in self.exercises)

    def to_json(self) -> dict:
        return {"submission": self.submission, "score": _num(self.score),
                "max_score": _num(self.max_score),
                "exercises": [e.to_json() for e in self.exercises], "error": self.error}


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(float(x), 4)


# --------------------------------------------------------------------------------------------
# Source notebooks and matching


def _meta(cell: Any) -> dict:
    """A cell's nbgrader metadata, or {} when it is absent or malformed."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    m = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return m if isinstance(m, dict) else {}


def _grade_id(cell: Any) -> str | None:
    gid = _meta(cell).get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def _text(source: Any) -> str:
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    return ""


def _cell_type(cell: Any) -> str:
    t = cell.get("cell_type") if isinstance(cell, dict) else None
    return t if isinstance(t, str) else ""


@dataclass
class Source:
    """A parsed solution notebook: the one thing shared between submissions."""
    path: Path
    nb: Any
    graded: list[tuple[str, float, int]]   # (grade_id, points, cell index) of graded code cells
    ids: set[str]

    @property
    def name(self) -> str:
        return self.path.name


def default_solutions_dir(folder: str = "solutions") -> Path:
    """The course's own solutions/ (next to course_lib), else ./solutions."""
    here = Path(__file__).resolve().parent.parent / folder
    return here if here.is_dir() else Path(folder)


def default_check_dir() -> Path:
    """Where `course check` takes its check cells from: solutions/, or, in a copy of the course
    handed out without solutions, the exercise notebooks themselves (same check cells, no hidden
    tests, which `check` does not run anyway)."""
    solutions = default_solutions_dir()
    return solutions if any(solutions.glob("*.ipynb")) else default_solutions_dir("exercises")


def load_sources(solutions_dir: Path | None = None) -> dict[str, Source]:
    solutions_dir = Path(solutions_dir) if solutions_dir else default_solutions_dir()
    sources = {}
    for path in sorted(solutions_dir.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        graded = []
        for i, cell in enumerate(nb.cells):
            m = _meta(cell)
            if cell.cell_type == "code" and m.get("grade") and _grade_id(cell):
                graded.append((m["grade_id"], float(m.get("points", 0) or 0), i))
        ids = {gid for gid in map(_grade_id, nb.cells) if gid}
        sources[path.name] = Source(path, nb, graded, ids)
    return sources


def match_source(nb: Any, sources: dict[str, Source], filename: str = "") -> Source | None:
    """Which solution notebook a submission comes from, even renamed or with cells deleted."""
    ids = {gid for gid in map(_grade_id, nb.get("cells", [])) if gid}
    generated = ""
    metadata = nb.get("metadata")
    course = metadata.get("course") if isinstance(metadata, dict) else None
    if isinstance(course, dict) and isinstance(course.get("generated"), str):
        m = GENERATED_FROM.search(course["generated"])
        generated = m.group(1) if m else ""
    best, best_key = None, (0, 0, 0)
    for name, src in sources.items():
        key = (len(ids & src.ids), name == generated, name == Path(filename).name)
        if key > best_key:
            best, best_key = src, key
    return best


# --------------------------------------------------------------------------------------------
# Assembling the notebook that runs


@dataclass
class RunCell:
    source: str
    role: str                  # "setup", "answer", "test", "extra"
    grade_id: str | None = None
    exercise: str | None = None  # the graded cell an answer/test belongs to


@dataclass
class Plan:
    cells: list[RunCell]
    missing: dict[str, str]          # graded grade_id -> why it is missing
    answers_missing: dict[str, list[str]]  # graded grade_id -> answer ids not in the submission
    hints: dict[str, str]            # graded grade_id -> hint text


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


def _hints(text: str) -> list[str]:
    """The `# HINT:` lines just above a solution region (or above its stub, in an exercise)."""
    lines = text.split("\n")
    return [HINT.match(a).group(1).strip() for a, b in zip(lines, lines[1:])
            if (BEGIN_SOLUTION in b or "# YOUR CODE HERE" in b) and HINT.match(a)]


def assemble(source: Source, nb: Any, *, hidden: bool = True) -> Plan:
    """The cells to run: locked cells from the source, answers and added cells from `nb`."""
    sub_cells = [c for c in nb.get("cells", []) if isinstance(c, dict)]
    first: dict[str, int] = {}
    for k, c in enumerate(sub_cells):
        gid = _grade_id(c)
        if gid and gid in source.ids and gid not in first:
            first[gid] = k
    # Unlabelled source code cells: the submission's unchanged copies of them are not extras.
    plain_source = {c.source.strip() for c in source.nb.cells
                    if c.cell_type == "code" and not _grade_id(c)}
    # Every other submission code cell is the learner's own: it runs after the cell it followed.
    after: dict[str | None, list[str]] = {}
    anchor: str | None = None
    for k, c in enumerate(sub_cells):
        gid = _grade_id(c)
        if gid and first.get(gid) == k:
            anchor = gid
            continue
        text = _text(c.get("source"))
        if _cell_type(c) != "code" or not text.strip():
            continue
        if not gid and text.strip() in plain_source:
            continue
        after.setdefault(anchor, []).append(text)

    owner = _exercise_of(source)
    cells = [RunCell(t, "extra") for t in after.get(None, [])]
    missing, answers_missing, hints = {}, {}, {}
    for i, cell in enumerate(source.nb.cells):
        gid, m = _grade_id(cell), _meta(cell)
        ex = owner.get(i)
        if m.get("solution"):
            if not gid:  # cannot be matched to the submission; never run the source's solution
                continue
            if ex and cell.cell_type == "code":
                hints[ex] = "; ".join(filter(None, [hints.get(ex), *_hints(cell.source)]))
            k = first.get(gid)
            sub = sub_cells[k] if k is not None else None
            if cell.cell_type == "code":
                if sub is not None and _cell_type(sub) == "code":
                    cells.append(RunCell(_text(sub.get("source")), "answer", gid, ex))
                elif ex:
                    answers_missing.setdefault(ex, []).append(gid)
                if m.get("grade") and sub is None:
                    missing[gid] = f"{CELL_MISSING}: the answer cell `{gid}` is not in the submission"
        elif m.get("grade") and gid and cell.cell_type == "code":
            if gid in first:
                text = cell.source if hidden else strip_solution(cell.source, where=f"{source.name} cell {i}")
                cells.append(RunCell(text, "test", gid, gid))
            else:
                missing[gid] = (f"{CELL_MISSING}: the graded cell `{gid}` was deleted or its grade_id "
                                "changed; copy it back from a fresh exercise notebook")
        elif cell.cell_type == "code" and cell.source.strip():
            cells.append(RunCell(cell.source, "setup", gid, ex))
        if gid:
            cells.extend(RunCell(t, "extra", None, ex) for t in after.get(gid, []))
    return Plan(cells, missing, answers_missing, hints)


# --------------------------------------------------------------------------------------------
# Scoring the statuses the worker reports


def _error_text(st: dict) -> str:
    ename, evalue = st.get("ename") or "Error", (st.get("evalue") or "").strip()
    if ename in ("CheckFailure", "ReferenceCall") and evalue:
        return evalue
    if ename == "AssertionError":
        line = st.get("line", "")
        return ("a test failed: " + evalue) if evalue else \
               ("a test failed" + (f" at `{line}`" if line else "") + " (AssertionError)")
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
        return (f"timed out after {timeout:g} s and ignored the interrupt; the kernel was killed "
                "and restarted")
    if status == "died":
        return ("the kernel died (os._exit, a crash, or memory beyond the "
                f"{memory_mb} MB cap); the grader restarted it and went on")
    if status == "skipped":
        return st.get("reason") or "not run"
    return _error_text(dict(st, memory_mb=memory_mb))


def score(source: Source, plan: Plan, statuses: list[dict], *, timeout: float,
          memory_mb: int) -> list[ExerciseResult]:
    """Turn per-cell statuses (aligned with plan.cells) into one result per graded cell."""
    by_test: dict[str, dict] = {}
    answer_trouble: dict[str, list[str]] = {}
    for cell, st in zip(plan.cells, statuses):
        if cell.role == "test":
            by_test[cell.grade_id] = st
        elif cell.role == "answer" and cell.exercise and st.get("status") not in ("ok", "skipped", None):
            what = _status_text(st, timeout, memory_mb)
            answer_trouble.setdefault(cell.exercise, []).append(f"your answer cell `{cell.grade_id}`: {what}")
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
            parts.append("answer cell missing: " + ", ".join(f"`{a}`" for a in plan.answers_missing[gid]))
        text = _status_text(st, timeout, memory_mb)
        feedback = (FLAG if flagged else "") + text + ("" if not parts else " [" + "; ".join(parts) + "]")
        results.append(ExerciseResult(gid, 0, points, feedback, flagged=flagged, hint=hint))
    return results


# --------------------------------------------------------------------------------------------
# Grading submissions (the parent process)


def _expand(paths: list[Path]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(q for q in sorted(p.rglob("*.ipynb")) if ".ipynb_checkpoints" not in q.parts)
        else:
            out.append(p)
    return out


def _read_notebook(path: Path) -> tuple[bytes | None, Any, str | None]:
    """(bytes, notebook, error). Only reads the file."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            return None, None, "not a file"
        if size > MAX_BYTES:
            return None, None, f"file too large ({size / 2**20:.0f} MB; the limit is {MAX_BYTES >> 20} MB)"
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, None, "file not found"
    except OSError as e:
        return None, None, f"cannot read the file: {e}"
    try:
        text = data.decode("utf-8")
        try:
            nb = nbformat.reads(text, as_version=4)
        except Exception:  # noqa: BLE001 - a damaged v4 notebook: keep the cells that are intact
            nb = json.loads(text)
            if not (isinstance(nb, dict) and nb.get("nbformat") == 4):
                raise
        if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as e:  # noqa: BLE001 - any parse failure is the submission's problem
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return data, None, f"not a readable Jupyter notebook ({msg})"
    return data, nb, None


def _worker_env(jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env["MPLBACKEND"] = "agg"  # no figures are shown while grading; skip rendering them
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, jobs))))
    env.pop("JPY_PARENT_PID", None)
    return env


def grade_one(path: Path, sources: dict[str, Source], *, timeout: float = 60, memory_mb: int = 4096,
              hidden: bool = True, jobs: int = 1, label: str | None = None) -> SubmissionResult:
    """Grade one submission; never raises for anything the submission contains."""
    start = time.monotonic()
    result = SubmissionResult(label or str(path))
    data, nb, error = _read_notebook(Path(path))
    if error:
        result.error = error
        return result
    source = match_source(nb, sources, Path(path).name)
    if source is None:
        result.error = ("matches no notebook in solutions/: none of its cells carries a grade_id "
                        "from there, and its name is not one of theirs")
        return result
    result.source = str(source.path)
    try:
        plan = assemble(source, nb, hidden=hidden)
    except Exception as e:  # noqa: BLE001 - a malformed submission must not stop the run
        result.error = f"could not assemble the notebook: {type(e).__name__}: {e}"
        result.exercises = [ExerciseResult(g, 0, p, "not run") for g, p, _ in source.graded]
        return result
    statuses, error = _run_in_worker(Path(path).name, data, plan, timeout=timeout,
                                     memory_mb=memory_mb, jobs=jobs)
    result.error = error
    result.exercises = score(source, plan, statuses, timeout=timeout, memory_mb=memory_mb)
    result.seconds = time.monotonic() - start
    return result


def _run_in_worker(name: str, data: bytes, plan: Plan, *, timeout: float, memory_mb: int,
                   jobs: int) -> tuple[list[dict], str | None]:
    """Run the plan's cells in a worker subprocess, in a scratch copy; return per-cell statuses."""
    n = len(plan.cells)
    scratch = Path(tempfile.mkdtemp(prefix="course-grade-"))
    control = Path(tempfile.mkdtemp(prefix="course-grade-ctl-"))  # not reachable by ../ from the kernel
    work = scratch / "work"
    work.mkdir()
    (work / (name if name.endswith(".ipynb") else "submission.ipynb")).write_bytes(data)
    spec = {"cells": [c.source for c in plan.cells], "cwd": str(work), "timeout": timeout,
            "memory_mb": memory_mb, "grace": min(GRACE_S, max(2.0, timeout / 2))}
    (control / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    # Enough for every cell to time out, plus restarts and replays.
    deadline = STARTUP_S * (MAX_RESTARTS + 2) + (timeout + GRACE_S) * (n + 2) * 2
    cmd = [sys.executable, "-m", "course_tools.grader.worker", "--worker", str(control / "spec.json")]
    error = None
    statuses: list[dict] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(control),
                                env=_worker_env(jobs), start_new_session=True)
        try:
            out, err = proc.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            error = f"grading did not finish within {deadline:.0f} s; the rest was not run"
        for line in out.decode("utf-8", "replace").splitlines():
            if line.startswith(RESULT_MARK):
                reply = json.loads(line[len(RESULT_MARK):])
                statuses, error = reply["statuses"], reply["error"] or error
        if not statuses and error is None:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
            error = (f"the grading worker stopped (exit status {proc.returncode})"
                     + (": " + " | ".join(tail) if tail else ""))
    finally:
        _remove(scratch)
        _remove(control)
    if len(statuses) < n:
        reason = error or "not run"
        statuses = statuses + [{"status": "skipped", "reason": reason}] * (n - len(statuses))
    return statuses, error


def _kill_group(pid: int) -> None:
    """Kill a process and its group (POSIX); on Windows, just the process."""
    sig = getattr(signal, "SIGKILL", signal.SIGTERM)
    try:
        os.killpg(pid, sig)
    except (OSError, AttributeError):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _remove(path: Path) -> None:
    def make_writable(func, p, _exc):  # a cell may have chmod-ed its files
        try:
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass
    try:
        for d in [path, *(q for q in path.rglob("*") if q.is_dir() and not q.is_symlink())]:
            os.chmod(d, 0o700)
    except OSError:
        pass
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)


def default_jobs() -> int:
    """Submissions graded at once: 2 on a 2-core laptop, up to 4 on bigger machines, 1 on one core."""
    cpus = os.cpu_count() or 1
    return 1 if cpus < 2 else min(4, max(2, cpus // 2))


def grade(paths: list[Path], *, timeout: float = 60, memory_mb: int = 4096, hidden: bool = True,
          jobs: int | None = None, solutions_dir: Path | None = None) -> list[SubmissionResult]:
    """Grade every submission (directories expand to the notebooks inside), concurrently."""
    sources = load_sources(solutions_dir)
    files = _expand(paths)
    jobs = max(1, min(jobs or default_jobs(), len(files) or 1))

    def one(p: Path) -> SubmissionResult:
        try:
            return grade_one(p, sources, timeout=timeout, memory_mb=memory_mb, hidden=hidden,
                             jobs=jobs, label=str(p))
        except Exception as e:  # noqa: BLE001 - a grader bug on one file must not stop the others
            return SubmissionResult(str(p), error=f"internal grader error: {type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, files))


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# Output: table, JSON, CSV


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def _wrap(text: str, width: int, max_lines: int = 3) -> list[str]:
    """Feedback in at most `max_lines` lines of `width`, the last one cut with an ellipsis."""
    import textwrap

    lines = textwrap.wrap(" ".join(text.split()), max(20, width)) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = _short(lines[-1] + " …", width)
    return lines


def format_table(results: list[SubmissionResult], *, hints: bool = False, width: int = 110) -> str:
    lines = []
    for r in results:
        head = f"{r.submission}"
        if r.source:
            head += f"  (source: {Path(r.source).name})"
        lines.append(f"{head}   total {_num(r.score)}/{_num(r.max_score)}")
        if r.error:
            lines.append(f"  error: {_short(r.error, width)}")
        id_w = max([len(e.id) for e in r.exercises] + [8])
        pad = " " * (id_w + 13)
        for e in r.exercises:
            pts = f"{_num(e.score)}/{_num(e.max_score)}"
            text = _wrap(e.feedback, width - id_w - 13)
            lines.append(f"  {e.id:<{id_w}}  {pts:>7}  {text[0]}")
            lines.extend(pad + t for t in text[1:])
            if hints and e.score < e.max_score and e.hint and e.hint not in e.feedback:
                lines.extend(pad + t for t in _wrap("hint: " + e.hint, width - id_w - 13, 2))
        lines.append("")
    if len(results) > 1:
        graded = [r for r in results if r.exercises]
        errors = sum(1 for r in results if r.error)
        total = sum(r.score for r in graded)
        best = sum(r.max_score for r in graded)
        lines.append(f"{len(results)} submissions graded: {_num(total)}/{_num(best)} points in all; "
                     f"{errors} with errors.")
    return "\n".join(lines).rstrip() + "\n"


def format_json(results: list[SubmissionResult]) -> str:
    return json.dumps([r.to_json() for r in results], indent=2, ensure_ascii=False) + "\n"


def format_csv(results: list[SubmissionResult]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["submission", "exercise", "score", "max_score", "feedback"])
    for r in results:
        if not r.exercises:
            w.writerow([r.submission, "", 0, 0, r.error or ""])
        for e in r.exercises:
            w.writerow([r.submission, e.id, _num(e.score), _num(e.max_score), e.feedback])
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# The `course grade` / `course check` commands


def main_grade(args: argparse.Namespace) -> int:
    missing = [p for p in args.submissions if not Path(p).exists()]
    results = grade(list(args.submissions), timeout=args.timeout, memory_mb=args.memory_mb,
                    jobs=getattr(args, "jobs", None), solutions_dir=getattr(args, "solutions", None))
    if getattr(args, "json", False):
        sys.stdout.write(format_json(results))
    elif getattr(args, "csv", False):
        sys.stdout.write(format_csv(results))
    else:
        sys.stdout.write(format_table(results))
    for p in missing:
        print(f"course grade: {p}: no such file or folder", file=sys.stderr)
    return 1 if missing else 0


def main_check(args: argparse.Namespace) -> int:
    path = Path(args.notebook)
    if not path.exists():
        print(f"course check: {path}: no such file", file=sys.stderr)
        return 1
    print(f"Running {path} in a fresh kernel (a scratch copy; your file is not changed)...", flush=True)
    results = grade([path], timeout=args.timeout, memory_mb=getattr(args, "memory_mb", 4096),
                    hidden=False, jobs=1, solutions_dir=getattr(args, "solutions", None) or default_check_dir())
    sys.stdout.write(format_table(results, hints=True))
    r = results[0]
    print()
    if r.exercises and not r.error:
        if r.score == r.max_score:
            print("All checks pass. Compare your code with the solution notebook, then go on.")
        else:
            todo = sum(1 for e in r.exercises if e.score < e.max_score)
            print(f"{todo} exercise(s) to go. The grader also runs hidden tests, so a check that "
                  "passes here can still fail there on an edge case.")
    return 0


# --------------------------------------------------------------------------------------------
# The worker: runs one assembled notebook in a fresh, limited kernel (a separate process)

# Runs in the kernel's own process before ipykernel: cap memory, no core files, and die with the
# worker (PR_SET_PDEATHSIG), then become the kernel. The cap is RLIMIT_DATA (every writable
# private mapping: the heap, NumPy and torch buffers, thread stacks), not RLIMIT_AS: address space
# that is only reserved (glibc reserves an arena per thread; CUDA reserves tens of GB) does not
# count, so the cap means what an instructor expects from "memory" (measured here: with a 1 GB
# cap, a learner gets 750 MB under RLIMIT_DATA and 300 MB under RLIMIT_AS after importing torch);
# on a GPU box, CUDA's reservations should not hit it either (not tested on a GPU). Linux only:
# macOS does not enforce it, Windows has no rlimits; there the kernel runs without a cap.
_LAUNCHER = """
import os, sys
mb, cmd = int(sys.argv[1]), sys.argv[2:]
try:
    import resource
    if mb > 0 and sys.platform.startswith("linux"):
        resource.setrlimit(resource.RLIMIT_DATA, (mb << 20, mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except (ImportError, ValueError, OSError, AttributeError):
    pass
try:
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except Exception:
    pass
os.execv(cmd[0], cmd)
"""


def _kernel_manager_class():
    from jupyter_client.manager import AsyncKernelManager

    class LimitedKernelManager(AsyncKernelManager):
        memory_mb = 0

        def format_kernel_cmd(self, extra_arguments=None):
            # Always this environment's ipykernel (never whatever a "python3" kernelspec names).
            cmd = [sys.executable, "-m", "ipykernel_launcher", "-f",
                   os.path.realpath(self.connection_file), *(extra_arguments or [])]
            if os.name != "posix":
                return cmd
            return [sys.executable, "-c", _LAUNCHER, str(self.memory_mb), *cmd]

    return LimitedKernelManager


def _client_class():
    from nbclient import NotebookClient

    class GradingClient(NotebookClient):
        """Keeps only error outputs (a cell printing gigabytes cannot fill the worker's memory)
        and ignores widget traffic."""

        def output(self, outs, msg, display_id, cell_index):
            if msg["msg_type"] != "error":
                return None
            return super().output(outs, msg, display_id, cell_index)

        def handle_comm_msg(self, outs, msg, cell_index):
            return None

    return GradingClient


def _failing_line(traceback: list[str]) -> str:
    """The `---->` line of the last frame of an IPython traceback, without colours."""
    for frame in reversed(traceback or []):
        for line in ANSI.sub("", frame).splitlines():
            if line.lstrip().startswith("---->") or line.lstrip().startswith("->"):
                return re.sub(r"^\s*-*>\s*\d*\s*", "", line).strip()[:200]
    return ""


async def _run_cells(spec: dict) -> dict:
    """Run the cells; {"statuses": one dict per cell, "error": None or why the kernel failed}."""
    from nbclient.exceptions import DeadKernelError

    timeout = float(spec["timeout"])
    memory_mb = int(spec["memory_mb"])
    grace = float(spec.get("grace", GRACE_S))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in spec["cells"]]
    client = _client_class()(nb, timeout=timeout, interrupt_on_timeout=True, allow_errors=True,
                             record_timing=False, startup_timeout=STARTUP_S,
                             shutdown_kernel="immediate", iopub_timeout=5)
    launch = {"cwd": spec["cwd"], "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
              "stdin": subprocess.DEVNULL}

    async def start() -> None:
        km = _kernel_manager_class()(kernel_name="python3")
        km.memory_mb = memory_mb
        client.km = km
        await client.async_start_new_kernel(**launch)
        await client.async_start_new_kernel_client()

    async def stop() -> None:
        try:
            await asyncio.wait_for(client._async_cleanup_kernel(), 20)
        except Exception:  # noqa: BLE001 - already dead is fine
            pgid = getattr(getattr(client.km, "provisioner", None), "pgid", None)
            if pgid:
                _kill_group(pgid)
        client.kc = client.km = None

    async def run(i: int) -> dict:
        cell = nb.cells[i]
        before = asyncio.all_tasks()
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(client.async_execute_cell(cell, i, store_history=False),
                                   timeout + grace)
        except (DeadKernelError, asyncio.TimeoutError, asyncio.CancelledError):
            for task in asyncio.all_tasks() - before - {asyncio.current_task()}:
                task.cancel()
            stuck = time.monotonic() - t0 >= timeout
            return {"status": "stuck" if stuck else "died"}
        except Exception as e:  # noqa: BLE001 - report, never crash the worker
            return {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        if not errors:
            return {"status": "ok"}
        e = errors[-1]
        if e.get("ename") == "KeyboardInterrupt" and time.monotonic() - t0 >= timeout:
            return {"status": "timeout"}
        return {"status": "error", "ename": e.get("ename", ""), "evalue": ANSI.sub("", e.get("evalue", ""))[:4000],
                "line": _failing_line(e.get("traceback", []))}

    statuses: list[dict] = []
    restarts = 0
    try:
        await start()
    except Exception as e:  # noqa: BLE001 - e.g. a memory cap too small for Python itself
        reason = (f"the kernel could not start ({type(e).__name__}: {str(e)[:200]}); "
                  f"is the memory cap of {memory_mb} MB too small?")
        return {"statuses": [{"status": "skipped", "reason": reason}] * len(nb.cells), "error": reason}
    try:
        i = 0
        while i < len(nb.cells):
            st = await run(i)
            statuses.append(st)
            i += 1
            if st["status"] not in ("died", "stuck"):
                continue
            await stop()
            if restarts >= MAX_RESTARTS:
                reason = f"not run: the kernel died or hung {restarts + 1} times before this cell"
                statuses += [{"status": "skipped", "reason": reason}] * (len(nb.cells) - i)
                break
            restarts += 1
            try:
                await start()
            except Exception as e:  # noqa: BLE001
                reason = f"not run: the kernel could not be restarted ({type(e).__name__})"
                statuses += [{"status": "skipped", "reason": reason}] * (len(nb.cells) - i)
                break
            # Rebuild the state the later cells expect: replay what ran normally before.
            for j in range(i - 1):
                if statuses[j]["status"] in ("ok", "error"):
                    replay = await run(j)
                    if replay["status"] in ("died", "stuck"):
                        reason = "not run: the kernel died again while replaying earlier cells"
                        statuses += [{"status": "skipped", "reason": reason}] * (len(nb.cells) - i)
                        i = len(nb.cells)
                        break
    finally:
        await stop()
    return {"statuses": statuses, "error": None}


def _worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    if sys.platform == "win32":  # pyzmq's asyncio sockets need a selector loop on Windows
        asyncio.set_event_loop_policy(asyncio.WindowsSelectorEventLoopPolicy())
    result = asyncio.run(_run_cells(spec))
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(sys.argv[2]))
    print("usage: python -m course_lib.grading --worker SPEC.json (internal; use `course grade`)",
          file=sys.stderr)
    sys.exit(2)
