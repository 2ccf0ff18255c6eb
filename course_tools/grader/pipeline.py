"""The stages in order for one submission and for many; the `course grade`/`check` commands."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path

from course_tools.grader import guard, predictions
from course_tools.grader.assemble import assemble
from course_tools.grader.calls import (
    checker_modules,
    checker_names,
    imported_names,
    setup_sources,
)
from course_tools.grader.limits import DISK_MB
from course_tools.grader.match import match_source
from course_tools.grader.preflight import GradingEnvironmentError, environment_problem
from course_tools.grader.reach import reach_plan
from course_tools.grader.read import (
    Source,
    default_check_dir,
    default_solutions_dir,
    expand,
    load_sources,
    meta,
    read_notebook,
)
from course_tools.grader.report import format_csv, format_json, format_table
from course_tools.grader.results import ExerciseResult, SubmissionResult
from course_tools.grader.run import Settings, run_submission
from course_tools.grader.sandbox import NOT_SANDBOXED, unavailable
from course_tools.grader.scan import scan_plan
from course_tools.grader.score import cut, score
from course_tools.grader.strip import chapter_of


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
    reached = reach_plan(plan.cells, imported_names(setup_sources(source))) if hidden else {}
    run = run_submission(Path(path).name, data, plan, settings)
    if hidden:  # predictions are judged on what the submission recorded (predictions.py)
        run.verdicts = predictions.review(nb, plan, run.verdicts, path=path)
    problem = environment_problem(plan, run, timeout=settings.timeout,
                                  memory_mb=settings.memory_mb, grader_lib=settings.course_lib,
                                  python_path=settings.given_path)
    if problem:
        raise GradingEnvironmentError(f"the grading environment is broken, not {path}: {problem}")
    result.error = cut(run.error, 1000) if run.error else None
    result.exercises = score(source, plan, run, timeout=settings.timeout,
                             memory_mb=settings.memory_mb, suspicious=found, reached=reached)
    result.seconds = time.monotonic() - start
    return result


def given_names(sources: dict[str, Source]) -> tuple[set[str], dict[str, set[str]]]:
    """What the course's own cells of the exercise notebooks use: every name they spell (a
    stripped checker module keeps those whole: `soft_mask_scores()` gives an exercise its data),
    and per chapter the names they import from course_lib (`strip.build` leaves those working,
    even when an exercise of the chapter asks for one: chapter 06 runs the course's RNN)."""
    words: set[str] = set()
    uses: dict[str, set[str]] = {}
    for src in sources.values():
        chapter = "ch" + src.name[:2]
        for cell in src.nb.cells:
            if cell.cell_type != "code" or meta(cell).get("solution"):
                continue
            words.update(re.findall(r"[A-Za-z_]\w*", cell.source))
            for module, names in re.findall(r"from (course_lib[\w.]*) import ([\w, ]+)",
                                            cell.source):
                if not module.startswith("course_lib.checks"):
                    uses.setdefault(chapter, set()).update(n.split()[0] for n in
                                                           names.split(",") if n.strip())
    return words, uses


def strip_first(files: list[Path], sources: dict[str, Source], settings: Settings) -> None:
    """Make the stripped course_lib of every chapter the submissions belong to, here, before
    any grading thread starts: CPython 3.11's ast is not safe to use from two threads at once
    (it raised "AST constructor recursion depth mismatch" in a batch), and the strip parses and
    rewrites the whole package. A course that cannot be stripped stops the run."""
    wanted = set()
    for path in files:
        _, nb, error = read_notebook(Path(path))
        source = None if error else match_source(nb, sources, Path(path).name)
        if source is not None:
            wanted.add(tuple(sorted({c for m in checker_modules(setup_sources(source))
                                     if (c := chapter_of(m))})))
    for chapters in sorted(wanted):
        try:
            settings.lib_for(chapters)
        except Exception as e:  # noqa: BLE001 - the course's files, not a submission
            raise GradingEnvironmentError(
                f"could not make the grading kernel's course_lib for {', '.join(chapters)}: "
                f"{type(e).__name__}: {e}") from e


def default_jobs() -> int:
    """Submissions graded at once: 2 on a 2-core laptop, up to 4 on big machines, 1 on one core."""
    cpus = os.cpu_count() or 1
    return 1 if cpus < 2 else min(4, max(2, cpus // 2))


def grade(paths: list[Path], *, timeout: float = 60, memory_mb: int = 4096, hidden: bool = True,
          jobs: int | None = None, solutions_dir: Path | None = None,
          python_path: list[str] | None = None, sandbox: bool = True,
          warn=None, disk_mb: int = DISK_MB) -> list[SubmissionResult]:
    """Grade every submission (directories expand to the notebooks inside), concurrently.

    `warn(line)` receives the one line saying that the kernel is not sandboxed, when it is not
    (`course grade` prints it to stderr). `python_path`: extra folders the kernel imports from
    (read-only in the sandbox), e.g. a course's own checker modules. `sandbox=False` runs the
    kernel without bubblewrap even where it works (for debugging a submission). `disk_mb`: what
    a submission's files may take in all (a cell past it stops the submission).

    Raises GradingEnvironmentError, and grades no further submission, when the grading kernel
    itself is broken (see `preflight.py`): handing out zeros for it would blame the learners."""
    sources = load_sources(solutions_dir)
    files = expand(paths)
    jobs = max(1, min(jobs or default_jobs(), len(files) or 1))
    solutions = Path(solutions_dir) if solutions_dir else default_solutions_dir()
    folders = {p.resolve().parent for p in files if p.exists()}
    extra = [Path(p).resolve() for p in python_path or []]
    refused = exposes(extra, solutions)
    if refused:
        raise GradingEnvironmentError(refused)
    settings = Settings(timeout=timeout, memory_mb=memory_mb, jobs=jobs, sandbox=sandbox,
                        disk_mb=disk_mb, strip=hidden, given=given_names(sources),
                        python_path=[str(p) for p in extra],
                        hide=[solutions.resolve(), *sorted(folders)],
                        protect=[p.resolve() for p in files if p.is_file()])
    if settings.why_not_sandboxed and warn is not None:
        warn(NOT_SANDBOXED.format(why=settings.why_not_sandboxed))
    if hidden:
        strip_first(files, sources, settings)

    broken = threading.Event()  # set at the first GradingEnvironmentError: start no more
    unsafe = settings.why_not_sandboxed is not None

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

    # Without a sandbox a kernel can signal the grader: catchable signals from its own
    # descendants are ignored (SignalShield), SIGSTOP is undone by a watchdog process.
    shield = guard.SignalShield() if unsafe else contextlib.nullcontext()
    settings.shield = shield
    dog = guard.watchdog(settings.run_token) if unsafe else None
    try:
        with shield, ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, p) for p in files]
            try:
                return [_result(f, shield) for f in futures]
            except (GradingEnvironmentError, KeyboardInterrupt):
                for f in futures:  # the same environment would fail them all: stop here
                    f.cancel()
                raise
    finally:
        if dog is not None:
            dog.kill()
            dog.wait()
        settings.close()


def _result(future, shield) -> SubmissionResult:
    """A future's result; with a SignalShield, a real Ctrl-C raises KeyboardInterrupt here."""
    interrupted = getattr(shield, "interrupted", None)
    if interrupted is None:
        return future.result()
    while True:
        try:
            return future.result(timeout=0.2)
        except FuturesTimeout:
            if interrupted.is_set():
                raise KeyboardInterrupt from None


def exposes(python_path: list[Path], solutions: Path) -> str | None:
    """Why a --python-path folder would show the kernel the solutions (it is solutions/, inside
    it, or a folder above it), or None."""
    sol = Path(solutions).resolve()
    for folder in python_path:
        if folder == sol or sol.is_relative_to(folder) or folder.is_relative_to(sol):
            where = ("is" if folder == sol else
                     "holds" if sol.is_relative_to(folder) else "is inside")
            return (f"--python-path {folder} {where} the solutions folder {sol}: the kernel could "
                    "import or read the solutions from it; give a folder that holds only your "
                    "own modules")
    return None


def _stopped(command: str, error: GradingEnvironmentError) -> int:
    print(f"course {command}: cannot grade: {error}", file=sys.stderr, flush=True)
    print(f"course {command}: nothing was scored; fix the grading environment and run it again.",
          file=sys.stderr, flush=True)
    return 2


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


UNSAFE = (
    "course grade: --unsafe-no-sandbox: the kernels run WITHOUT a sandbox, as you, and a "
    "submission's code can: read solutions/ and any file you can; write wherever you can (the "
    "grader puts back the course files and submissions it watches, and flags the change); use "
    "the network; signal or kill your other processes (the grader ignores catchable signals "
    "from its kernels and undoes SIGSTOP; SIGKILL stops it). The judging stays in the grader's "
    "process. Grade only work you trust this way."
)
REFUSED = (
    "course grade: refusing to grade: there is no sandbox here ({why}), so a submission's code "
    "would run with your permissions (read solutions/, write your files, reach the network, "
    "signal the grader). Install bubblewrap (Debian: apt-get install bubblewrap), or pass "
    "--unsafe-no-sandbox to grade work you trust anyway."
)


def sandbox_gate(args: argparse.Namespace) -> int | None:
    """`course grade` runs without a sandbox only when asked in so many words: None to go on
    (after printing what --unsafe-no-sandbox allows), or the exit status of a refusal."""
    if getattr(args, "no_sandbox", False):
        _stderr("course grade: --no-sandbox is now --unsafe-no-sandbox (it says what it allows)")
        return 2
    if getattr(args, "unsafe_no_sandbox", False):
        _stderr(UNSAFE)
        return None
    why = unavailable()
    if why:
        _stderr(REFUSED.format(why=why))
        return 2
    return None


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
            sandbox=not getattr(args, "unsafe_no_sandbox", False),
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
