"""The grader's reading of the learner's source, for nbgrader's `autograde`.

nbgrader runs the check cells in the participant's own kernel, with the whole course_lib and no
sandbox, so every in-kernel protection there can be stepped around. What `course grade` reads
from the source needs no kernel: the scan (scan.py: threads, computed names, frames, a rewritten
forbid list) and the reach of each check (reach.py: a function its exercise rules out, by any
of its names). `ReadTheSource` applies both after nbgrader's `Execute`: a grade cell whose
exercise either flags gets an error output saying why, and nbgrader scores a cell with an error
0. In `nbgrader_config.py`:

    from course_tools.grader.for_nbgrader import autograde_preprocessors
    c.Autograde.autograde_preprocessors = autograde_preprocessors()

A notebook that matches none of the course's solution notebooks is left as it is.
"""

from __future__ import annotations

from typing import Any

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from course_tools.grader.assemble import assemble
from course_tools.grader.calls import checker_names, imported_names, setup_sources
from course_tools.grader.match import match_source
from course_tools.grader.reach import reach_plan
from course_tools.grader.read import grade_id, load_sources
from course_tools.grader.scan import scan_plan
from course_tools.grader.score import flags_for, judged_cells

ENAME = "FlaggedByCourseGrader"


def source_flags(nb: Any, name: str = "", sources: dict | None = None) -> dict[str, list[str]]:
    """graded grade_id -> what the grader's reading of the source flags for it, as `course
    grade` scores it: a scan flag costs every exercise judged at or after its cell, a reach
    flag the exercise whose check forbids the name."""
    sources = load_sources(None) if sources is None else sources
    source = match_source(nb, sources, name)
    if source is None:
        return {}
    plan = assemble(source, nb, hidden=True)
    scanned = scan_plan(plan.cells, checker_names(source))
    reached = reach_plan(plan.cells, imported_names(setup_sources(source)))
    judged = judged_cells(plan.cells)
    found: dict[str, list[str]] = {}
    for gid, _, _ in source.graded:
        flags = flags_for(judged.get(gid, []), len(plan.cells), sorted(scanned.items()), reached)
        if flags:
            found[gid] = list(dict.fromkeys(flags))
    return found


class ReadTheSource(Preprocessor):
    """After nbgrader's Execute: an error output on every grade cell whose exercise the
    grader's reading of the source flags (nbgrader then scores the cell 0)."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless enabled

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        flags = source_flags(nb, f"{resources.get('unique_key', '')}.ipynb")
        for cell in nb.cells:
            gid = grade_id(cell)
            if cell.cell_type == "code" and gid in flags:
                text = "; ".join(flags[gid])
                cell.outputs.append(nbformat.v4.new_output(
                    "error", ename=ENAME, evalue=text,
                    traceback=[f"{ENAME}: {text} (0 points: the course's grader read this in "
                               "the notebook's code)"]))
                self.log.warning("%s: %s", gid, text)
        return nb, resources


def autograde_preprocessors() -> list:
    """nbgrader's own autograde preprocessors with ReadTheSource right after Execute."""
    from nbgrader.converters import Autograde

    default = list(Autograde.class_traits()["autograde_preprocessors"].make_dynamic_default())
    at = next(i for i, p in enumerate(default) if p.__name__ == "Execute") + 1
    return [*default[:at], ReadTheSource, *default[at:]]
