"""What the hub keeps of each learner's work while they work: check results, first commits, reveals.

The hand-in service (`handin.py`) writes it, under the name of the learner whose token came with
the request; the room page (`room.py`) reads it for the instructor's live grid, and `course grade`
of a collection (`collection.py`) judges predictions from it. One append-only JSON-lines file
per learner, in the collection folder (the hub's alone, mode 0700):

    collection/.records/ana.jsonl
    {"kind": "check", "t": 1764620405.1, "notebook": "01_soft_dictionary.ipynb",
     "exercise": "ch01_scores_test", "passed": false, "mistake": "..."}
    {"kind": "commit", "t": 1764620460.2, "check": "ch01.temperature_prediction",
     "value": "{'cold': 20.0, 'hot': 25.0}"}
    {"kind": "reveal", "t": 1764620470.9, "cell": "ch09_predict_run"}

Every time is the service's clock (`time.time()` when the request arrived), never the kernel's.
A commit or a reveal is kept the first time only (first write wins): a second kernel, a restart
or a hand-typed request gets the first one back. A check result never holds code: the exercise
(the check cell's grade_id), passed or not, and the named mistake (the first line of the
checker's message, its numbers blanked, at most 160 characters).
"""

from __future__ import annotations

import ast
import json
import os
import re
import threading
import time
from pathlib import Path

RECORDS_FOLDER = ".records"   # inside the collection; not a learner name (Collection skips it)
LEARNER = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
EXERCISE = re.compile(r"^ch\d\d\w{1,80}$")          # a grade_id: ch01_scores_test
CHECK = re.compile(r"^ch\d\d\.[A-Za-z_]\w{0,80}$")  # a check id: ch01.temperature_prediction
NOTEBOOK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,120}\.ipynb$")
MAX_VALUE_CHARS = 2000      # as a notebook's record line (course_lib.checks._predict)
MAX_MISTAKE_CHARS = 160
MAX_EVENTS = 20_000         # per learner: a loop of checks cannot fill the disk


class RecordError(ValueError):
    """A request the records refuse, in words for the learner's kernel (never shown to others)."""


def plain_value(text: str):
    """A committed value's repr, read back without running code; RecordError if it is not one."""
    if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS:
        raise RecordError(f"a committed value is its repr, at most {MAX_VALUE_CHARS} characters")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise RecordError("a committed value must be a plain literal (numbers, strings, "
                          "lists, dicts)") from None


def mistake_name(text: str | None) -> str:
    """The named mistake of a checker's message: its first line, no hint, numbers blanked."""
    if not text:
        return ""
    line = str(text).split("\nHint:", 1)[0].strip().splitlines()[0] if str(text).strip() else ""
    line = re.sub(r"(raised \w+):.*", r"\1", line)   # a learner's exception text stays home
    line = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", line)
    return line[:MAX_MISTAKE_CHARS]


