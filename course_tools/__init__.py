"""The course's tooling: what authors and instructors run, never what a notebook imports.

* `course_tools.cli`: the `course` command (check, grade, build-exercises, execute, env);
* `course_tools.exercises`: solutions/ -> exercises/ (the one hint parser lives here);
* `course_tools.notebooks`: re-execute notebooks in place, reproducibly;
* `course_tools.grader`: the grader, one module per stage (read, match, assemble, run, score,
  report, and the sandbox the kernel runs in).

`course_lib` (what notebooks import) never imports this package; `tests/test_tooling.py` checks.
"""
