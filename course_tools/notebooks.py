"""Re-execute notebooks in place, reproducibly, so authors refresh outputs without diff noise.

nbclient runs each notebook top to bottom in a fresh kernel of this environment, with timing
records off; afterwards we drop what changes on every run although nothing changed (execution
timestamps, widget model ids). Seeded notebooks then re-execute byte-for-byte the same.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _merge_streams(outputs: list) -> list:
    """Join consecutive stdout (or stderr) chunks: how prints are split depends on timing."""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (
            out.get("output_type") == "stream"
            and prev is not None
            and prev.get("output_type") == "stream"
            and prev.get("name") == out.get("name")
        ):
            prev["text"] = prev["text"] + out["text"]
        else:
            merged.append(out)
    return merged


def normalise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove volatile metadata and layout: timings, widget state/model ids, stream chunking."""
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.outputs = _merge_streams(cell.get("outputs", []))
        for out in cell.outputs:
            if "data" in out:
                out["data"].pop(WIDGET_VIEW, None)
    return nb


def execute_in_place(path: Path, timeout: int = 300) -> float:
    """Execute `path` in a fresh kernel, write it back normalised; return seconds taken."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    text = nbformat.writes(normalise(nb)) + "\n"
    path.write_text(text, encoding="utf-8", newline="\n")
    return seconds
