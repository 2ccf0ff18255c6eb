"""Stage 3c, reach: what the learner's code a check runs names, read on the grader's side.

A check's `forbid` list says which functions an exercise rules out (the course's own softmax,
torch's). In the kernel that is a trap, and a trap in the learner's process can be stepped
around; here the same list is read against the learner's source, where nothing can disarm it.
For each probe the grader starts from the arguments of the check call (`check.softmax_rows(
softmax_rows)`), follows every name they use to its definition in the learner's cells (answers
and added cells before the probe), and so on, and flags a forbidden name anywhere in what it
reached: `torch.softmax`, `x.softmax(-1)`, `F.log_softmax`, `from course_lib.multihead import
split_heads as mine`, `getattr(F, "softmax")`, `ops["softmax"]`. Reaching a forbidden function
by a computed name (`getattr(F, name)`, `eval`, `vars(F)`) is flagged for every exercise by
scan.py. A name the learner defines (`def softmax(x)`), and attributes of `self`, are theirs,
except a name a set-up cell binds to a forbidden function (chapter 08's `tiled_attention`): that
stays the course's, whatever an answer assigns to it (`if False: tiled_attention = mine`).
Where the grader can resolve a name (the set-up cells' imports, modules it has loaded itself),
a function that only shares a forbidden name is allowed: chapter 09 rules out torch's
`F.scaled_dot_product_attention` and builds on the course's function of that name.

A forbidden name matches an identifier equal to it (ignoring case and leading or trailing
underscores) or, for names of six letters or more, one that contains it: `softmax` catches
`log_softmax`, `_softmax` and `nn.Softmax`; `MultiHeadAttention` catches
`nn.MultiheadAttention`. A class forbidden through its `forward` is forbidden by its name.
A flag costs only the exercise whose check forbids the name.
"""

from __future__ import annotations

import ast
import sys
import types
from typing import Any

from course_tools.grader.scan import parsed

SUBSTRING_FROM = 6  # shorter forbidden names (grad, RNN) must match whole
_UNKNOWN = object()  # a reference the grader cannot resolve: its name alone is judged


def forbidden_names(check: Any) -> set[str]:
    """The names a check's `forbid` list rules out in the learner's code."""
    names = set()
    for obj, attr in check.forbid:
        if attr in ("forward", "__call__") and isinstance(obj, type):
            names.add(obj.__name__)
        else:
            names.add(attr)
    return names


def match(identifier: str, names: set[str]) -> str | None:
    """The forbidden name `identifier` spells, or None."""
    if identifier in names:
        return identifier
    low, found = identifier.lower(), []
    for name in names:
        n = name.lower()
        if low.strip("_") == n.strip("_") or (len(n) >= SUBSTRING_FROM and n in low):
            found.append(name)
    return max(found, key=lambda n: (len(n), n)) if found else None  # the most specific


class Forbidden:
    """What one check rules out: its targets themselves and, for what the grader cannot
    resolve, their names."""

    def __init__(self, check: Any) -> None:
        self.names = forbidden_names(check)
        self.objects: dict[int, str] = {}  # id of a target -> its name
        for obj, attr in check.forbid:
            if attr in ("forward", "__call__") and isinstance(obj, type):
                self.objects[id(obj)] = self.objects[id(getattr(obj, attr))] = obj.__name__
            elif getattr(obj, attr, None) is not None:
                self.objects[id(getattr(obj, attr))] = attr

    def rules_out(self, identifier: str, obj: Any = _UNKNOWN) -> str | None:
        """The forbidden name `identifier` (standing for `obj`, where resolved) is, or None.
        A resolved function that only shares a forbidden name is allowed: chapter 09 rules
        out torch's `F.scaled_dot_product_attention` but builds on the course's."""
        if obj is not _UNKNOWN and id(obj) in self.objects:
            return self.objects[id(obj)]
        name = match(identifier, self.names)
        if name is not None and obj is not _UNKNOWN and obj is not None and identifier == name:
            return None
        return name


def _bound(stmt: ast.stmt) -> set[str]:
    """The module-level names one top-level statement binds (not those inside a def)."""
    names: set[str] = set()
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # its body is its own scope
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


