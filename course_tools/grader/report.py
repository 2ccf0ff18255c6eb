"""Stage 6, report: the score table, JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from course_tools.grader.results import SubmissionResult, _num


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def _wrap(text: str, width: int, max_lines: int = 3) -> list[str]:
    """Feedback in at most `max_lines` lines of `width`, the last one cut with an ellipsis."""
    import textwrap

    lines = textwrap.wrap(" ".join(text.split()), max(20, width)) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = _short(lines[-1] + " …", width)
    return lines


def format_table(results: list[SubmissionResult], *, hints: bool = False, width: int = 110) -> str:
    lines = []
    for r in results:
        head = f"{r.submission}"
        if r.source:
            head += f"  (source: {Path(r.source).name})"
        flagged = sum(e.flagged for e in r.exercises)
        lines.append(f"{head}   total {_num(r.score)}/{_num(r.max_score)}"
                     + (f"   {flagged} FLAGGED" if flagged else ""))
        if r.error:
            lines.append(f"  error: {_short(r.error, width)}")
        id_w = max([len(e.id) for e in r.exercises] + [8])
        pad = " " * (id_w + 13)
        for e in r.exercises:
            pts = f"{_num(e.score)}/{_num(e.max_score)}"
            text = _wrap(e.feedback, width - id_w - 13)
            lines.append(f"  {e.id:<{id_w}}  {pts:>7}  {text[0]}")
            lines.extend(pad + t for t in text[1:])
            if hints and e.score < e.max_score and e.hint and e.hint not in e.feedback:
                lines.extend(pad + t for t in _wrap("hint: " + e.hint, width - id_w - 13, 2))
        lines.append("")
    if len(results) > 1:
        graded = [r for r in results if r.exercises]
        errors = sum(1 for r in results if r.error)
        total = sum(r.score for r in graded)
        best = sum(r.max_score for r in graded)
        lines.append(
            f"{len(results)} submissions graded: {_num(total)}/{_num(best)} points in all; "
            f"{errors} with errors."
        )
    return "\n".join(lines).rstrip() + "\n"


def format_json(results: list[SubmissionResult]) -> str:
    return json.dumps([r.to_json() for r in results], indent=2, ensure_ascii=False) + "\n"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(field):
    """A CSV field a spreadsheet shows as text: one that starts with =, +, -, @, a tab or a
    carriage return (which Excel, LibreOffice and Google Sheets would read as a formula) gets
    a leading apostrophe; a carriage return inside becomes a space (the writer would not quote
    it, and a reader would split the row there). Numbers are left as they are."""
    if not isinstance(field, str):
        return field
    return ("'" if field.startswith(FORMULA_START) else "") + field.replace("\r", " ")


class SafeWriter:
    """csv.writer whose rows go through `csv_safe`."""

    def __init__(self, buf):
        self._w = csv.writer(buf, lineterminator="\n")

    def writerow(self, row) -> None:
        self._w.writerow([csv_safe(f) for f in row])


def format_csv(results: list[SubmissionResult]) -> str:
    buf = io.StringIO()
    w = SafeWriter(buf)
    w.writerow(["submission", "exercise", "score", "max_score", "flagged", "feedback"])
    for r in results:
        if not r.exercises:
            w.writerow([r.submission, "", 0, 0, "", r.error or ""])
        for e in r.exercises:
            w.writerow([r.submission, e.id, _num(e.score), _num(e.max_score),
                        "yes" if e.flagged else "", e.feedback])
    return buf.getvalue()
