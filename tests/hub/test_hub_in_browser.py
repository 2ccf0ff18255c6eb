"""The workshop hub end to end, in a real browser: `course hub`, two learners, hand-in, grading.

Two learners log in to a real JupyterHub (conftest.py: `course hub` on a free 127.0.0.1 port) in
headless Chromium, each gets a server of their own with their own copy of exercises/, runs
chapter 01's exercise notebook (its check cells) there and hands it in with `course submit`; ana
answers one exercise and hands in twice. A learner's kernel cannot read the other learner's
home, the instructor's collection or solutions/. The instructor's `course grade` of the
collection then reports both learners, keyed by name, with the right scores.

    .venv/bin/pytest tests/hub -s      # about a minute; needs root, Chromium and the proxy
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from browser.conftest import CHROMIUM, CHROMIUM_ARGS
from browser.test_explorers_in_lab import CELL_REPORT, KERNEL_READY, RUN_ALL, RUN_FINISHED

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "01_soft_dictionary.ipynb"
ANSWERED = "ch01_scores"            # the answer ana writes (the solution's cell)
ANSWERED_TEST = "ch01_scores_test"  # ... and the check cell it earns the points of
PASSWORDS = {"ana": "ana-secret-1", "bo": "bo-secret-22"}
TIMEOUT_MS = 180_000

# Run code in the notebook's kernel without adding a cell (what `!course submit` in a scratch
# cell does); -> everything it printed.
KERNEL_RUN = """
async (code) => {
  const kernel = window.__coursePanel.sessionContext.session.kernel;
  const future = kernel.requestExecute({code: code, store_history: false});
  let text = '';
  future.onIOPub = (msg) => {
    const type = msg.header.msg_type;
    if (type === 'stream') text += msg.content.text;
    if (type === 'error') text += msg.content.ename + ': ' + msg.content.evalue;
  };
  await future.done;
  return text;
}
"""
SET_SOURCE = """
([gradeId, source]) => {
  for (const cell of window.__coursePanel.content.widgets) {
    const meta = cell.model.getMetadata('nbgrader');
    if (meta && meta.grade_id === gradeId) {
      cell.model.sharedModel.setSource(source);
      return true;
    }
  }
  return false;
}
"""
SAVE = "async () => { await window.__coursePanel.context.save(); }"

PROBE = """
import json, os
def probe(path):
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(1)
        return 'readable'
    except PermissionError:
        return 'denied'
    except FileNotFoundError:
        return 'missing'
print(json.dumps({{'uid': os.getuid(), 'own': probe(os.path.expanduser('~/exercises')),
                  'other_home': probe({other!r}), 'other_notebook': probe({other_nb!r}),
                  'collection': probe({collection!r}), 'solutions': probe({solutions!r})}}))
