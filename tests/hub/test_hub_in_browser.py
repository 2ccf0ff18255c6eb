"""The workshop hub end to end, in a real browser: a room over HTTPS, two learners, the live
grid, hand-in, grading with commitments from the hub's record.

The hub serves HTTPS on an address that is not loopback, with a certificate it made for it
(conftest.py: `course hub --ip 10.231.N.1`); headless Chromium runs in a network namespace at
the other end of a veth pair, and the certificate it is served has the fingerprint `course hub`
printed. Two learners and the instructor log in. Each learner gets a server of their own with
their own copy of exercises/, runs chapter 01's exercise notebook (its check cells) there; ana
answers one exercise, commits a prediction and a wrong `why`. The instructor's room page, open
before anyone runs a cell, fills in live: ana passed, bo is stuck on "not written yet". A
forgotten record (what a restart does) and a second commit change nothing: the hub keeps the
first. bo cannot open the room. Both hand in with `course submit` (ana twice). A learner's
kernel cannot read the other learner's home, the instructor's collection or solutions/. Then
ana's hand-in is edited by hand (her `why` answer and its record line, to the right letter) and
bo's gets typed record lines; `course grade` of the collection reports both learners, keyed by
name, with commitments judged on the hub's record: the edits change no score.

    .venv/bin/pytest tests/hub -s      # about a minute; needs root, Chromium, the proxy, ip netns
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from browser.conftest import CHROMIUM_ARGS
from browser.test_explorers_in_lab import CELL_REPORT, KERNEL_READY, RUN_ALL, RUN_FINISHED

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "01_soft_dictionary.ipynb"
ANSWERED = "ch01_scores"            # an answer ana writes (the solution's cell)
ANSWERED_TEST = "ch01_scores_test"  # ... and the check cell it earns the points of
PREDICTION, WHY = "ch01_temperature", "ch01_temperature_why"   # exercise 5: commit, then why
PASSWORDS = {"ana": "ana-secret-1", "bo": "bo-secret-22"}
# The instructor's room page: is this learner's cell of this exercise green / red yet?
ROOM_CELL = """
([learner, exercise, cls]) => {
  const row = document.querySelector(`tr[data-learner="${learner}"]`);
  const td = row && row.querySelector(`td[data-exercise="${exercise}"]`);
  return td !== null && td.className === cls;
}
"""
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


def answer_ids() -> list[str]:
    nb = nbformat.read(REPO / "exercises" / NOTEBOOK, as_version=4)
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution")]


def all_points() -> int:
    nb = nbformat.read(REPO / "solutions" / NOTEBOOK, as_version=4)
    return sum(c.metadata["nbgrader"].get("points", 0) for c in nb.cells
               if c.metadata.get("nbgrader", {}).get("grade"))


def right_and_wrong_why() -> tuple[str, str]:
    from course_lib.checks._predict import choice_texts

    right = choice_texts("ch01.temperature_why", "abc")[1]
    return right, next(letter for letter in "abc" if letter != right)


def served_fingerprint(hub) -> str:
    """The SHA-256 fingerprint of the certificate the hub serves, seen from the browser's side."""
    host, port = hub.url.split("//")[1].rstrip("/").split(":")
    done = hub.net.run(sys.executable, "-c", "import ssl, hashlib; print(hashlib.sha256("
                       f"ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(({host!r}, {port}))))"
                       ".hexdigest())")
    assert done.returncode == 0, done.stderr
    digest = done.stdout.strip().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def log_in(browser, hub, name: str, password: str, then: str = ""):
    # self-signed: the browser warns, the learner compares the fingerprint and goes on
    page = browser.new_context(viewport={"width": 1200, "height": 900},
                               ignore_https_errors=True).new_page()
    page.set_default_timeout(60_000)
    page.goto(hub.url + "hub/login" + (f"?next={then}" if then else ""),
              wait_until="domcontentloaded")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")
    return page


def edit_handin(path: Path, edit) -> None:
    nb = nbformat.read(path, as_version=4)
    edit(nb)
    path.write_text(nbformat.writes(nb))


