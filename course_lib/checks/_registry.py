"""Finding checks: every chapter's checker module (`chNN`, a module or a package) is found on
disk, never listed; `get` takes a check id or grade id, `original` the Check as its module made
it (what the probe runs, whatever a notebook cell rebound since)."""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re

from course_lib.checks._check import _CREATED, Check


def chapters() -> list[str]:
    """'ch00', 'ch01', ...: the chapters that have a checker module, found on disk."""
    import course_lib.checks as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                  if re.fullmatch(r"ch\d+", m.name))


def all_checks() -> list[Check]:
    """Every Check of every chapter module, in chapter and definition order."""
    found: dict[str, Check] = {}
    for chapter in chapters():
        module = importlib.import_module(f"course_lib.checks.{chapter}")
        for obj in vars(module).values():
            if isinstance(obj, Check) and obj.id.startswith(chapter + "."):
                found.setdefault(obj.id, obj)
    return list(found.values())


def get(exercise: str) -> Check:
    """The Check with this id (`"ch01.similarity_scores"`) or grade_id (`"ch01_scores_test"`,
    `"ch01_scores"`). Chapter modules are imported on first use."""
    if not isinstance(exercise, str) or not exercise:
        raise ValueError(f"exercise should be a check id such as 'ch01.similarity_scores', "
                         f"got {exercise!r}")
    module_name, _, name = exercise.partition(".")
    if name and re.fullmatch(r"ch\d+", module_name):
        try:
            module = importlib.import_module(f"course_lib.checks.{module_name}")
        except ModuleNotFoundError:
            module = None
        obj = getattr(module, name, None)
        if isinstance(obj, Check) and obj.id == exercise:
            return obj
    if exercise in _CREATED:
        return _CREATED[exercise]
    checks = all_checks()
    ids = {c.id for c in checks}
    checks += [c for c in _CREATED.values() if c.id not in ids]  # e.g. a test's own Check
    for check in checks:
        if exercise in check.keys():
            return check
    known = sorted({k for c in checks for k in c.keys()})
    close = difflib.get_close_matches(exercise, known, n=3)
    raise ValueError(f"exercise {exercise!r} names no checker"
                     + (f"; did you mean {', '.join(map(repr, close))}?" if close else "."))


def original(check_id: str) -> Check:
    """The Check as its module created it (what the probe runs, whatever a cell rebound since)."""
    if check_id not in _CREATED:
        get(check_id)
    try:
        return _CREATED[check_id]
    except KeyError:
        raise ValueError(f"check_id {check_id!r} names no checker") from None