class Records:
    """The records of every learner in one collection; safe to use from one process's threads."""

    def __init__(self, collection: Path, *, create: bool = False):
        self.root = Path(collection) / RECORDS_FOLDER
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)
        self._lock = threading.Lock()
        self._cache: dict[str, dict] = {}   # learner -> {"size": bytes read, "state": ...}

    def _path(self, learner: str) -> Path:
        if not LEARNER.match(learner or ""):
            raise RecordError(f"learner name {learner!r} is not one the hub hands out")
        return self.root / f"{learner}.jsonl"

    def _append(self, learner: str, event: dict) -> None:
        path = self._path(learner)
        if self.state(learner)["events"] >= MAX_EVENTS:
            raise RecordError(f"{MAX_EVENTS} results recorded already: ask the instructor")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(event, ensure_ascii=False) + "\n")

    # ------------------------------------------------------------ what the service writes

    def check(self, learner: str, exercise: str, passed: bool, mistake: str = "",
              notebook: str = "", *, now: float | None = None) -> dict:
        if not isinstance(exercise, str) or not EXERCISE.match(exercise):
            raise RecordError("exercise: the check cell's grade_id, e.g. ch01_scores_test")
        if notebook and not (isinstance(notebook, str) and NOTEBOOK.match(notebook)):
            raise RecordError("notebook: the notebook's file name")
        if not isinstance(passed, bool):
            raise RecordError("passed: true or false")
        event = {"kind": "check", "t": time.time() if now is None else now,
                 "notebook": notebook or "", "exercise": exercise, "passed": passed,
                 "mistake": "" if passed else mistake_name(mistake if isinstance(mistake, str)
                                                           else "")}
        with self._lock:
            self._append(learner, event)
        return event

    def commit(self, learner: str, check: str, value: str, *, now: float | None = None) -> dict:
        """Keep `value` as the learner's commit of `check`, unless one is kept: -> the kept one,
        with "first": whether this request made it."""
        if not isinstance(check, str) or not CHECK.match(check):
            raise RecordError("check: the check's id, e.g. ch01.temperature_prediction")
        plain_value(value)
        with self._lock:
            kept = self.state(learner)["commits"].get(check)
            if kept is not None:
                return {**kept, "first": False}
            event = {"kind": "commit", "t": time.time() if now is None else now, "check": check,
                     "value": value}
            self._append(learner, event)
        return {"check": check, "value": value, "t": event["t"], "first": True}

    def reveal(self, learner: str, cell: str, *, now: float | None = None) -> dict:
        """The first time the learner ran a cell that shows a prediction's answer."""
        if not isinstance(cell, str) or not EXERCISE.match(cell):
            raise RecordError("cell: the revealing cell's grade_id, e.g. ch09_predict_run")
        with self._lock:
            kept = self.state(learner)["reveals"].get(cell)
            if kept is not None:
                return {"cell": cell, "t": kept, "first": False}
            t = time.time() if now is None else now
            self._append(learner, {"kind": "reveal", "t": t, "cell": cell})
        return {"cell": cell, "t": t, "first": True}

    # ------------------------------------------------------------ what the readers see

    def learners(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.jsonl") if LEARNER.match(p.stem))

    def state(self, learner: str) -> dict:
        """{"checks": [...], "commits": {check: {"value", "t"}}, "reveals": {cell: t},
        "events": n}: read incrementally from the learner's file (first commit/reveal wins)."""
        path = self._path(learner)
        entry = self._cache.setdefault(learner, {"size": 0, "state": {
            "checks": [], "commits": {}, "reveals": {}, "events": 0}})
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return entry["state"]
        if size > entry["size"]:
            with open(path, "rb") as f:
                f.seek(entry["size"])
                chunk = f.read(size - entry["size"])
            whole = chunk[:chunk.rfind(b"\n") + 1]   # a line being written is read next time
            entry["size"] += len(whole)
            for line in whole.decode("utf-8", "replace").splitlines():
                self._fold(entry["state"], line)
        return entry["state"]

    @staticmethod
    def _fold(state: dict, line: str) -> None:
        try:
            event = json.loads(line)
            kind, t = event["kind"], float(event["t"])
        except (ValueError, KeyError, TypeError):
            return
        state["events"] += 1
        if kind == "check":
            state["checks"].append(event)
        elif kind == "commit" and event.get("check") not in state["commits"]:
            state["commits"][event["check"]] = {"value": event.get("value"), "t": t}
        elif kind == "reveal" and event.get("cell") not in state["reveals"]:
            state["reveals"][event["cell"]] = t

    def for_grading(self, learner: str) -> dict:
        """What `course grade` judges a learner's predictions on: commits and reveals."""
        s = self.state(learner)
        return {"commits": dict(s["commits"]), "reveals": dict(s["reveals"])}


# ---------------------------------------------------------------- the instructor's grid


def grid(records: Records, now: float | None = None, order: list[str] | None = None) -> dict:
    """The room as data: per learner and exercise the latest result, how many tries, and since
    when it has been failing (stuck); per exercise the most common named mistake."""
    now = time.time() if now is None else now
    rows, exercises, mistakes = {}, {}, {}
    for learner in records.learners():
        cells: dict[str, dict] = {}
        for e in records.state(learner)["checks"]:
            ex = e.get("exercise")
            if not isinstance(ex, str):
                continue
            exercises.setdefault(ex, e.get("notebook", ""))
            c = cells.setdefault(ex, {"tries": 0, "passed": False, "failing_since": None})
            c["tries"] += 1
            c["passed"], c["last"] = bool(e.get("passed")), float(e["t"])
            if c["passed"]:
                c["failing_since"], c["mistake"] = None, ""
            else:
                c["failing_since"] = c["failing_since"] or float(e["t"])
                c["mistake"] = e.get("mistake", "")
                mistakes.setdefault(ex, {}).setdefault(c["mistake"] or "(no message)", set()
                                                       ).add(learner)
        for c in cells.values():
            c["stuck_s"] = None if c["failing_since"] is None else round(now - c["failing_since"])
        rows[learner] = cells
    rank = {g: i for i, g in enumerate(order or [])}
    ordered = sorted(exercises, key=lambda g: (g[:4], rank.get(g, len(rank)), g))
    common = {}
    for ex, by in mistakes.items():
        text, who = max(by.items(), key=lambda kv: (len(kv[1]), kv[0]))
        common[ex] = {"mistake": text, "learners": len(who)}
    return {"now": now, "exercises": [{"id": g, "notebook": exercises[g],
                                       "common_mistake": common.get(g)} for g in ordered],
            "learners": rows}
