"""Stage 2, match: which solution notebook a submission comes from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from course_tools.grader.read import Source, grade_id

GENERATED_FROM = re.compile(r"solutions/([^\s`/]+\.ipynb)")


def match_source(nb: Any, sources: dict[str, Source], filename: str = "") -> Source | None:
    """Which solution notebook a submission comes from, even renamed or with cells deleted."""
    ids = {gid for gid in map(grade_id, nb.get("cells", [])) if gid}
    generated = ""
    metadata = nb.get("metadata")
    course = metadata.get("course") if isinstance(metadata, dict) else None
    if isinstance(course, dict) and isinstance(course.get("generated"), str):
        m = GENERATED_FROM.search(course["generated"])
        generated = m.group(1) if m else ""
    best, best_key = None, (0, 0, 0)
    for name, src in sources.items():
        key = (len(ids & src.ids), name == generated, name == Path(filename).name)
        if key > best_key:
            best, best_key = src, key
    return best