def learner_bindings(trees: list[ast.Module]) -> set[str]:
    """Every name the learner's cells bind anywhere: defs, classes, assignments, parameters,
    loop and `with` targets (an import binds too, but a forbidden import is flagged itself)."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _own_attribute(node: ast.Attribute) -> bool:
    """`self.x`, `cls.x`, `super().x`: what the learner's own object holds (put there by code
    that is itself scanned)."""
    base = node.value
    return (isinstance(base, ast.Name) and base.id in ("self", "cls")) or (
        isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super")


class Names:
    """What the names in the learner's code stand for, as far as the grader can tell without
    running it: the set-up cells' imports (resolved in the grader), modules the learner imports
    that the grader has loaded already (never imported for them), and the learner's own names."""

    def __init__(self, given: dict[str, Any], own: set[str], trees: list[ast.Module]) -> None:
        self.given, self.own = given, own
        self.imported: dict[str, Any] = {}
        for tree in trees:
            for n in ast.walk(tree):
                if isinstance(n, ast.Import):
                    for a in n.names:
                        local = a.asname or a.name.split(".")[0]
                        self.imported[local] = sys.modules.get(a.name if a.asname else local,
                                                               _UNKNOWN)
                elif isinstance(n, ast.ImportFrom):
                    for a in n.names:
                        self.imported[a.asname or a.name] = self.from_module(n.module, a.name,
                                                                             n.level)

    @staticmethod
    def from_module(module: str | None, name: str, level: int = 0) -> Any:
        base = sys.modules.get(module or "", _UNKNOWN) if not level else _UNKNOWN
        return _UNKNOWN if base is _UNKNOWN else sys.modules.get(
            f"{module}.{name}", getattr(base, name, _UNKNOWN))

    def resolve(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            if node.id in self.imported:
                return self.imported[node.id]
            if node.id in self.given:  # a set-up cell's name stays the course's: a learner's
                return self.given[node.id]  # `if False: name = 0` must not hide it
            return _UNKNOWN
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is _UNKNOWN or not isinstance(base, (types.ModuleType, type)):
                return _UNKNOWN  # an instance's attribute could run a property: not looked up
            try:
                return getattr(base, node.attr, _UNKNOWN)
            except Exception:  # noqa: BLE001 - a lazy module attribute that fails to load
                return _UNKNOWN
        return _UNKNOWN


def spelled(node: ast.AST, forbidden: Forbidden, names: Names) -> list[str]:
    """The forbidden names one reached piece of code uses, as the feedback says them."""
    found = []
    for n in ast.walk(node):
        uses: list[tuple[str, str, Any]] = []  # (identifier, how the code uses it, its object)
        if isinstance(n, ast.Attribute) and not _own_attribute(n):
            uses.append((n.attr, f"`.{n.attr}`", names.resolve(n)))
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            obj = names.resolve(n)
            if obj is not _UNKNOWN or n.id not in names.own:
                uses.append((n.id, f"`{n.id}`", obj))
        elif isinstance(n, ast.Import):
            uses += [(p, f"an import of `{a.name}`", _UNKNOWN)
                     for a in n.names for p in a.name.split(".")]
        elif isinstance(n, ast.ImportFrom):
            uses += [(p, f"an import from `{n.module}`", _UNKNOWN)
                     for p in (n.module or "").split(".") if p]
            uses += [(a.name, f"an import of `{a.name}`",
                      names.from_module(n.module, a.name, n.level)) for a in n.names]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and \
                n.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(n.args) >= 2 \
                and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
            uses.append((n.args[1].value, f"`{n.func.id}(..., {n.args[1].value!r})`", _UNKNOWN))
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and \
                isinstance(n.slice.value, str):
            uses.append((n.slice.value, f"`[{n.slice.value!r}]`", _UNKNOWN))
        for identifier, how, obj in uses:
            name = forbidden.rules_out(identifier, obj)
            if name:
                found.append(f"{how}, where the exercise rules out `{name}`")
    return found


class Reach:
    """The learner's top-level statements before a probe, by the names they bind."""

    def __init__(self) -> None:
        self.defs: dict[str, list[ast.stmt]] = {}

    def add(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            for name in _bound(stmt):
                self.defs.setdefault(name, []).append(stmt)

    def from_(self, start: list[ast.AST]) -> list[ast.AST]:
        """`start` and every definition the names it uses lead to, transitively."""
        reached: list[ast.AST] = []
        seen: set[int] = set()
        todo = list(start)
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            reached.append(node)
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    todo.extend(self.defs.get(n.id, ()))
        return reached


def reach_plan(cells: list[Any], given: dict[str, Any] | None = None) -> dict[int, list[str]]:
    """plan cell index of a probe -> the forbidden names the learner's code it runs uses.
    `given`: what the set-up cells' imports bind (`calls.imported_names`)."""
    trees = [(i, c, parsed(c.source)) for i, c in enumerate(cells) if c.role in ("answer", "extra")]
    parsed_trees = [t for _, _, t in trees if t is not None]
    names = Names(given or {}, learner_bindings(parsed_trees), parsed_trees)
    found: dict[int, list[str]] = {}
    for p, cell in enumerate(cells):
        check = getattr(cell.call, "check", None) if cell.role == "probe" else None
        if check is None or not check.forbid:
            continue
        forbidden, reach, start = Forbidden(check), Reach(), []
        for i, c, tree in trees:
            if i > p or tree is None:
                continue
            reach.add(tree)
            if c.role == "answer" and c.exercise == cell.grade_id:
                start.append(tree)
        start += [t for a in cell.call.args if (t := parsed(a)) is not None]
        what = [w for node in reach.from_(start) for w in spelled(node, forbidden, names)]
        if what:
            found[p] = [f"the code {check.name} runs uses {w}" for w in dict.fromkeys(what)]
    return found
