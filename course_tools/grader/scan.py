"""Stage 3b, scan: what a learner's cells reach for that an exercise never needs.

The judge already runs outside the kernel and the sandbox removes what a kernel could steal, so
tampering cannot earn points by itself; but a cheat that the sandbox silently defeats (a forged
write into a process it cannot see) or that replaces the kernel-side probe should not pass
unnoticed either. This reads each answer and added cell (as Python, after IPython's own
transformation of magics and `!` commands, so comments and strings in prose do not count) and
names what it touches: the checkers' internals, the interpreter's module table or builtins,
other processes, the course's files. It also names what reading the source cannot follow, so
that reach.py's reading of each check (which functions its exercise rules out) cannot be
stepped around: another thread or process, code run from a string, an attribute or namespace
reached by a computed name, code objects, frames and closures (how a check's forbid list is
rewritten in place), torch's operator registry. A learner's own object (`self`) may use its own
internals. A flagged cell costs the exercises judged after it.
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
    # where no check can see what runs, or what it calls: another thread or process
    "threading": "runs code in another thread (threading)",
    "_thread": "runs code in another thread (_thread)",
    "concurrent": "runs code in another thread or process (concurrent.futures)",
    "multiprocessing": "runs code in another process (multiprocessing)",
    "torch.multiprocessing": "runs code in another process (torch.multiprocessing)",
    # code taken apart, rebuilt or found by name, where reading the source cannot follow it
    # inspect and traceback in part: `inspect.signature` or `traceback.print_exc()` is fine
    **{f"inspect.{f}": f"reads the interpreter's frames or another object's members "
                       f"(inspect.{f})"
       for f in ("currentframe", "stack", "trace", "getouterframes", "getinnerframes",
                 "getframeinfo", "getmembers", "getmembers_static", "getattr_static",
                 "getclosurevars", "unwrap")},
    **{f"traceback.{f}": f"walks the interpreter's frames (traceback.{f})"
       for f in ("walk_stack", "walk_tb")},
    "gc": "searches the interpreter's objects (gc)",
    "importlib": "imports by a computed name (importlib)",
    "pkgutil": "imports by a computed name (pkgutil)",
    "runpy": "runs another module's code (runpy)",
    "dis": "takes code objects apart (dis)",
    "marshal": "rebuilds code objects (marshal)",
    "pickle": "rebuilds objects from bytes (pickle)",
    "code": "runs code from strings (code)",
    "codeop": "runs code from strings (codeop)",
    "torch.library": "re-registers torch's operators (torch.library)",
    "torch.utils.cpp_extension": "compiles C++ into the kernel (torch.utils.cpp_extension)",
    "torch.utils.flop_counter": "reaches the FLOP counter a check measures with",
}
# Calls that run code the scan cannot read, or reach a namespace or attribute by a computed name.
_DYNAMIC_CALLS = {
    "eval": "runs code made from a string (eval)",
    "exec": "runs code made from a string (exec)",
    "compile": "compiles code made from a string (compile)",
    "breakpoint": "starts a debugger (breakpoint)",
}
_NAMESPACE_NAMES = {  # the dict of a module or object: any of its names, by a computed key
    "globals": "reads a namespace as a dictionary (globals())",
    "locals": "reads a namespace as a dictionary (locals())",
    "vars": "reads a namespace as a dictionary (vars())",
    "get_ipython": "runs code through IPython itself (get_ipython)",
}
_BY_NAME = ("getattr", "setattr", "delattr")
# Attributes that lead into the interpreter: code objects, frames, closures, an object's dict.
_INTERNALS = {
    "__code__", "__globals__", "__closure__", "__dict__", "__self__", "__func__", "__wrapped__",
    "__setattr__", "__getattribute__", "__delattr__", "__subclasses__", "__mro__", "__bases__",
    "__base__", "__reduce__", "__reduce_ex__", "__traceback__", "__defaults__",
    "__kwdefaults__", "__post_init__", "__dataclass_fields__", "__loader__", "__spec__",
    "__getattr__", "__import__", "__init_subclass__",
    "tb_frame", "tb_next", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
    "gi_frame", "cr_frame", "ag_frame", "gi_code", "co_code", "co_consts", "co_names",
    "attrgetter", "methodcaller",  # operator's getattr by name
}
_FORKS = {"fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnl", "spawnve",
          "execv", "execve", "execl", "execlp", "execvp", "popen"}
# IPython magics whose argument is Python the scan reads like any other code
_CODE_MAGICS = {"time", "timeit", "capture", "prun"}
_QUIET_MAGICS = {"matplotlib", "precision", "who", "whos", "pinfo", "pinfo2", "pdoc", "pdef"}
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


def _magic(node: ast.AST) -> tuple[str, str] | None:
    """(magic name, its code or argument) of `get_ipython().run_line_magic('timeit', 'x')` and
    `run_cell_magic('timeit', '', body)`, the calls IPython turns `%timeit x` and cells into."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("run_line_magic", "run_cell_magic") and \
            isinstance(node.func.value, ast.Call) and \
            getattr(node.func.value.func, "id", None) == "get_ipython" and node.args and \
            all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
        return node.args[0].value, node.args[-1].value
    return None


