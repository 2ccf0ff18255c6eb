"""Stage 3a, match checks: which `Check`s a graded test cell calls, read with `ast` (never run).

A test cell of the source notebook such as `check.similarity_scores(similarity_scores)`, after a
set-up cell `from course_lib.checks import ch01 as check`, becomes one `CheckCall`: the Check
object (imported here, in the grader's process) and the source text of its arguments, which the
probe cell passes to the kernel-side `probe`. A test cell that is anything but such calls (an
old-style `assert`, a helper) cannot be judged outside the kernel; `check_calls` returns None.
"""

from __future__ import annotations

import ast
import importlib
import types
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CheckCall:
    check: Any             # a course_lib.checks Check (cases, run, judge in this process)
    args: tuple[str, ...]  # the argument expressions, as written in the test cell


def _is_check(obj: Any) -> bool:
    from course_lib.checks import Check

    return isinstance(obj, Check)


def _import(module: str, attr: str | None = None) -> Any:
    if attr is not None:
        try:
            return importlib.import_module(f"{module}.{attr}")
        except ImportError:
            return getattr(importlib.import_module(module), attr, None)
    return importlib.import_module(module)


def _bindings(sources: list[str]):
    """(name, object, module) for every top-level import of the (trusted) set-up cells, resolved
    in this process: `module` is what to import to get `object` (the module itself, or the
    module a name comes from). An import the grader cannot do is skipped."""
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            try:
                if isinstance(node, ast.Import):
                    for a in node.names:
                        name = a.name if a.asname else a.name.split(".")[0]
                        yield a.asname or name, _import(name), name
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for a in node.names:
                        if a.name != "*":
                            obj = _import(node.module, a.name)
                            module = obj.__name__ if isinstance(obj, types.ModuleType) else \
                                node.module
                            yield a.asname or a.name, obj, module
            except Exception:  # noqa: BLE001 - an import the grader cannot do is just not a check
                continue


def imported_names(sources: list[str]) -> dict[str, Any]:
    """The names the (trusted) set-up cells import, resolved in this process."""
    return {name: obj for name, obj, _ in _bindings(sources)}


def _has_checks(obj: Any) -> bool:
    return _is_check(obj) or (isinstance(obj, types.ModuleType)
                              and any(_is_check(v) for v in vars(obj).values()))


def checker_modules(sources: list[str]) -> list[str]:
    """The modules the set-up cells import checkers from (`course_lib.checks.ch01`), in order:
    what the preflight cell imports in the kernel before any learner code runs."""
    return list(dict.fromkeys(module for _, obj, module in _bindings(sources) if _has_checks(obj)))


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def check_calls(source: str, names: dict[str, Any]) -> list[CheckCall] | None:
    """The check calls a test cell consists of, or None when it holds anything else."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = []
    for node in tree.body:
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            return None
        call = node.value
        check = _resolve(call.func, names)
        if not _is_check(check) or call.keywords or \
                any(isinstance(a, ast.Starred) for a in call.args):
            return None
        calls.append(CheckCall(check, tuple(ast.get_source_segment(source, a) for a in call.args)))
    return calls or None


def setup_sources(source: Any) -> list[str]:
    """The source notebook's set-up code cells (neither answers nor graded cells)."""
    return [c.source for c in source.nb.cells if c.cell_type == "code"
            and not (c.metadata.get("nbgrader") or {}).get("solution")
            and not (c.metadata.get("nbgrader") or {}).get("grade")]


def checker_names(source: Any) -> set[str]:
    """The names a source notebook's set-up cells bind to checkers or their modules."""
    return {name for name, obj in imported_names(setup_sources(source)).items()
            if _has_checks(obj)}
