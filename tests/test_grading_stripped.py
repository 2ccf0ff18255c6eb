"""The course_lib a grading kernel imports holds no answer (issue 23; grader/strip.py).

What the stripped copy is: built here, read and imported in a subprocess. The issue's cheats
that only a kernel shows are graded in the test run's shared batch (tests/test_graded_batch.py),
those the grader's reading of the source catches on the source (tests/test_grader_reach.py): each
used to earn full points on its exercise by calling a reference the kernel could reach.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import course_lib
from course_tools.grader import strip
from course_tools.grader.pipeline import given_names
from course_tools.grader.read import load_sources

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(f"ch{p.name[:2]}" for p in (REPO / "solutions").glob("[0-9]*.ipynb"))

def _is_reader(name: str) -> bool:
    """A commit's `read=`: checks the form of a prediction, holds no reference."""
    return name.startswith("_read_")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(chapters) -> the stripped course_lib a kernel grading those chapters imports."""
    words, uses = given_names(load_sources(None))
    made = {}

    def make(*chapters):
        if chapters not in made:
            dest = tmp_path_factory.mktemp("stripped")
            made[chapters] = strip.build(Path(course_lib.__file__).parent, dest, chapters,
                                         keep=words, uses=set().union(*(uses.get(c, set())
                                                                        for c in chapters)))
        return made[chapters]
    return make


@pytest.fixture(scope="module")
def stripped(build):
    return build(*CHAPTERS)


def _kept(path: Path) -> set[str]:
    """The module-level definitions of a stripped file whose body is not a stub."""
    kept = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = [n for n in node.body if not (isinstance(n, ast.Expr)
                                                 and isinstance(n.value, ast.Constant))]
            if not (len(body) == 1 and isinstance(body[0], ast.Raise)) and \
                    not (isinstance(node, ast.ClassDef) and _stub_class(node)):
                kept.add(node.name)
    return kept


def _stub_class(node: ast.ClassDef) -> bool:
    inits = [n for n in node.body if isinstance(n, ast.FunctionDef)]
    return len(inits) == 1 and isinstance(inits[0].body[-1], ast.Raise)


def test_only_the_kernel_half_of_every_checker_module_is_left(stripped):
    """What each checker module keeps whole in the grading kernel is what it declares itself,
    its KERNEL_HALF (what the checks' run=/read= call, and the data helpers the notebooks
    use; none by default). A module that declares no check (chapter 08's tools for running a
    learner's Triton kernel) holds no reference at all and is not pinned."""
    modules = strip.checker_modules(stripped / "checks")
    assert "course_lib.checks.ch04" in modules and "course_lib.checks.ch08.kernels" in modules
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.Call) and strip._is_check_factory(n)
                   for n in ast.walk(tree)):
            continue
        kept = {n for n in _kept(path) if not _is_reader(n)}
        assert kept == set(getattr(importlib.import_module(name), "KERNEL_HALF", ())), name


def test_the_references_the_issue_named_are_stubs(stripped):
    for module, name in [("ch04", "_causal_reference"), ("ch05", "_ref_merge"),
                         ("ch05", "_ref_mha"), ("ch08.tiling", "_reference_update"),
                         ("ch10", "_variant"), ("ch08.tiling", "measured_fraction")]:
        path = strip.checker_modules(stripped / "checks")[f"course_lib.checks.{module}"]
        assert name in {n.name for n in ast.parse(path.read_text("utf-8")).body
                        if isinstance(n, ast.FunctionDef)}, (module, name)
        assert name not in _kept(path), (module, name)


def _in_kernel(lib: Path, code: str) -> dict:
    """Run `code` (which sets `out`) with the stripped course_lib first on the path."""
    env = dict(os.environ, PYTHONPATH=str(lib.parent))
    script = f"import json\n{code}\nprint(json.dumps(out))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=lib.parent, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_checker_module_imports_and_declares_the_same_checks(stripped):
    """... and none of them carries its reference or its named mistakes' wrong answers (each
    a working answer, or the way to one) into the kernel."""
    from course_lib.checks import all_checks

    want = {c.id: [c.name, list(c.grade_ids), c.hint_key] for c in all_checks()}
    assert sum(len(c.mistakes) for c in all_checks()) and any(c.reference for c in all_checks())
    got = _in_kernel(stripped, (
        "import course_lib\n"
        f"assert course_lib.__file__.startswith({str(stripped)!r}), course_lib.__file__\n"
        "from course_lib.checks import all_checks\n"
        "out = {c.id: [c.name, list(c.grade_ids), c.hint_key] for c in all_checks()}\n"
        "carried = [c.id for c in all_checks() if c.mistakes or c.reference is not None]\n"
        "assert not carried, carried"))
    assert got == want
    for path in (stripped / "checks").rglob("*.py"):
        calls = [n for n in ast.walk(ast.parse(path.read_text("utf-8")))
                 if isinstance(n, ast.Call) and strip._is_check_factory(n)]
        assert not [k.arg for c in calls for k in c.keywords if k.arg in strip.JUDGE_KEYWORDS]


