"""The hint tiers: read from `hints/<chapter>.md`, shown one tier at a time."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from course_lib.checks._check import show_hint
from course_lib.checks._registry import get


@functools.cache
def chapter_hints(chapter: str) -> dict[str, tuple[str, ...]]:
    """The hint tiers of a chapter's checks, as `hints/<chapter>.md` writes them: a `## name`
    heading per check, a numbered item per tier, its continuation lines indented."""
    found: dict[str, list[str]] = {}
    tiers = None
    text = (Path(__file__).parent / "hints" / f"{chapter}.md").read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith("## "):
            tiers = found.setdefault(line[3:].strip(), [])
        elif tiers is not None and re.match(r"\d+\. ", line):
            tiers.append(line.split(". ", 1)[1].strip())
        elif tiers and line.startswith("   ") and line.strip():
            tiers[-1] += " " + line.strip()
    return {name: tuple(tiers) for name, tiers in found.items()}


def hint(exercise: str, tier: int = 1) -> None:
    """Print hint number `tier` for an exercise (its grade_id or check id) and say how many
    tiers there are. Tier 1 names the idea; later tiers get more specific; the last points to
    the solution notebook."""
    show_hint(get(exercise), tier)
