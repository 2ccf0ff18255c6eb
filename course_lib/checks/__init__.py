"""Checkers for the exercise notebooks, one module per chapter (`ch01`, `ch02`, ...).

Each checker is a `Check` (see `_check`): it makes inputs, runs the learner's function or reads
the learner's value on them, and judges the result against the course's reference, printing a
one-line success or raising `CheckFailure` (an AssertionError, so graders count it as a failed
test) whose message names the mistake. A checker never crashes on a wrong answer: None, NumPy
instead of torch, a wrong shape, NaN, or an exception inside the learner's function all become
feedback. `hint(exercise, tier)` prints the hints, one tier at a time; `get(id)` finds a Check.

The grading protocol, public because the grader (`course_tools.grader`) speaks it from another
package and imports nothing else of this one:

* `encode(cases)`: a Check's cases as data only, what the grader saves for the kernel
  (`torch.save`);
* `probe(check_id, inputs_path, outputs_path, *learner_objs)`: the kernel's side, run in ONE
  generated cell per check call: apply the learner's objects to the saved cases and save the
  outcomes, plus a tampering report beside them;
* `load_outcomes(outputs_path)` and `load_tampered(outputs_path)`: the grader reads both back as
  plain data (`weights_only`, size limits), or raises `OutcomeError` for a file it refuses;
* `all_checks()`: every Check of every chapter (what `course grade`'s strip reads the `forbid`
  lists of);
* `commit_info(check_id)` and `parse_records(text)`: which checks record a first commit (a
  prediction, an explanation; `_predict`) and the record lines a notebook's outputs carry;
* `CheckFailure` / `ReferenceCall` (a failure that called the course's own reference): what a
  Check's `judge` raises, which the grader turns into feedback or a flag.
"""

from course_lib.checks._check import Check
from course_lib.checks._core import CheckFailure
from course_lib.checks._data import OutcomeError, encode, load_outcomes
from course_lib.checks._hints import hint
from course_lib.checks._predict import commit_info, parse_records, plain_literal
from course_lib.checks._probe import load_tampered, probe
from course_lib.checks._registry import all_checks, get
from course_lib.checks._trap import ReferenceCall

__all__ = ["Check", "CheckFailure", "OutcomeError", "ReferenceCall", "all_checks", "commit_info",
           "encode", "get", "hint", "load_outcomes", "load_tampered", "parse_records",
           "plain_literal", "probe"]