def parsed(source: str, _depth: int = 0) -> ast.Module | None:
    """A learner cell as Python (magics as IPython runs them), or None when it cannot run. The
    code inside `%time`/`%timeit`/`%%capture` is read as part of the cell: it runs there."""
    try:
        tree = ast.parse(_python(source))
    except (SyntaxError, ValueError):
        return None
    if _depth < 3:
        for node in list(ast.walk(tree)):
            m = _magic(node)
            if m and m[0] in _CODE_MAGICS and (inner := parsed(m[1], _depth + 1)) is not None:
                tree.body.extend(inner.body)
    return tree


def _imports(tree: ast.Module) -> tuple[dict[str, str], list[str]]:
    """local name -> the module (or module.name) it stands for; what importing them touches."""
    aliases: dict[str, str] = {}
    found: list[str] = []
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
    return aliases, found


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`torch.utils.flop_counter` for an attribute chain on an imported name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _attribute(node: ast.Attribute, aliases: dict[str, str],
               checker_aliases: set[str]) -> list[str]:
    found = []
    base = node.value.id if isinstance(node.value, ast.Name) else None
    module = aliases.get(base, base)
    if node.attr in _NAMES:  # course_lib.__file__, something.__builtins__
        found.append(_NAMES[node.attr])
    elif node.attr in _INTERNALS and not _own(node.value):
        found.append(f"reaches into the interpreter's internals (`.{node.attr}`)")
    sensitive = _SENSITIVE_ATTRS.get(node.attr)
    if sensitive and module == sensitive[0]:
        found.append(sensitive[1])
    if node.attr in _FORKS and module == "os":
        found.append(f"starts another process (os.{node.attr})")
    dotted = _dotted(node, aliases)
    if dotted:  # torch.library.Library, torch.utils.cpp_extension.load_inline
        found += [why for mod, why in _MODULES.items()
                  if "." in mod and _within(dotted, mod) and not _within(module or "", mod)]
    if base in checker_aliases and isinstance(node.ctx, (ast.Store, ast.Del)):
        found.append(f"rebinds the checker `{base}.{node.attr}`")
    elif module and isinstance(node.ctx, (ast.Store, ast.Del)) and \
            base not in ("self", "cls") and base in aliases:
        found.append(f"replaces the library function `{module}.{node.attr}`")
    return found


def _own(node: ast.AST) -> bool:
    """`self`, `cls` or `super()`: the learner's own object, whose internals are theirs."""
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super")


def _call(node: ast.Call, aliases: dict[str, str], checker_aliases: set[str]) -> list[str]:
    found = []
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name in _DYNAMIC_CALLS:
        found.append(_DYNAMIC_CALLS[name])
    if name in ("setattr", "delattr") and node.args:
        target = node.args[0]
        if isinstance(target, ast.Name) and (target.id in aliases or
                                             target.id in checker_aliases):
            found.append(f"rewrites the module `{aliases.get(target.id, target.id)}` "
                         f"({name})")
    if name in _BY_NAME and len(node.args) >= 2 and not _own(node.args[0]) and not (
            isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        found.append(f"reaches an attribute by a computed name ({name})")
    magic = _magic(node)
    if magic and magic[0] not in _CODE_MAGICS | _QUIET_MAGICS:
        found.append(f"runs the IPython magic %{magic[0]}")
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("system", "getoutput") and \
            isinstance(node.func.value, ast.Call) and \
            getattr(node.func.value.func, "id", None) == "get_ipython":
        found.append("runs shell commands (!)")
    return found


def suspicious(source: str, checker_aliases: set[str] = frozenset()) -> list[str]:
    """What one learner cell does that an exercise never needs (empty for honest answers)."""
    tree = parsed(source)
    if tree is None:
        return []  # it cannot run either
    aliases, found = _imports(tree)
    ipython_calls = {id(n.func.value) for n in ast.walk(tree)
                     if _magic(n) or (isinstance(n, ast.Call) and
                                      isinstance(n.func, ast.Attribute) and
                                      n.func.attr in ("system", "getoutput"))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found += _attribute(node, aliases, checker_aliases)
        elif isinstance(node, ast.Name):
            if node.id in _NAMES:
                found.append(_NAMES[node.id])
            if node.id in checker_aliases and isinstance(node.ctx, ast.Store):
                found.append(f"rebinds the checkers' module `{node.id}`")
        elif isinstance(node, ast.Call):
            found += _call(node, aliases, checker_aliases)
            if isinstance(node.func, ast.Name) and node.func.id in _NAMESPACE_NAMES and \
                    id(node) not in ipython_calls:
                found.append(_NAMESPACE_NAMES[node.func.id])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [why for word, why in _WORDS.items() if word in node.value]
            if _OUTSIDE.match(node.value):
                found.append(f"names a path outside its folder ({node.value[:40]!r})")
    for node in ast.walk(tree):  # `vars` passed around without a call: `f = vars`
        if isinstance(node, ast.Name) and node.id in _NAMESPACE_NAMES and \
                node.id != "get_ipython" and not _called(node, tree):
            found.append(_NAMESPACE_NAMES[node.id])
    return list(dict.fromkeys(found))


def _called(name: ast.Name, tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


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