def test_a_room_over_https_live_grid_hand_in_and_grading_from_the_hubs_record(hub, tmp_path):
    from playwright.sync_api import sync_playwright

    clock = [time.monotonic()]

    def lap(what: str) -> str:
        clock.append(time.monotonic())
        return f"{what}: {clock[-1] - clock[-2]:.1f} s"

    laps = []
    right, wrong = right_and_wrong_why()
    printed = hub.printed(r"SHA-256 ([0-9A-F:]{95})")
    assert printed and served_fingerprint(hub) == printed, (printed, hub.log_tail())
    admin = hub.printed(r"instructor's password \(shown this once[^)]*\): (\S+)")
    assert admin, hub.log_tail()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(hub.net.browser(tmp_path)),
                                             headless=True, args=CHROMIUM_ARGS)
        try:
            pages = {}
            for name, password in PASSWORDS.items():  # both log in: their servers start at once
                pages[name] = log_in(browser, hub, name, password)
            # the instructor goes straight to the room (no server of their own)
            room = log_in(browser, hub, "instructor", admin, then="/services/room/")
            try:
                room.wait_for_function("document.getElementById('updated') && document"
                                       ".getElementById('updated').textContent.startsWith("
                                       "'updated')", timeout=60_000, polling=250)
            except Exception as e:  # playwright's TimeoutError: say where the page is
                pytest.fail(f"the room never showed ({e}): {room.url}\n"
                            f"{room.content()[:2000]}\n{hub.log_tail()}")
            for name, page in pages.items():
                open_notebook(page, hub, name)
            laps.append(lap("three logins over HTTPS, servers started, notebooks open, the room"))

            ana, bo = pages["ana"], pages["bo"]
            first = hand_in(ana)  # the blank, before any answer
            assert "handed in" in first and "hand-in 1 of" in first, first
            for gid in answer_ids():   # ana answers everything, her first `why` wrong
                assert ana.evaluate(SET_SOURCE, [gid, f"why = {wrong!r}" if gid == WHY
                                                 else solution_source(gid)])
            outputs = {name: run_all(page) for name, page in pages.items()}
            laps.append(lap("run all cells in both"))
            ana_said, bo_said = (text_of(outputs[n][ANSWERED_TEST]) for n in ("ana", "bo"))
            assert "\u2714 similarity_scores" in ana_said, outputs["ana"]  # the check's tick
            assert "not written yet" in bo_said, outputs["bo"]
            committed = text_of(outputs["ana"][PREDICTION + "_test"])
            assert "Kept by the hub: this is your first commit" in committed, committed

            # the room, as it was when they ran: filled in without a reload
            for who, exercise, cls in [("ana", ANSWERED_TEST, "pass"),
                                       ("bo", ANSWERED_TEST, "fail"),
                                       ("ana", WHY + "_test", "fail")]:
                room.wait_for_function(ROOM_CELL, arg=[who, exercise, cls], timeout=30_000,
                                       polling=250)
            common = room.inner_text("#common")
            assert "not written yet" in common, common
            stuck = f'tr[data-learner="bo"] td[data-exercise="{ANSWERED_TEST}"]'
            assert "stuck" in room.inner_text(stuck), room.inner_text(stuck)
            # what a restart or a second kernel does: the kernel forgets; the hub does not
            again = ana.evaluate(KERNEL_RUN, "from course_lib.checks import _predict\n"
                                 f"_predict.forget()\ncheck.temperature_why({right!r})")
            assert f"you chose {wrong!r}" in again and "earlier run" in again, again
            peek = bo.context.new_page()   # bo, logged in, tries the room: refused
            denied = peek.goto(hub.url + "services/room/state", wait_until="domcontentloaded")
            assert denied.status == 403 and "learners" not in peek.content(), denied.status
            peek.close()
            laps.append(lap("the live grid, a forgotten commit, the room refused to a learner"))
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

    # edited by hand after the fact: ana's why (answer and record line) to the right letter,
    # bo's blank given typed record lines; the hub's record says otherwise
    def right_why(nb):
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid == WHY:
                cell.source = f"why = {right!r}"
            for out in cell.get("outputs", []):
                if "text" in out and "first run of temperature_why" in out["text"]:
                    out["text"] = out["text"].replace(repr(wrong), repr(right))
                    edited.append(gid)

    def typed(nb):
        from course_lib.checks._predict import record_line

        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in (PREDICTION + "_test", WHY + "_test"):
                value = {"cold": 20.0, "hot": 25.0} if gid.startswith(PREDICTION + "_") else right
                name = "temperature_prediction" if gid.startswith(PREDICTION + "_") else \
                    "temperature_why"
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                       text=record_line(name, 1, value) + "\n")]
                cell.execution_count = 1

    edited = []
    latest = {h.parts[-2]: h for h in sorted(hub.collection.glob("*/*.ipynb"))}
    edit_handin(latest["ana"], right_why)
    edit_handin(latest["bo"], typed)
    assert edited == [WHY + "_test"], edited

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
    feedback = {e["id"]: e["feedback"] for e in ana_nb["exercises"]}
    assert scores[ANSWERED_TEST] == points_of(ANSWERED_TEST), ana_nb
    assert scores[PREDICTION + "_test"] == points_of(PREDICTION + "_test"), ana_nb
    assert scores[WHY + "_test"] == 0 and f"you chose {wrong!r}" in feedback[WHY + "_test"]
    assert report["ana"]["score"] == all_points() - points_of(WHY + "_test"), ana_nb
    assert report["bo"]["score"] == 0 and report["bo"]["max_score"] == ana_nb["max_score"]
    bo_feedback = " ".join(e["feedback"] for e in bo_nb["exercises"])
    assert "hub holds no commit" in bo_feedback, bo_nb
    print("\nhub test: " + "; ".join(laps))
