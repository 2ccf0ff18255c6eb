"""Predict first, for real: a prediction counts as it was first committed, before the reveal.

A predict exercise has two graded checks, both declared here:

* `commit_check`: the learner commits a prediction (`check.temperature_prediction(prediction)`).
  The FIRST run of the check in a kernel records the value (if it has the right form) and only
  then shows the observed result; later runs judge the recorded value, so editing the prediction
  after the reveal changes nothing. Points go to committing a well-formed prediction, not to
  being right; the feedback explains the gap.
* `choice_check`: after the reveal, a short explanation as a multiple choice (`why = "b"`),
  whose distractors are the misconceptions the chapter's judge names. Its first answer is
  recorded the same way; the right choice earns the points, a wrong one names its
  misconception.

The record lives in the kernel (`_RECORDS`) and is printed in the check cell's output as one
line (`RECORD` ... `record_line`), so the notebook carries it: in grading, the grader reads it
back from the submitted notebook (`parse_records`, course_tools/grader/predictions.py), judges
the recorded value instead of whatever the answer cell holds now, and compares the record's
execution count with those of the cells that reveal the answer (`reveals`).

On the course's hub (`_hub`), the first commit is also sent to the hub's service, which keeps
the first one it gets with its own clock; the kernel then shows and judges the value the hub
kept, so a restart or a second kernel changes nothing, and grading a hub collection judges the
hub's record instead of the notebook's line. Off the hub nothing is sent.

An experiment never prints its reference number: it is a `function_check` on the learner's
`measure(seed)`, which the grader calls on hidden seeds (see `seeds_cases`), with feedback that
gives a direction only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from course_lib.checks import _hub
from course_lib.checks._check import Check
from course_lib.checks._core import CheckFailure, fail
from course_lib.checks._declare import _declared
from course_lib.checks._judging import each
from course_lib.checks._registry import get

_RECORDS: dict[str, dict] = {}      # check id -> {"value": plain value, "at": execution count}
COMMITTING: dict[str, dict] = {}    # check id -> {"reveals": grade ids, "kind": commit/choice}
RECORD = "📌 Recorded"               # the record line's start (parse_records looks for it)
_LINE = re.compile(r"^📌 Recorded \(first run of (\w+), at \[(\d+|-)\]; later edits do not "
                   r"change it\): (.*)$")
MAX_RECORD_CHARS = 2000


def _execution_count() -> int | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    count = getattr(shell, "execution_count", None)
    # IPython counts the running cell before it runs: the cell's own number is one less
    return count - 1 if isinstance(count, int) and count > 0 else None


def _plain(value: Any) -> Any:
    """A committed value as plain Python, which its repr brings back with literal_eval."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    if hasattr(value, "tolist") and callable(value.tolist):  # tensors, arrays, NumPy numbers
        return value.tolist()
    return value


def record_line(name: str, at: int | None, value: Any) -> str:
    """The one line a commit prints; `parse_records` reads it back from the notebook."""
    return (f"{RECORD} (first run of {name}, at [{at if at is not None else '-'}]; later edits "
            f"do not change it): {value!r}")


def plain_literal(text: str) -> Any:
    """A recorded value read back from its repr without running code (ValueError if not)."""
    if not isinstance(text, str) or len(text) > MAX_RECORD_CHARS:
        raise ValueError("not a recorded value")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError("not a recorded value") from None


def parse_records(text: str) -> dict[str, tuple[int | None, Any]]:
    """name -> (execution count, value) of every record line in a cell's output text (the
    first per name). Values are read with `ast.literal_eval` (no code runs) and bounded."""
    found: dict[str, tuple[int | None, Any]] = {}
    for line in str(text).splitlines():
        m = _LINE.match(line.strip())
        if not m or m.group(1) in found or len(m.group(3)) > MAX_RECORD_CHARS:
            continue
        try:
            value = plain_literal(m.group(3))
        except ValueError:
            continue
        found[m.group(1)] = (int(m.group(2)) if m.group(2).isdigit() else None, value)
    return found


def commit(check_id: str, value: Any, read: Callable[[Any], Any]) -> dict:
    """The kernel's part: record `value` the first time (when `read` accepts its form; a value
    `read` refuses is not a commit), and hand back the record."""
    if check_id not in _RECORDS:
        read(value)  # raises CheckFailure naming what to write: no record is made
        record = {"value": _plain(value), "at": _execution_count(), "first": True}
        kept = _hub.commit(check_id, record["value"])  # on the hub: its first one wins
        if kept is not None:
            record.update(value=kept["value"], first=kept["first"], hub=True)
        _RECORDS[check_id] = record
    else:
        _RECORDS[check_id]["first"] = False
    return dict(_RECORDS[check_id])


def announce(check: Check, outcomes: list) -> None:
    """A committing check's `announce` (`Check.__call__`, in a notebook): print its record
    line before the judgement."""
    outcome = outcomes[0] if outcomes else None
    if isinstance(outcome, dict) and isinstance(outcome.get("ok"), dict):
        rec = outcome["ok"]
        print(record_line(check.name, rec.get("at"), rec.get("value")))
        if rec.get("hub"):
            print("📌 Kept by the hub: " + ("this is your first commit; grading judges it."
                                           if rec.get("first") else
                                           "your first commit, from an earlier run; later "
                                           "commits change nothing."))


_hub.install()  # on the hub: report check cells' results, and reveals (inert elsewhere)


def forget(check_id: str | None = None) -> None:
    """Drop the kernel's records (all, or one check's): for tests, never for learners."""
    if check_id is None:
        _RECORDS.clear()
    else:
        _RECORDS.pop(check_id, None)


