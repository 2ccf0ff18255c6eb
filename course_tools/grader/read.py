"""Stage 1, read: the source notebooks, and each submission's bytes (never written)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

MAX_BYTES = 50 << 20  # a submission larger than this is not read


def meta(cell: Any) -> dict:
    """A cell's nbgrader metadata, or {} when it is absent or malformed."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    m = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return m if isinstance(m, dict) else {}


def grade_id(cell: Any) -> str | None:
    gid = meta(cell).get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def cell_text(source: Any) -> str:
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    return ""


def cell_type(cell: Any) -> str:
    t = cell.get("cell_type") if isinstance(cell, dict) else None
    return t if isinstance(t, str) else ""


@dataclass
class Source:
    """A parsed solution notebook: the one thing shared between submissions."""

    path: Path
    nb: Any
    graded: list[tuple[str, float, int]]  # (grade_id, points, cell index) of graded code cells
    ids: set[str]

    @property
    def name(self) -> str:
        return self.path.name


def default_solutions_dir(folder: str = "solutions") -> Path:
    """The course's own solutions/ (next to course_lib and course_tools), else ./solutions."""
    here = Path(__file__).resolve().parents[2] / folder  # course_tools/grader/read.py
    return here if here.is_dir() else Path(folder)


def default_check_dir() -> Path:
    """Where `course check` takes its check cells from: solutions/, or, in a copy of the course
    handed out without solutions, the exercise notebooks themselves (same check cells, no hidden
    tests, which `check` does not run anyway)."""
    solutions = default_solutions_dir()
    return solutions if any(solutions.glob("*.ipynb")) else default_solutions_dir("exercises")


def parse_source(path: Path, nb: Any) -> Source:
    """A source notebook (already read) as the later stages need it."""
    graded = []
    for i, cell in enumerate(nb.cells):
        m = meta(cell)
        if cell.cell_type == "code" and m.get("grade") and grade_id(cell):
            graded.append((m["grade_id"], float(m.get("points", 0) or 0), i))
    ids = {gid for gid in map(grade_id, nb.cells) if gid}
    return Source(Path(path), nb, graded, ids)


def load_sources(solutions_dir: Path | None = None) -> dict[str, Source]:
    solutions_dir = Path(solutions_dir) if solutions_dir else default_solutions_dir()
    return {path.name: parse_source(path, nbformat.read(path, as_version=4))
            for path in sorted(solutions_dir.glob("*.ipynb"))}


def expand(paths: list[Path]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(q for q in sorted(p.rglob("*.ipynb")) if ".ipynb_checkpoints" not in q.parts)
        else:
            out.append(p)
    return out


def read_notebook(path: Path) -> tuple[bytes | None, Any, str | None]:
    """(bytes, notebook, error). Only reads the file."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            return None, None, "not a file"
        if size > MAX_BYTES:
            return (
                None,
                None,
                f"file too large ({size / 2**20:.0f} MB; the limit is {MAX_BYTES >> 20} MB)",
            )
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, None, "file not found"
    except OSError as e:
        return None, None, f"cannot read the file: {e}"
    try:
        text = data.decode("utf-8")
        try:
            nb = nbformat.reads(text, as_version=4)
        except Exception:  # noqa: BLE001 - a damaged v4 notebook: keep the cells that are intact
            nb = json.loads(text)
            if not (isinstance(nb, dict) and nb.get("nbformat") == 4):
                raise
        if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as e:  # noqa: BLE001 - any parse failure is the submission's problem
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return data, None, f"not a readable Jupyter notebook ({msg})"
    return data, nb, None


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
