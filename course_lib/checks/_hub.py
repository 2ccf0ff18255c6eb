"""On the course's JupyterHub only: report each check's result, and keep first commits there.

Inert anywhere else. A server the hub started has $JUPYTERHUB_API_TOKEN and
$JUPYTERHUB_SERVICE_PREFIX (JupyterHub sets them) and $COURSE_HANDIN_URL (the course's hub
does); without all three nothing here sends anything and the checks behave as on a laptop.

On the hub, with the server's own token (so the service files it under this learner's name):

* after each cell that is an exercise's check cell (known by its cell id in the course's own
  copy of the notebook, `exercises/<name>`), its result: the cell's grade_id, passed or not,
  and the named mistake (the first line of the checker's message). Never code, never values
  the learner typed; sent from a background thread, so a slow hub never slows a cell;
* after each cell that reveals a prediction's answer (a Check's `reveals`), that it ran;
* a prediction's first commit (`commit`), synchronously, so the kernel shows the value the hub
  kept: the first one ever sent, whatever a restart, a second kernel or an edit did since.

Every request has a short timeout, and an unreachable hub only means nothing is recorded
there: no check ever fails because of it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import urllib.request
from pathlib import Path

URL_VAR, TOKEN_VAR, PREFIX_VAR = "COURSE_HANDIN_URL", "JUPYTERHUB_API_TOKEN", \
    "JUPYTERHUB_SERVICE_PREFIX"
COMMIT_TIMEOUT_S = 3.0     # a commit waits for the hub's answer at most this long
REPORT_TIMEOUT_S = 2.0     # a background report
COURSE = Path(__file__).resolve().parents[2]
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the hub's machine
_queue: queue.Queue = queue.Queue(maxsize=200)
_state: dict = {"installed": False, "cells": None, "thread": None}


def on_hub() -> bool:
    return all(os.environ.get(v) for v in (URL_VAR, TOKEN_VAR, PREFIX_VAR))


def _post(what: str, body: dict, timeout: float) -> dict | None:
    """POST one report; -> the service's answer, or None (off the hub, refused, unreachable)."""
    try:
        req = urllib.request.Request(
            os.environ[URL_VAR].rstrip("/") + "/" + what, data=json.dumps(body).encode(),
            method="POST", headers={"Authorization": f"token {os.environ[TOKEN_VAR]}",
                                    "Content-Type": "application/json"})
        with _LOCAL.open(req, timeout=timeout) as response:
            return json.loads(response.read(65536))
    except Exception:  # noqa: BLE001 - the hub's trouble is never the learner's check's
        return None


def commit(check_id: str, value) -> dict | None:
    """Keep `value` as this learner's first commit of `check_id` on the hub; -> {"value": the
    kept value, "first": whether this one made it, "t": the hub's time}, or None off the hub
    or when it did not answer (the kernel's own record then stands)."""
    if not on_hub():
        return None
    from course_lib.checks._predict import MAX_RECORD_CHARS, plain_literal

    text = repr(value)
    if len(text) > MAX_RECORD_CHARS:
        return None
    answer = _post("commits", {"check": check_id, "value": text}, COMMIT_TIMEOUT_S)
    if not isinstance(answer, dict) or "value" not in answer:
        return None
    try:
        kept = plain_literal(answer["value"])
    except ValueError:
        return None
    return {"value": kept, "first": bool(answer.get("first")), "t": answer.get("t")}


# ---------------------------------------------------------------- after each cell


def _sender() -> None:
    while True:
        what, body = _queue.get()
        _post(what, body, REPORT_TIMEOUT_S)


def _send(what: str, body: dict) -> None:
    if _state["thread"] is None:
        _state["thread"] = threading.Thread(target=_sender, name="course-hub-reports",
                                            daemon=True)
        _state["thread"].start()
    try:
        _queue.put_nowait((what, body))
    except queue.Full:  # the hub has not answered for a while: drop, never block a cell
        pass


def _notebook_cells() -> tuple[str, dict[str, tuple[str, bool]]]:
    """(notebook name, {cell id: (grade_id, is a check cell)}) from the course's own copy of
    the notebook this kernel runs (jupyter_server's $JPY_SESSION_NAME names it)."""
    if _state["cells"] is None:
        name = Path(os.environ.get("JPY_SESSION_NAME", "")).name
        cells: dict[str, tuple[str, bool]] = {}
        try:
            nb = json.loads((COURSE / "exercises" / name).read_text(encoding="utf-8"))
            for cell in nb.get("cells", []):
                meta = cell.get("metadata", {}).get("nbgrader", {})
                if cell.get("id") and meta.get("grade_id"):
                    cells[cell["id"]] = (meta["grade_id"], bool(meta.get("grade")))
        except (OSError, ValueError, AttributeError):
            pass
        _state["cells"] = (name, cells)
    return _state["cells"]


def _mistake(error: BaseException | None) -> str:
    from course_lib.checks._core import CheckFailure, text_of

    if error is None:
        return ""
    if isinstance(error, CheckFailure):
        line = text_of(error, 2000).split("\nHint:", 1)[0].strip().split("\n", 1)[0]
        return re.sub(r"(raised \w+):.*", r"\1", line)[:300]  # the learner's error stays here
    return type(error).__name__   # the learner's own error: its kind only


def after_cell(result) -> None:
    """IPython's post_run_cell: report a check cell's result, or that a revealing cell ran."""
    try:
        cell_id = getattr(getattr(result, "info", None), "cell_id", None)
        name, cells = _notebook_cells()
        if not cell_id or cell_id not in cells:
            return
        grade_id, is_check = cells[cell_id]
        error = result.error_before_exec or result.error_in_exec
        if is_check:
            _send("checks", {"notebook": name, "exercise": grade_id, "passed": error is None,
                             "mistake": _mistake(error)})
        elif error is None and grade_id in _revealing():
            _send("reveals", {"cell": grade_id})
    except Exception:  # noqa: BLE001 - never in the learner's way
        pass


def _revealing() -> set[str]:
    from course_lib.checks._predict import COMMITTING

    return {g for info in COMMITTING.values() for g in info.get("reveals", ())}


def install() -> None:
    """Watch the cells this kernel runs, on the hub only (called when the checks load)."""
    if _state["installed"] or not on_hub():
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "events"):
        return
    shell.events.register("post_run_cell", after_cell)
    _state["installed"] = True
