"""Stage 0, strip: the course_lib a grading kernel imports, which holds no answer to read.

A submission's code runs in a kernel, and whatever that kernel can import or read a cheat can
use. So `course grade` does not hand it the course's course_lib but a copy made here, once per
chapter per run:

* every function a chapter's exercises ask the learner to write (the course_lib targets of its
  checks' `forbid=` lists) is a stub that raises, so calling it, reading `inspect.getsource` or
  the file, or reaching it by another import path, finds no implementation (nor its docstring);
  unless the chapter's own cells need it, directly or through a module they import
  (`used_through`): then only the `forbid` trap stands for it, as before;
* in every checker module (`checks/chNN.py`, or each part of a package `checks/chNN/`, all
  chapters) only the
  kernel half is left: what the checks' `run=` / `read=` arguments need, and the public helpers
  the exercise notebooks use (their data). Judges, references and measurements are stubs, and
  every check declaration loses its `reference=` and `mistakes=` (the right answer and the
  named wrong ones, `_mistakes`); the grader judges in its own process, with the real modules;
* every `checks/hints/*.md` keeps its headings and one placeholder tier: no hint, and none of
  the explanation choices' texts or which letter is right (`choice_check` declares only its
  letters in Python and reads the rest from the md when judging).

What a stub cannot take away: torch's own functions (`torch.softmax`, autograd) are still there;
`forbid` traps their use per exercise as before, and that trap lives in the learner's process.
`course check`, on a learner's own machine, keeps the whole course_lib (its test cells judge in
the kernel).
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterable
from importlib import import_module
from pathlib import Path

CHECKER_PATH = re.compile(r"ch\d+(\.py|/\w+\.py)")  # checks/chNN.py, checks/chNN/<part>.py
KERNEL_KEYWORDS = ("run", "read", "args", "forbid")  # what the kernel half uses
# what only a judge uses, dropped from every check declaration: the right answer and the named
# wrong ones (course_lib/checks/_mistakes.py), each a working answer to its exercise
JUDGE_KEYWORDS = ("reference", "mistakes")
PLACEHOLDER_TIER = "Hints are not shown while grading."
IN_GRADER = ("this is the checkers' own code, which runs only in the grader's process: an answer "
             "cannot call it")


def chapter_of(module: str) -> str | None:
    """'course_lib.checks.ch04' -> 'ch04'; None for a module that is not a chapter's checks."""
    m = re.fullmatch(r"course_lib\.checks\.(ch\d+)", module)
    return m.group(1) if m else None


def exercise_targets(chapters: Iterable[str]) -> dict[str, dict[str, str]]:
    """module name -> {qualname: why}, the course_lib definitions the chapters' exercises ask
    for (read from the checks' `forbid=` lists, in the grader's own process)."""
    from course_lib.checks import all_checks

    found: dict[str, dict[str, str]] = {}
    for chapter in chapters:
        import_module(f"course_lib.checks.{chapter}")
        for check in all_checks():
            if not check.id.startswith(chapter + "."):
                continue
            for owner, attr, *_ in check.forbid:
                obj = getattr(owner, attr, None)
                if isinstance(owner, type):
                    module, qualname = owner.__module__, f"{owner.__qualname__}.{attr}"
                else:
                    module = getattr(obj, "__module__", None) or getattr(owner, "__name__", "")
                    qualname = getattr(obj, "__qualname__", attr)
                if module.startswith("course_lib."):
                    why = (f"{module}.{qualname} would answer exercise {check.name!r} of "
                           f"chapter {chapter[2:]}: the grader's course_lib does not have it")
                    found.setdefault(module, {}).setdefault(qualname, why)
    return found


