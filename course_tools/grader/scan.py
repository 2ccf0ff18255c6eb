"""Stage 3b, scan: what a learner's cells reach for that an exercise never needs.

The judge already runs outside the kernel and the sandbox removes what a kernel could steal, so
tampering cannot earn points by itself; but a cheat that the sandbox silently defeats (a forged
write into a process it cannot see) or that replaces the kernel-side probe should not pass
unnoticed either. This reads each answer and added cell (as Python, after IPython's own
transformation of magics and `!` commands, so comments and strings in prose do not count) and
names what it touches: the checkers' internals, the interpreter's module table or builtins,
other processes, the course's files. A flagged cell costs the exercises judged after it.
"""

from __future__ import annotations

import ast
import re
from typing import Any

_OUTSIDE = re.compile(r"^(/[A-Za-z_.~]|\.\./|~/)")  # an absolute path, a parent, a home
# A module attribute read or rebound; module aliases are found from the imports themselves.
_SENSITIVE_ATTRS = {
    "modules": ("sys", "replaces or reads the interpreter's module table (sys.modules)"),
    "setprofile": ("sys", "switches the interpreter's call tracking (sys.setprofile)"),
    "settrace": ("sys", "switches the interpreter's call tracking (sys.settrace)"),
    "_getframe": ("sys", "reads the interpreter's frames (sys._getframe)"),
    "getppid": ("os", "looks for its parent process (os.getppid)"),
    "kill": ("os", "signals a process (os.kill)"),
    "killpg": ("os", "signals a process group (os.killpg)"),
    "system": ("os", "runs other programs (os.system)"),
    "get_objects": ("gc", "searches the interpreter's objects (gc.get_objects)"),
    "get_referrers": ("gc", "searches the interpreter's objects (gc.get_referrers)"),
}
_MODULES = {
    "builtins": "patches or reads the builtins",
    "ctypes": "uses ctypes (raw memory access)",
    "course_lib.checks": "reaches into the checkers",
    "course_tools": "reaches into the grader",
    "subprocess": "runs other programs (subprocess)",
}
_WORDS = {  # inside string constants
    "/proc/": "reads /proc (other processes)",
    "solutions": "looks for the solution notebooks",
    "_probe": "reaches into the grader's probe",
    "COURSE-GRADE": "writes grader output",
}
_NAMES = {
    "__builtins__": "patches or reads the builtins",
    "__file__": "looks for the course's files (__file__)",
    "__import__": "imports by name (__import__)",
}


def _python(source: str) -> str:
    if not re.search(r"^\s*[%!]|[^=!<>]=\s*[%!]|\?\s*$", source, re.M):
        return source  # plain Python (the usual case): no need to import IPython
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - not IPython syntax either: parse what we have
        return source


def suspicious(source: str, checker_aliases: set[str] = frozenset()) -> list[str]:
    """What one learner cell does that an exercise never needs (empty for honest answers)."""
    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return []  # it cannot run either
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
                found += [why for mod, why in _MODULES.items() if _within(a.name, mod)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                aliases[a.asname or a.name] = full
                found += [why for mod, why in _MODULES.items()
                          if _within(node.module, mod) or _within(full, mod)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            module = aliases.get(base, base)
            if node.attr in _NAMES:  # course_lib.__file__, something.__builtins__
                found.append(_NAMES[node.attr])
            sensitive = _SENSITIVE_ATTRS.get(node.attr)
            if sensitive and module == sensitive[0]:
                found.append(sensitive[1])
            if base in checker_aliases and isinstance(node.ctx, (ast.Store, ast.Del)):
                found.append(f"rebinds the checker `{base}.{node.attr}`")
            elif module and isinstance(node.ctx, (ast.Store, ast.Del)) and \
                    base not in ("self", "cls") and base in aliases:
                found.append(f"replaces the library function `{module}.{node.attr}`")
        elif isinstance(node, ast.Name):
            if node.id in _NAMES:
                found.append(_NAMES[node.id])
            if node.id in checker_aliases and isinstance(node.ctx, ast.Store):
                found.append(f"rebinds the checkers' module `{node.id}`")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("setattr", "delattr") and node.args:
            target = node.args[0]
            if isinstance(target, ast.Name) and (target.id in aliases or
                                                 target.id in checker_aliases):
                found.append(f"rewrites the module `{aliases.get(target.id, target.id)}` "
                             f"({node.func.id})")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("system", "getoutput") and \
                isinstance(node.func.value, ast.Call) and \
                getattr(node.func.value.func, "id", None) == "get_ipython":
            found.append("runs shell commands (!)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [why for word, why in _WORDS.items() if word in node.value]
            if _OUTSIDE.match(node.value):
                found.append(f"names a path outside its folder ({node.value[:40]!r})")
    return list(dict.fromkeys(found))


def _within(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def scan_plan(cells: list[Any], checker_aliases: set[str]) -> dict[int, list[str]]:
    """plan cell index -> what its learner cell does suspiciously (answers and added cells)."""
    found = {}
    for i, cell in enumerate(cells):
        if cell.role in ("answer", "extra"):
            what = suspicious(cell.source, checker_aliases)
            if what:
                found[i] = [f"your {'answer' if cell.role == 'answer' else 'added'} cell "
                            f"{what_cell(cell)} {w}" for w in what]
    return found


def what_cell(cell: Any) -> str:
    return f"`{cell.grade_id}`" if cell.grade_id else ""
