"""The stages in order for one submission and for many; the `course grade`/`check` commands."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course_tools.grader.assemble import assemble
from course_tools.grader.calls import checker_names
from course_tools.grader.match import match_source
from course_tools.grader.preflight import GradingEnvironmentError, environment_problem
from course_tools.grader.read import (
    Source,
    default_check_dir,
    default_solutions_dir,
    expand,
    load_sources,
    read_notebook,
)
from course_tools.grader.report import format_csv, format_json, format_table
from course_tools.grader.results import ExerciseResult, SubmissionResult
from course_tools.grader.run import Settings, run_submission
from course_tools.grader.sandbox import NOT_SANDBOXED
from course_tools.grader.scan import scan_plan
from course_tools.grader.score import score


def grade_one(path: Path, sources: dict[str, Source], settings: Settings, *,
              hidden: bool = True, label: str | None = None) -> SubmissionResult:
    """Grade one submission; never raises for anything the submission contains. Raises
    GradingEnvironmentError when the run says nothing about the submission: the kernel did
    not start, or the course's own first cells failed before any submitted code ran."""
    start = time.monotonic()
    result = SubmissionResult(label or str(path))
    data, nb, error = read_notebook(Path(path))
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
    found = scan_plan(plan.cells, checker_names(source)) if hidden else {}
    run = run_submission(Path(path).name, data, plan, settings)
    problem = environment_problem(plan, run, timeout=settings.timeout,
                                  memory_mb=settings.memory_mb, grader_lib=settings.course_lib,
                                  python_path=settings.given_path)
    if problem:
        raise GradingEnvironmentError(f"the grading environment is broken, not {path}: {problem}")
    result.error = run.error
    result.exercises = score(source, plan, run, timeout=settings.timeout,
                             memory_mb=settings.memory_mb, suspicious=found)
    result.seconds = time.monotonic() - start
    return result


def default_jobs() -> int:
    """Submissions graded at once: 2 on a 2-core laptop, up to 4 on big machines, 1 on one core."""
    cpus = os.cpu_count() or 1
    return 1 if cpus < 2 else min(4, max(2, cpus // 2))


def grade(paths: list[Path], *, timeout: float = 60, memory_mb: int = 4096, hidden: bool = True,
          jobs: int | None = None, solutions_dir: Path | None = None,
          python_path: list[str] | None = None, sandbox: bool = True,
          warn=None) -> list[SubmissionResult]:
    """Grade every submission (directories expand to the notebooks inside), concurrently.

    `warn(line)` receives the one line saying that the kernel is not sandboxed, when it is not
    (`course grade` prints it to stderr). `python_path`: extra folders the kernel imports from
    (read-only in the sandbox), e.g. a course's own checker modules. `sandbox=False` runs the
    kernel without bubblewrap even where it works (for debugging a submission).

    Raises GradingEnvironmentError, and grades no further submission, when the grading kernel
    itself is broken (see `preflight.py`): handing out zeros for it would blame the learners."""
    sources = load_sources(solutions_dir)
    files = expand(paths)
    jobs = max(1, min(jobs or default_jobs(), len(files) or 1))
    solutions = Path(solutions_dir) if solutions_dir else default_solutions_dir()
    folders = {p.resolve().parent for p in files if p.exists()}
    extra = [Path(p).resolve() for p in python_path or []]
    settings = Settings(timeout=timeout, memory_mb=memory_mb, jobs=jobs, sandbox=sandbox,
                        python_path=[str(p) for p in extra],
                        hide=[solutions.resolve(), *sorted(folders)],
                        protect=[p.resolve() for p in files if p.is_file()])
    if settings.why_not_sandboxed and warn is not None:
        warn(NOT_SANDBOXED.format(why=settings.why_not_sandboxed))

    broken = threading.Event()  # set at the first GradingEnvironmentError: start no more

    def one(p: Path) -> SubmissionResult | None:
        if broken.is_set():
            return None
        try:
            return grade_one(p, sources, settings, hidden=hidden, label=str(p))
        except GradingEnvironmentError:
            broken.set()
            raise
        except Exception as e:  # noqa: BLE001 - a grader bug on one file must not stop the others
            return SubmissionResult(str(p), error=f"internal grader error: {type(e).__name__}: {e}")

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, p) for p in files]
            try:
                return [f.result() for f in futures]
            except GradingEnvironmentError:
                for f in futures:  # the same environment would fail them all: stop here
                    f.cancel()
                raise
    finally:
        settings.close()


def _stopped(command: str, error: GradingEnvironmentError) -> int:
    print(f"course {command}: cannot grade: {error}", file=sys.stderr, flush=True)
    print(f"course {command}: nothing was scored; fix the grading environment and run it again.",
          file=sys.stderr, flush=True)
    return 2


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main_grade(args: argparse.Namespace) -> int:
    missing = [p for p in args.submissions if not Path(p).exists()]
    try:
        results = grade(
            list(args.submissions),
            timeout=args.timeout,
            memory_mb=args.memory_mb,
            jobs=getattr(args, "jobs", None),
            solutions_dir=getattr(args, "solutions", None),
            python_path=getattr(args, "python_path", None),
            sandbox=not getattr(args, "no_sandbox", False),
            warn=_stderr,
        )
    except GradingEnvironmentError as e:
        return _stopped("grade", e)
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
    print(
        f"Running {path} in a fresh kernel (a scratch copy; your file is not changed)...",
        flush=True,
    )
    try:
        results = grade(
            [path],
            timeout=args.timeout,
            memory_mb=getattr(args, "memory_mb", 4096),
            hidden=False,
            jobs=1,
            solutions_dir=getattr(args, "solutions", None) or default_check_dir(),
            python_path=getattr(args, "python_path", None),
        )
    except GradingEnvironmentError as e:
        return _stopped("check", e)
    sys.stdout.write(format_table(results, hints=True))
    r = results[0]
    print()
    if r.exercises and not r.error:
        if r.score == r.max_score:
            print("All checks pass. Compare your code with the solution notebook, then go on.")
        else:
            todo = sum(1 for e in r.exercises if e.score < e.max_score)
            print(
                f"{todo} exercise(s) to go. The grader also runs hidden tests, so a check that "
                "passes here can still fail there on an edge case."
            )
    return 0
