"""The grader speaks to course_lib only through its public API (issue 24).

The protocol the grader uses (encode the cases, the kernel-side probe, load the outcomes and the
tampering report, the failures a judge raises) is exported and documented by
`course_lib.checks`; no module of `course_tools` imports a `_`-prefixed module of course_lib, or
names one in the code it has a kernel run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import course_lib.checks as checks

REPO = Path(__file__).resolve().parent.parent
TOOLS = sorted((REPO / "course_tools").rglob("*.py"))
PRIVATE = re.compile(r"\bcourse_lib(\.\w+)*\._\w+")  # course_lib.checks._probe, ...
PROTOCOL = ["Check", "CheckFailure", "OutcomeError", "ReferenceCall", "encode", "load_outcomes",
            "load_tampered", "probe"]


def _private_uses(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names
                      if a.name.startswith("course_lib") and PRIVATE.search(a.name)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib"):
            if PRIVATE.search(node.module):
                found.append(f"{where} from {node.module}")
            found += [f"{where} from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"{where} names {m.group(0)}" for m in PRIVATE.finditer(node.value)]
    return found


def test_course_tools_imports_no_private_course_lib_module():
    assert TOOLS, "course_tools has no Python files?"
    found = [use for path in TOOLS for use in _private_uses(path)]
    assert found == []


def test_the_check_finds_a_private_import(tmp_path):
    bad = tmp_path / "course_tools" / "x.py"
    bad.parent.mkdir()
    bad.write_text("from course_lib.checks._data import encode\n"
                   "from course_lib.checks import _core\n"
                   "SOURCE = '__import__(\"course_lib.checks._probe\")'\n")
    assert len(_private_uses(bad, tmp_path)) == 3


def test_what_course_tools_takes_from_course_lib_checks_is_exported():
    taken = set()
    for path in TOOLS:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "course_lib.checks":
                taken |= {a.name for a in node.names}
    assert taken and taken <= set(checks.__all__)


@pytest.mark.parametrize("name", PROTOCOL)
def test_the_grading_protocol_is_public_and_documented(name):
    assert name in checks.__all__ and getattr(checks, name) is not None
    assert f"`{name}" in checks.__doc__