def _committed_value(got: Any) -> Any:
    if not isinstance(got, dict) or "value" not in got:
        fail("the check received no committed value.")
    return got["value"]


def _cases(seed: int, hidden: bool) -> list:
    return [None]


def _committing(decl: dict, read: Callable[[Any], Any], judged: Callable[[Any], str],
                name: str, **info: Any) -> Check:
    """The Check both declarations make: `run` (in the kernel) commits the value(s) the check
    was called with, a tuple if several; the judge reads the record and hands it to `judged`."""
    def run(*values_and_case: Any) -> Any:
        values = values_and_case[:-1]
        return commit(decl["id"], values[0] if len(values) == 1 else values, read)

    def judge(cases: list, outcomes: list) -> str:
        (_, got), = each(cases, outcomes)
        return judged(read(_committed_value(got)))

    judge.__name__ = name
    check = Check(cases=_cases, run=run, judge=judge, announce=announce, **decl)
    COMMITTING[check.id] = info
    return check


def commit_check(exercise: int, *, read: Callable[[Any], Any], grade: str | None = None,
                 reveals: tuple[str, ...] = (),
                 hints: tuple[str, ...] | None = None) -> Callable[[Callable], Check]:
    """A prediction, declared on its `observe`: `read(value)` checks the form (a `_values`
    reader: raises CheckFailure saying what to write; runs in the kernel too, so it must hold no
    reference) and returns the prediction; `observe(prediction)` runs the experiment in the
    judge and returns the words shown after the commit (the observed result and the gap). The
    check passes for any well-formed committed prediction. `reveals`: grade ids of the cells
    that show the answer (the grader fails a commit made after one of them ran)."""
    def declare(observe_fn: Callable[[Any], str]) -> Check:
        name = observe_fn.__name__
        return _committing(_declared(name, exercise, observe_fn, grade, hints), read,
                           observe_fn, name, reveals=tuple(reveals), kind="commit")
    return declare


def choice_check(exercise: int, name: str, letters: str, *, module: str,
                 grade: str | None = None, hints: tuple[str, ...] | None = None) -> Check:
    """The short explanation after a reveal, as a multiple choice of `letters`:

        temperature_why = choice_check(5, "temperature_why", "abc", module=__name__)

    The texts live in the check's section of `hints/<chapter>.md` (`choice_texts`): each wrong
    letter's text is the feedback that names the misconception it stands for, the right one's
    the success message. They are read when judging, never at import (the grading kernel's copy
    of the md holds none of them), so the kernel knows only the letters. The first answer is
    recorded like a prediction; only the right letter earns the points. `module` is the chapter
    module (its hints and SOLUTION)."""
    if not name or not letters:
        raise ValueError("choice_check needs the check's name and its letters")

    def read(got: Any) -> str:
        from course_lib.checks._values import read_choice
        return read_choice(got, "why", tuple(letters))

    def stub(cases, outcomes):  # only carries the module for _declared
        raise NotImplementedError

    stub.__module__ = module
    decl = _declared(name, exercise, stub, grade, hints)

    def judged(letter: str) -> str:
        texts, right_letter = choice_texts(decl["id"], letters)
        if letter != right_letter:
            raise CheckFailure(f"you chose {letter!r}: {texts[letter]}")
        return texts[letter]

    return _committing(decl, read, judged, name, reveals=(), kind="choice", letters=letters)


_CHOICE = re.compile(r"^- ([a-z])( \(right\))?: (.*)$")


def choice_texts(check_id: str, letters: str) -> tuple[dict[str, str], str]:
    """The texts of a choice check's letters and its right letter, as the check's section of
    `hints/<chapter>.md` writes them after its hint tiers:

        - a: the feedback on choosing a (continuation lines indented two spaces)
        - b (right): the success message

    Read afresh at every judgement (the grader's process holds the full md)."""
    chapter, name = check_id.split(".", 1)
    text = (Path(__file__).parent / "hints" / f"{chapter}.md").read_text(encoding="utf-8")
    section = text.partition(f"\n## {name}\n")[2].split("\n## ", 1)[0]
    texts: dict[str, str] = {}
    right, letter = [], None
    for line in section.splitlines():
        m = _CHOICE.match(line)
        if m:
            letter = m.group(1)
            texts[letter] = m.group(3)
            right += [letter] if m.group(2) else []
        elif letter and line.startswith("  ") and line.strip():
            texts[letter] += " " + line.strip()
        else:
            letter = None
    if "".join(texts) != letters or len(right) != 1:
        raise ValueError(f"hints/{chapter}.md: ## {name} should list the choices {letters!r} "
                         f"('- a: ...'), one of them marked (right); it lists {''.join(texts)!r}")
    return texts, right[0]


def commit_info(check_id: str) -> dict | None:
    """What the grader needs to know of a committing check (None for any other check)."""
    get(check_id)  # imports its chapter module
    return COMMITTING.get(check_id)


def seeds_cases(exercise: int, n_visible: int = 2, n_hidden: int = 3) -> Callable:
    """Cases for an experiment graded through the learner's `measure(seed)`: seeds only (the
    notebook's are fixed; hidden ones are fresh per grading seed)."""
    def cases(seed: int, hidden: bool) -> list:
        seeds = [101 + k for k in range(n_visible)]
        if hidden:
            seeds += [(seed * 7919 + exercise * 31 + k) % 100_000 + 1000 for k in range(n_hidden)]
        return [{"seed": s} for s in seeds]
    return cases