"""


def solution_source(grade_id: str) -> str:
    nb = nbformat.read(REPO / "solutions" / NOTEBOOK, as_version=4)
    return next(c.source for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def points_of(grade_id: str) -> int:
    nb = nbformat.read(REPO / "solutions" / NOTEBOOK, as_version=4)
    return next(c.metadata["nbgrader"]["points"] for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def wait_for_server(page, hub, name: str) -> None:
    """Wait for the hub to send `name` on to their own server, asking again every 30 s.

    The spawn-pending page follows the spawn through an event stream and redirects when the
    server is up. Once, on a loaded machine, that redirect never came within 180 s. Asking for
    the server again lands on it once it runs, or on the pending page while it starts.
    """
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while True:
        try:
            page.wait_for_url(f"**/user/{name}/**", timeout=30_000)
            return
        except Exception as e:  # playwright's TimeoutError
            if time.monotonic() > deadline:
                pytest.fail(f"{name}'s server never came up (the page is at {page.url}): "
                            f"{e}\n{hub.log_tail()}")
        page.goto(f"{hub.url}user/{name}/lab", wait_until="domcontentloaded")


def open_notebook(page, hub, name: str) -> None:
    wait_for_server(page, hub, name)
    page.goto(f"{hub.url}user/{name}/lab/tree/exercises/{NOTEBOOK}",
              wait_until="domcontentloaded")
    try:
        page.wait_for_function(KERNEL_READY, arg=f"exercises/{NOTEBOOK}", timeout=TIMEOUT_MS,
                               polling=250)
    except Exception as e:  # playwright's TimeoutError: say what the hub was doing
        pytest.fail(f"{name}'s notebook never got an idle kernel: {e}\n{hub.log_tail()}")


def run_all(page) -> dict[str, list[dict]]:
    """Run every cell; -> outputs by grade_id."""
    page.evaluate(RUN_ALL)
    page.wait_for_function(RUN_FINISHED, timeout=TIMEOUT_MS, polling=250)
    nb_ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nbformat.read(
        REPO / "exercises" / NOTEBOOK, as_version=4).cells]
    return {nb_ids[c["index"]]: c["outputs"] for c in page.evaluate(CELL_REPORT)}


def text_of(outputs: list[dict]) -> str:
    return "\n".join(o["text"] for o in outputs)


def hand_in(page) -> str:
    page.evaluate(SAVE)
    return page.evaluate(KERNEL_RUN, f"!course submit {NOTEBOOK}")


def test_two_learners_hand_in_and_are_graded(hub):
    from playwright.sync_api import sync_playwright

    clock = [time.monotonic()]

    def lap(what: str) -> str:
        clock.append(time.monotonic())
        return f"{what}: {clock[-1] - clock[-2]:.1f} s"

    laps = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            pages = {}
            for name, password in PASSWORDS.items():  # both log in: their servers start at once
                page = browser.new_context(viewport={"width": 1200, "height": 900}).new_page()
                page.set_default_timeout(60_000)
                page.goto(hub.url + "hub/login", wait_until="domcontentloaded")
                page.fill("#username_input", name)
                page.fill("#password_input", password)
                page.click("#login_submit")
                pages[name] = page
            for name, page in pages.items():
                open_notebook(page, hub, name)
            laps.append(lap("two logins, servers started, notebooks open with kernels"))

            ana, bo = pages["ana"], pages["bo"]
            first = hand_in(ana)  # the blank, before any answer
            assert "handed in" in first and "hand-in 1 of" in first, first
            assert ana.evaluate(SET_SOURCE, [ANSWERED, solution_source(ANSWERED)])
            outputs = {name: run_all(page) for name, page in pages.items()}
            laps.append(lap("run all cells in both"))
            ana_said, bo_said = (text_of(outputs[n][ANSWERED_TEST]) for n in ("ana", "bo"))
            assert "\u2714 similarity_scores" in ana_said, outputs["ana"]  # the check's tick
            assert "not written yet" in bo_said, outputs["bo"]
            second = hand_in(ana)
            assert "hand-in 2 of" in second and "kept" in second, second
            assert "hand-in 1 of" in hand_in(bo)

            probe = PROBE.format(
                other=str(hub.home_root / "bo"),
                other_nb=str(hub.home_root / "bo" / "exercises" / NOTEBOOK),
                collection=str(hub.collection), solutions=str(REPO / "solutions"))
            seen = json.loads(ana.evaluate(KERNEL_RUN, probe).strip().splitlines()[-1])
            laps.append(lap("hand-ins and the isolation probe"))
        finally:
            browser.close()

    assert seen["uid"] != 0 and seen["own"] == "readable", seen
    assert seen["other_home"] == seen["other_notebook"] == "denied", seen
    assert seen["collection"] == "denied", seen
    assert seen["solutions"] == "denied", seen
    handins = sorted(p.relative_to(hub.collection).parts[0]
                     for p in hub.collection.glob("*/*.ipynb"))
    assert handins == ["ana", "ana", "bo"], handins

    done = subprocess.run([str(Path(sys.executable).parent / "course"), "grade",
                           str(hub.collection), "--json", "--jobs", "2"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    laps.append(lap("course grade of the collection"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert sorted(report) == ["ana", "bo"], report
    (ana_nb,), (bo_nb,) = report["ana"]["notebooks"], report["bo"]["notebooks"]
    assert ana_nb["handins"] == 2 and bo_nb["handins"] == 1
    assert ana_nb["error"] is None and bo_nb["error"] is None, (ana_nb, bo_nb)
    scores = {e["id"]: e["score"] for e in ana_nb["exercises"]}
    assert scores[ANSWERED_TEST] == points_of(ANSWERED_TEST), ana_nb
    assert report["ana"]["score"] == points_of(ANSWERED_TEST), ana_nb
    assert report["bo"]["score"] == 0 and report["bo"]["max_score"] == ana_nb["max_score"]
    print("\nhub test: " + "; ".join(laps))
