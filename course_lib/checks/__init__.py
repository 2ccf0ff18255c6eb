"""Checkers for the exercise notebooks, one module per chapter (`ch01`, `ch02`, ...).

Each checker is a `Check` (see `_protocol`): it makes inputs, runs the learner's function or reads
the learner's value on them, and judges the result against the course's reference, printing a
one-line success or raising `CheckFailure` (an AssertionError, so graders count it as a failed
test) whose message names the mistake. A checker never crashes on a wrong answer: None, NumPy
instead of torch, a wrong shape, NaN, or an exception inside the learner's function all become
feedback. `hint(exercise, tier)` prints the hints, one tier at a time; `get(id)` finds a Check.
"""

from course_lib.checks._core import CheckFailure
from course_lib.checks._protocol import Check, get, hint

__all__ = ["Check", "CheckFailure", "get", "hint"]
