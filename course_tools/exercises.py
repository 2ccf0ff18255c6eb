"""Generate the student notebooks in exercises/ from their single source in solutions/.

A solution notebook is nbgrader-compatible:

* answer cells carry `### BEGIN SOLUTION` / `### END SOLUTION`; the line just above the BEGIN
  marker may be a hint comment, `# HINT: ...`, which becomes the message of the
  `raise NotImplementedError(...)` the learner sees in place of the solution;
* hidden tests sit between `### BEGIN HIDDEN TESTS` / `### END HIDDEN TESTS` and are dropped;
* cells carry `metadata.nbgrader` (`grade_id`, `points`, `solution`, `grade`, `locked`).

The student version keeps everything else, clears outputs and execution counts, and is written
byte-for-byte the same on every run, so `build(check=True)` can say whether exercises/ is stale.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
HINT = re.compile(r"^\s*# HINT:\s*(.*)$")
MARKDOWN_STUB = "YOUR ANSWER HERE"
STUB = "# YOUR CODE HERE"

GENERATED_NOTE = (
    "GENERATED from solutions/{name} by `course build-exercises`: "
    "edit the solution notebook, not this file."
)


class ExerciseFormatError(ValueError):
    """A solution notebook's markers are unbalanced or misplaced."""


def strip_solution(source: str, *, where: str, markdown: bool = False) -> str:
    """Replace each solution region with a stub; drop hidden-test regions."""
    out: list[str] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if BEGIN_SOLUTION in line:
            indent = line[: len(line) - len(line.lstrip())]
            hint = (hint_of(out[-1]) if out else None) or ""
            end = _find(lines, i + 1, END_SOLUTION, BEGIN_SOLUTION, where)
            if markdown:
                out.append(MARKDOWN_STUB)
            else:
                out.append(f"{indent}{STUB}")
                out.append(
                    f"{indent}raise NotImplementedError({hint!r})"
                    if hint
                    else f"{indent}raise NotImplementedError()"
                )
            i = end + 1
        elif BEGIN_HIDDEN in line:
            i = _find(lines, i + 1, END_HIDDEN, BEGIN_HIDDEN, where) + 1
        elif END_SOLUTION in line or END_HIDDEN in line:
            raise ExerciseFormatError(f"{where}: '{line.strip()}' without its BEGIN marker")
        else:
            out.append(line)
            i += 1
    return "\n".join(out)


def _find(lines: list[str], start: int, end_marker: str, begin_marker: str, where: str) -> int:
    for j in range(start, len(lines)):
        if begin_marker in lines[j]:
            raise ExerciseFormatError(f"{where}: nested '{begin_marker}' before '{end_marker}'")
        if end_marker in lines[j]:
            return j
    raise ExerciseFormatError(f"{where}: '{begin_marker}' is never closed by '{end_marker}'")


def student_version(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    for index, cell in enumerate(nb.cells):
        where = f"{name} cell {index}"
        if cell.cell_type in ("code", "markdown"):
            cell.source = strip_solution(
                cell.source, where=where, markdown=cell.cell_type == "markdown"
            )
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        cell.metadata.pop("collapsed", None)
        cell.metadata.pop("scrolled", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["course"] = {"generated": GENERATED_NOTE.format(name=name)}
    return nb


def hint_of(line: str) -> str | None:
    """The text of a `# HINT: ...` line, or None when the line is not one."""
    m = HINT.match(line)
    return m.group(1).strip() if m else None


def hints_in(source: str) -> list[str]:
    """The `# HINT:` lines just above a solution region, or above its stub in an exercise (the
    one hint parser: the builder, the grader and the tests all use it)."""
    lines = source.split("\n")
    return [
        h
        for a, b in zip(lines, lines[1:])
        if (BEGIN_SOLUTION in b or STUB in b) and (h := hint_of(a)) is not None
    ]


def hints(nb: nbformat.NotebookNode) -> list[str]:
    """Every hint of a notebook, in order (the messages learners will see)."""
    return [h for cell in nb.cells for h in hints_in(cell.source)]


@dataclass
class BuildResult:
    written: list[Path]
    stale: list[Path]
    removed: list[Path]


def build(solutions: Path, exercises: Path, *, check: bool = False) -> BuildResult:
    """Write exercises/NAME.ipynb for every solutions/NAME.ipynb (or, with check, only compare)."""
    solutions, exercises = Path(solutions), Path(exercises)
    result = BuildResult([], [], [])
    expected = set()
    for src in sorted(solutions.glob("*.ipynb")):
        nb = nbformat.read(src, as_version=4)
        text = nbformat.writes(student_version(nb, src.name)) + "\n"
        dst = exercises / src.name
        expected.add(dst.name)
        current = dst.read_text(encoding="utf-8") if dst.exists() else None
        if current == text:
            continue
        result.stale.append(dst)
        if not check:
            exercises.mkdir(parents=True, exist_ok=True)
            dst.write_text(text, encoding="utf-8", newline="\n")
            result.written.append(dst)
    for extra in sorted(exercises.glob("*.ipynb")) if exercises.exists() else []:
        if extra.name not in expected:
            result.stale.append(extra)
            if not check:
                extra.unlink()
                result.removed.append(extra)
    return result