def build(course_lib: Path, dest: Path, chapters: Iterable[str], *, keep: set[str],
          uses: set[str] = frozenset()) -> Path:
    """Write the stripped copy of `course_lib` to dest/course_lib and return that folder.
    `keep`: names the exercise notebooks spell (a checker module's public helper of that name
    is kept whole); `uses`: names the chapters' own cells import from course_lib (never made a
    stub: in their exercises, only the `forbid` trap stands for them)."""
    chapters = sorted(set(chapters))
    target = dest / "course_lib"
    shutil.rmtree(target, ignore_errors=True)  # what a failed build left
    shutil.copytree(course_lib, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    needed = used_through(course_lib, uses)
    for module, names in exercise_targets(chapters).items():
        names = {q: why for q, why in names.items() if q.split(".")[0] not in uses
                 and (module, q.split(".")[0]) not in needed}
        path = target.joinpath(*module.split(".")[1:]).with_suffix(".py")
        if not path.exists():
            path = path.with_suffix("") / "__init__.py"
        path.write_text(stub_definitions(path.read_text(encoding="utf-8"), names),
                        encoding="utf-8")
    strip_checkers(target / "checks", keep)
    for md in (target / "checks" / "hints").glob("*.md"):
        md.write_text(blank_hints(md.read_text(encoding="utf-8")), encoding="utf-8")
    return target


def _imports(path: Path, package: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The course_lib modules a file imports, and the (module, name) pairs it imports by name."""
    modules, names = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:  # relative: course_lib has none
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            modules.add(node.module)
            for a in node.names:
                names.add((node.module, a.name))
                modules.add(f"{node.module}.{a.name}")  # `from course_lib.x import module`
        elif isinstance(node, ast.Import):
            modules.update(a.name for a in node.names if a.name.startswith(package))
    return modules, names


def used_through(course_lib: Path, uses: set[str]) -> set[tuple[str, str]]:
    """(module, name) of every course_lib definition that a module the chapter's cells import
    (any module of course_lib that defines one of `uses`), or a module those import, imports
    by name: what those cells need in working order. The checker modules do not count."""
    files = {".".join(("course_lib", *p.relative_to(course_lib).with_suffix("").parts))
             .removesuffix(".__init__"): p for p in course_lib.rglob("*.py")
             if "checks" not in p.relative_to(course_lib).parts}
    graph = {m: _imports(p, "course_lib") for m, p in files.items()}
    defined = {m for m, p in files.items() if any(
        re.search(rf"^(def|class) {re.escape(u)}\b|^{re.escape(u)} =", p.read_text("utf-8"),
                  re.M) for u in uses)}
    seen, todo = set(), [*defined, *(m for m in files if m.rsplit(".", 1)[-1] in uses)]
    while todo:
        m = todo.pop()
        if m in seen or m not in graph:
            continue
        seen.add(m)
        todo += graph[m][0]
    # a package's __init__ only re-exports: what it names is used where it is called
    return {pair for m in seen if not files[m].name == "__init__.py" for pair in graph[m][1]}


# ------------------------------------------------------------------ stubs

def _stub_body(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, why: str) -> list:
    """`raise NotImplementedError(why)`, and no docstring: a docstring may spell the answer
    (`causal_mask`'s names the one-line torch expression it equals)."""
    raise_ = ast.Raise(ast.Call(ast.Name("NotImplementedError", ast.Load()), [ast.Constant(why)],
                                []), None)
    if isinstance(node, ast.ClassDef):  # a class: constructing it raises
        init = ast.parse("def __init__(self, *args, **kwargs): pass").body[0]
        init.body = [raise_]
        return [init]
    return [raise_]


def stub_definitions(text: str, names: dict[str, str]) -> str:
    """`text` with each definition named in `names` ('f', 'Class', 'Class.method') made a stub
    that raises NotImplementedError(why): its signature stays, its code and docstring go."""
    tree = ast.parse(text)

    def visit(body: list, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = prefix + node.name
                if qualname in names:
                    node.body = _stub_body(node, names[qualname])
                    if isinstance(node, ast.ClassDef):
                        node.decorator_list = []
                elif isinstance(node, ast.ClassDef):
                    visit(node.body, qualname + ".")

    visit(tree.body, "")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# ------------------------------------------------------------------ the checker modules

def _is_check_factory(call: ast.AST) -> bool:
    func = call.func if isinstance(call, ast.Call) else None
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name.endswith("_check")


def _names(node: ast.AST | None) -> set[str]:
    """Every bare name and `alias.attr` spelt in `node` (as 'name' and 'alias.attr')."""
    found: set[str] = set()
    for n in ast.walk(node) if node is not None else ():
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            found.add(f"{n.value.id}.{n.attr}")
    return found


def _kernel_names(call: ast.Call) -> set[str]:
    """What a check declaration hands the kernel half: its run/read/args/forbid arguments."""
    return set().union(*(_names(k.value) for k in call.keywords if k.arg in KERNEL_KEYWORDS))


class _Module:
    """One checker module as the strip reads it: its definitions, what it imports, and the
    roots of its kernel half (the names its import-time statements and checks' run/read use)."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.defs = {n.name: n for n in self.tree.body
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        self.aliases: dict[str, str] = {}  # local name -> module
        self.roots: set[str] = set()
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.imported[a.asname or a.name] = (node.module, a.name)
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for deco in node.decorator_list:
                    if isinstance(deco, ast.Call) and _is_check_factory(deco):
                        self.roots |= _kernel_names(deco)
                    else:
                        self.roots |= _names(deco)
            else:  # runs at import: what it names must exist and work
                self.roots |= _names_outside_checks(node)

    def checks(self, name: str) -> bool:
        node = self.defs[name]
        return any(isinstance(d, ast.Call) and _is_check_factory(d)
                   for d in getattr(node, "decorator_list", ()))


def _names_outside_checks(node: ast.AST) -> set[str]:
    """Names a module-level statement uses, leaving out a check factory's judge-side arguments."""
    found: set[str] = set()

    def walk(n: ast.AST) -> None:
        if isinstance(n, ast.Call) and _is_check_factory(n):
            found.update(_kernel_names(n))
            found.update(_names(n.func))
            return
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            found.add(f"{n.value.id}.{n.attr}")
        for child in ast.iter_child_nodes(n):
            walk(child)

    walk(node)
    return found


def checker_modules(checks_dir: Path) -> dict[str, Path]:
    """'course_lib.checks.ch04' -> its file, for every chapter's checker module or package
    part under `checks_dir` (a package's `__init__` is the package's own name)."""
    found = {}
    for p in sorted(checks_dir.rglob("*.py")):
        rel = p.relative_to(checks_dir).as_posix()
        if CHECKER_PATH.fullmatch(rel):
            found["course_lib.checks." + rel.removesuffix(".py").removesuffix("/__init__")
                  .replace("/", ".")] = p
    return found


def strip_checkers(checks_dir: Path, keep: set[str]) -> None:
    """Stub, in every checker module under `checks_dir`, each definition the kernel half does
    not reach (tests/test_grading_stripped.py pins what each module keeps)."""
    modules = {name: _Module(name, p) for name, p in checker_modules(checks_dir).items()}
    kept: set[tuple[str, str]] = set()
    todo = [(m.name, r) for m in modules.values() for r in m.roots | keep]
    while todo:
        module_name, name = todo.pop()
        module = modules.get(module_name)
        if module is None:
            continue
        head, _, attr = name.partition(".")
        if attr and head in module.aliases:  # alias.attr: a name of another checker module
            todo.append((module.aliases[head], attr))
            continue
        if head in module.imported:
            todo.append(module.imported[head])
            continue
        if head not in module.defs or (module_name, head) in kept:
            continue
        kept.add((module_name, head))
        node = module.defs[head]
        if module.checks(head):
            continue  # a check's body is its judge: never the kernel's
        todo += [(module_name, n) for n in _names(node)]
    for module in modules.values():
        for call in ast.walk(module.tree):
            if isinstance(call, ast.Call) and _is_check_factory(call):
                call.keywords = [k for k in call.keywords if k.arg not in JUDGE_KEYWORDS]
        for name, node in module.defs.items():
            if (module.name, name) in kept and not module.checks(name):
                continue
            if not module.checks(name):
                node.decorator_list = []
            node.body = _stub_body(node, IN_GRADER)
        module.path.write_text(ast.unparse(ast.fix_missing_locations(module.tree)) + "\n",
                               encoding="utf-8")


def blank_hints(text: str) -> str:
    """A hints file with its `## name` headings and one placeholder tier under each."""
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    return "".join(f"{h}\n\n1. {PLACEHOLDER_TIER}\n\n" for h in headings)