def test_an_exercises_function_is_a_stub_that_says_so_and_shows_no_code(build):
    got = _in_kernel(build("ch04"), (
        "import inspect, torch, course_lib.masks as m, course_lib.multihead as mh\n"
        "out = {}\n"
        "for f, args in ((m.causal_mask, (3,)), (mh.split_heads, (torch.ones(1, 2, 4), 2))):\n"
        "    try:\n"
        "        f(*args)\n"
        "        out[f.__name__] = 'ran'\n"
        "    except NotImplementedError as e:\n"
        "        out[f.__name__] = [str(e), inspect.getsource(f)]"))
    message, source = got["causal_mask"]
    assert "exercise 'causal_mask' of chapter 04" in message
    assert "tril" not in source and "arange" not in source and "<=" not in source
    assert "raise NotImplementedError" in source and '"""' not in source  # nor its docstring
    assert got["split_heads"] == "ran"  # chapter 05's exercise, not chapter 04's
    message = _in_kernel(build("ch01"), (
        "import course_lib.lookup as l\n"
        "try:\n"
        "    l.soft_lookup(None, None, None)\n"
        "except NotImplementedError as e:\n"
        "    out = str(e)"))
    assert message.startswith("course_lib.lookup.soft_lookup would answer exercise")


def test_a_function_the_chapters_own_cells_need_stays(build):
    """Chapter 06 runs the course's RNN in a given cell, chapter 10 the course's trained models
    (made of TransformerBlock): the exercises that ask for these keep only the forbid trap."""
    got = _in_kernel(build("ch06", "ch10"), (
        "import torch\n"
        "from course_lib.recurrent import RunningSummaryRNN\n"
        "from course_lib.models.block import TransformerBlock\n"
        "torch.manual_seed(0)\n"
        "rnn = RunningSummaryRNN(d_in=3, d_hidden=4)\n"
        "out = [list(rnn(torch.randn(1, 5, 3))[0].shape),\n"
        "       list(TransformerBlock(8, 2, 16)(torch.randn(1, 3, 8)).shape)]"))
    assert got == [[1, 5, 4], [1, 3, 8]]


def test_an_installed_course_is_hidden_under_the_same_copy(tmp_path):
    """A course installed into site-packages (not editable) would hold the whole course_lib
    where the kernel can import it by path: the sandbox binds the stripped copy over it too."""
    from course_tools.grader import sandbox

    layout = sandbox.Layout.create()
    try:
        copy, installed = tmp_path / "copy" / "course_lib", tmp_path / "site" / "course_lib"
        args, _ = sandbox.wrap(layout, course_lib=copy, python_path=[], hide=[],
                               launcher=str(tmp_path / "launcher.py"), installed=installed)
        binds = [tuple(args[i + 1:i + 3]) for i, a in enumerate(args) if a == "--ro-bind"]
        assert (str(copy), str(layout.lib / "course_lib")) in binds
        assert (str(copy), str(installed)) in binds
        args, _ = sandbox.wrap(layout, course_lib=copy, python_path=[], hide=[],
                               launcher=str(tmp_path / "launcher.py"))
        assert not any(dst == str(installed) for _, dst in
                       [tuple(args[i + 1:i + 3]) for i, a in enumerate(args) if a == "--ro-bind"])
    finally:
        shutil.rmtree(layout.root, ignore_errors=True)


def test_hints_and_explanations_say_nothing_in_the_kernel(stripped):
    from course_lib.checks._hints import chapter_hints

    for md in sorted((stripped / "checks" / "hints").glob("*.md")):
        text = md.read_text(encoding="utf-8")
        real = chapter_hints(md.stem)
        assert set(re.findall(r"^## (\S+)", text, re.M)) == set(real)
        assert set(re.findall(r"^\d+\. (.*)$", text, re.M)) <= {strip.PLACEHOLDER_TIER}
        assert "(right)" not in text and "\n- " not in text
    source = (stripped / "checks" / "ch01.py").read_text(encoding="utf-8")
    original = (Path(course_lib.__file__).parent / "checks" / "ch01.py").read_text("utf-8")
    for feedback in re.findall(r'"([a-z]\w{3,}[^"]{40,})"', original):
        assert feedback not in source
