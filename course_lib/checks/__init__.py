"""Checkers for the exercise notebooks, one module per chapter (`ch01`, `ch02`, ...).

Each checker takes the learner's function or value, runs it on fresh random inputs against the
course's reference, and either prints a one-line success or raises `CheckFailure` (an
AssertionError, so graders count it as a failed test) whose message says what to fix. A
checker never crashes on a wrong answer: None, NumPy instead of torch, a wrong shape, NaN, or an
exception inside the learner's function all become feedback.
"""

from course_lib.checks._core import CheckFailure

__all__ = ["CheckFailure"]
