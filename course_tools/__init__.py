"""The course's tooling: what authors and instructors run, never what a notebook imports.

* `course_tools.cli`: the `course` command (check, grade, build-exercises, execute, env);
* `course_tools.exercises`: solutions/ -> exercises/ (the one hint parser lives here);
* `course_tools.notebooks`: re-execute notebooks in place, reproducibly;
* `course_tools.grader`: the grader, one module per stage (read, match, assemble, run, score,
  report, and the sandbox the kernel runs in).

`course_lib` (what notebooks import) never imports this package; `tests/test_tooling.py` checks.
"""

import sys

# nbformat imports jsonschema, which imports the grammar of its optional IRI format checker
# (rfc3987_syntax): 0.7 s of every `course` process and of every grading worker, for a check
# the notebook schemas never ask for (they use no string formats). Skip it before anything here
# imports nbformat; the worker imports this package first, so it is spared too.
sys.modules.setdefault("rfc3987_syntax", None)
