"""The workshop hub's parts without a hub: the collection, the hand-in service and `course
submit`, grading a collection by learner, the configuration, the spawner's view of the machine.

The real hub, in a real browser, is tests/hub/test_hub_in_browser.py.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from course_tools.cli import build_parser
from course_tools.hub import COLLECTION_MARKER, CONFIG_FILE, collection, submit
from course_tools.hub.collection import Collection, is_collection

REPO = Path(__file__).resolve().parent.parent
try:
    import jupyterhub  # noqa: F401  (Linux only: pyproject.toml's marker)
    WHY_NO_HUB = None if sys.platform.startswith("linux") else "the hub runs on Linux only"
except ImportError:
    WHY_NO_HUB = "JupyterHub is not installed (the course installs it on Linux only)"
needs_hub = pytest.mark.skipif(WHY_NO_HUB is not None, reason=str(WHY_NO_HUB))
NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
DATA = json.dumps(NOTEBOOK).encode()


# ---------------------------------------------------------------- the collection


def test_a_second_handin_is_kept_next_to_the_first(tmp_path):
    c = Collection(tmp_path / "collection", create=True)
    first = c.add("ana", "04_masking.ipynb", b"first", now=1_700_000_000.0)
    second = c.add("ana", "04_masking.ipynb", b"second", now=1_700_000_000.0)  # same moment
    c.add("bo", "04_masking.ipynb", b"bo's")
    assert first.path != second.path and first.path.read_bytes() == b"first"
    assert second.path.read_bytes() == b"second"
    assert first.handed_in == "2023-11-14T22:13:20Z"
    assert [(h.learner, h.path.read_bytes(), n) for h, n in c.latest()] == [
        ("ana", b"second", 2), ("bo", b"bo's", 1)]
    assert is_collection(c.root) and (c.root / COLLECTION_MARKER).is_file()
    if os.name == "nt":
        return  # no Unix modes
    assert stat.S_IMODE(c.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert stat.S_IMODE((c.root / "ana").stat().st_mode) == 0o700


@pytest.mark.parametrize("learner, notebook", [
    ("../bo", "x.ipynb"), ("Ana", "x.ipynb"), ("ana", "../x.ipynb"), ("ana", "x.py"),
    ("ana", ".hidden.ipynb"), ("ana", "a/b.ipynb")])
def test_names_that_could_escape_the_collection_are_refused(tmp_path, learner, notebook):
    c = Collection(tmp_path / "c", create=True)
    with pytest.raises(ValueError):
        c.add(learner, notebook, DATA)
    assert c.handins() == []


# ---------------------------------------------------------------- the service and the client


class FakeHubAuth:
    """What the hub answers about a token: ana's, bo's, a service's, or the instructor's (whose
    admin role holds `access:services`, as JupyterHub's does)."""

    access_scopes = None
    login_url = "/hub/login"
    base_url = "/services/room/"
    users = {"tok-ana": {"name": "ana", "kind": "user",
                         "scopes": ["access:services!service=handin"]},
             "tok-bo": {"name": "bo", "kind": "user",
                        "scopes": ["access:services!service=handin"]},
             "tok-svc": {"name": "culler", "kind": "service", "scopes": []},
             "tok-admin": {"name": "instructor", "kind": "user", "admin": True,
                           "scopes": ["access:services"]}}

    def __init__(self, access_scopes=None):
        self.access_scopes = access_scopes

    def _persist_url_token_if_set(self, handler):
        pass

    def get_user(self, handler):
        token = handler.request.headers.get("Authorization", "").removeprefix("token ")
        return dict(self.users[token]) if token in self.users else None

    def check_scopes(self, required, model):
        from jupyterhub.services.auth import check_scopes

        return check_scopes(required, set(model["scopes"]))


def _serve(app) -> tuple[dict, threading.Thread]:
    """A tornado app on a free loopback port, in a thread of its own."""
    from tornado.httpserver import HTTPServer

    started, box = threading.Event(), {}

    def serve():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = HTTPServer(app, max_body_size=1 << 20)
        server.listen(0, "127.0.0.1")
        box.update(loop=loop, server=server,
                   port=next(iter(server._sockets.values())).getsockname()[1])
        started.set()
        loop.run_forever()
        server.stop()
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    return box, thread


@pytest.fixture
def service(tmp_path, monkeypatch):
    """The hand-in service on a free loopback port, in a thread; stopped after the test."""
    from course_tools.hub.handin import make_app

    store = Collection(tmp_path / "collection", create=True)
    box, thread = _serve(make_app(store, "/services/handin/", FakeHubAuth()))
    monkeypatch.setenv(submit.URL_VAR, f"http://127.0.0.1:{box['port']}/services/handin/")
    try:
        yield store
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(10)


def _notebook(tmp_path: Path, name: str = "04_masking.ipynb", data: bytes = DATA) -> Path:
    path = tmp_path / "work" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return path


@needs_hub
def test_submit_files_the_notebook_under_the_token_owner(service, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(submit.TOKEN_VAR, "tok-ana")
    nb = _notebook(tmp_path)
    assert submit.submit(nb)["count"] == 1
    args = SimpleNamespace(notebook=[nb], list=False)
    assert submit.main(args) == 0
    assert "hand-in 2 of 04_masking.ipynb" in capsys.readouterr().out
    monkeypatch.setenv(submit.TOKEN_VAR, "tok-bo")
    assert submit.submit(nb)["learner"] == "bo"
    assert [(h.learner, h.notebook) for h in service.handins()] == [
        ("ana", "04_masking.ipynb")] * 2 + [("bo", "04_masking.ipynb")]
    assert all(h.path.read_bytes() == DATA for h in service.handins())
    assert submit.main(SimpleNamespace(notebook=[], list=True)) == 0  # bo sees only bo's
    assert "1 hand-in(s) by bo" in capsys.readouterr().out


@needs_hub
@pytest.mark.parametrize("token, name, data, status", [
    ("tok-ana", "04_masking.ipynb", b"not json", "not a Jupyter notebook"),
    ("tok-ana", "04_masking.ipynb", b'{"cells": 3}', "not a Jupyter notebook"),
    ("tok-svc", "04_masking.ipynb", DATA, "(403)"),
    ("nobody", "04_masking.ipynb", DATA, "(403)"),
])
def test_the_service_refuses_what_is_not_a_learners_notebook(service, monkeypatch, token, name,
                                                             data, status):
    monkeypatch.setenv(submit.TOKEN_VAR, token)
    with pytest.raises(submit.SubmitError, match=status.replace("(", r"\(").replace(")", r"\)")):
        submit._request("POST", f"?name={name}", data)
    assert service.handins() == []


@needs_hub
def test_a_bad_name_is_refused_by_the_service(service, monkeypatch):
    monkeypatch.setenv(submit.TOKEN_VAR, "tok-ana")
    with pytest.raises(submit.SubmitError, match="not a notebook file name"):
        submit._request("POST", "?name=..%2Fbo%2Fx.ipynb", DATA)


def test_submit_off_the_hub_says_where_it_works(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(submit.URL_VAR, raising=False)
    code = submit.main(SimpleNamespace(notebook=[_notebook(tmp_path)], list=False))
    assert code == 1 and "not a server the hub started" in capsys.readouterr().err
    code = submit.main(SimpleNamespace(notebook=[tmp_path / "missing.ipynb"], list=False))
    assert code == 1 and "no such file" in capsys.readouterr().err


# ---------------------------------------------------------------- while they work: the records


def _on_hub(monkeypatch, token: str) -> None:
    """This process looks like a learner's server on the hub (the service fixture's URL)."""
    from course_lib.checks import _hub

    monkeypatch.setenv(_hub.TOKEN_VAR, token)
    monkeypatch.setenv(_hub.PREFIX_VAR, "/user/x/")
    monkeypatch.setenv(_hub.URL_VAR, os.environ[submit.URL_VAR])


@needs_hub
def test_first_commit_wins_on_the_hub_and_nobody_reports_for_another(service, monkeypatch):
    """A second kernel's commit gets the first one back; a learner's reports land under their
    own name whatever the body says; each sees only their own record; a service is refused."""
    from course_lib.checks import _hub
    from course_tools.hub.records import Records

    _on_hub(monkeypatch, "tok-ana")
    first = _hub.commit("ch01.temperature_prediction", {"cold": 10.0, "hot": 25.0})
    again = _hub.commit("ch01.temperature_prediction", {"cold": 40.0, "hot": 25.0})
    assert first["first"] and first["value"] == {"cold": 10.0, "hot": 25.0}
    assert not again["first"] and again["value"] == first["value"] and again["t"] == first["t"]
    assert _hub._post("checks", {"exercise": "ch01_scores_test", "passed": False,
                                 "mistake": "`f` raised ValueError: my secret 42",
                                 "learner": "bo"}, 5)["learner"] == "ana"
    _on_hub(monkeypatch, "tok-bo")
    assert _hub.commit("ch01.temperature_prediction", {"cold": 40.0, "hot": 25.0})["first"]
    mine = json.loads(_get("records", "tok-bo"))
    assert mine["learner"] == "bo" and mine["checks"] == []
    assert mine["commits"]["ch01.temperature_prediction"]["value"] == repr(
        {"cold": 40.0, "hot": 25.0})
    records = Records(service.root)
    ana = records.state("ana")
    assert [c["mistake"] for c in ana["checks"]] == ["`f` raised ValueError"]  # no learner text
    assert records.for_grading("ana")["commits"]["ch01.temperature_prediction"]["value"] == \
        repr({"cold": 10.0, "hot": 25.0})
    _on_hub(monkeypatch, "tok-svc")
    assert _hub.commit("ch01.temperature_prediction", 1.0) is None  # 403: kernel goes on
    assert _hub._post("commits", {"check": "not an id", "value": "1"}, 5) is None  # 400


def _get(what: str, token: str) -> str:
    import urllib.request

    req = urllib.request.Request(os.environ[submit.URL_VAR] + what,
                                 headers={"Authorization": f"token {token}"})
    with submit._LOCAL.open(req, timeout=10) as r:
        return r.read().decode()


def test_off_the_hub_the_checks_send_nothing(monkeypatch):
    from course_lib.checks import _hub, _predict

    for var in (_hub.URL_VAR, _hub.TOKEN_VAR, _hub.PREFIX_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_hub, "_post", lambda *a: pytest.fail("sent something off the hub"))
    assert not _hub.on_hub() and _hub.commit("ch01.x", 1) is None
    _predict.forget("ch01.offline_probe")
    rec = _predict.commit("ch01.offline_probe", 3.0, float)
    assert rec["value"] == 3.0 and rec["first"] and "hub" not in rec
    _predict.forget("ch01.offline_probe")


def test_after_a_cell_only_check_cells_and_reveals_are_reported(monkeypatch):
    """By cell id in the course's own copy of the notebook: the check cell's result with the
    named mistake (not the learner's error text, never code); a reveal; nothing else."""
    import course_lib.checks.ch09  # noqa: F401  (declares ch09_predict_run as a reveal)
    from course_lib.checks import CheckFailure, _hub

    sent = []
    monkeypatch.setattr(_hub, "_send", lambda what, body: sent.append((what, body)))
    ids = {}
    for name in ("01_soft_dictionary.ipynb", "09_paying_less.ipynb"):
        for cell in nbformat.read(REPO / "exercises" / name, as_version=4).cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            ids[gid] = cell.id

    def run(notebook, grade_id, error=None):
        monkeypatch.setenv("JPY_SESSION_NAME", f"/home/ana/exercises/{notebook}")
        _hub._state["cells"] = None
        info = SimpleNamespace(cell_id=ids.get(grade_id, grade_id))
        _hub.after_cell(SimpleNamespace(info=info, error_before_exec=None, error_in_exec=error))

    run("01_soft_dictionary.ipynb", "ch01_scores_test",
        CheckFailure("`similarity_scores` raised TypeError: x + secret_name\nHint: ..."))
    run("01_soft_dictionary.ipynb", "ch01_scores_test")
    run("01_soft_dictionary.ipynb", "ch01_scores")            # an answer cell: nothing
    run("01_soft_dictionary.ipynb", "ch01_softmax_test", NameError("np_secret"))
    run("09_paying_less.ipynb", "ch09_predict_run")           # shows the crossover
    run("09_paying_less.ipynb", "made-up-cell")
    _hub._state["cells"] = None
    assert sent == [
        ("checks", {"notebook": "01_soft_dictionary.ipynb", "exercise": "ch01_scores_test",
                    "passed": False, "mistake": "`similarity_scores` raised TypeError"}),
        ("checks", {"notebook": "01_soft_dictionary.ipynb", "exercise": "ch01_scores_test",
                    "passed": True, "mistake": ""}),
        ("checks", {"notebook": "01_soft_dictionary.ipynb", "exercise": "ch01_softmax_test",
                    "passed": False, "mistake": "NameError"}),
        ("reveals", {"cell": "ch09_predict_run"})]


@needs_hub
def test_the_room_is_the_admins_and_shows_who_is_stuck(tmp_path):
    """The grid: latest result per learner and exercise, how long it has failed, the most
    common named mistake; a learner's token gets 403 (scope access:services!service=room)."""
    import urllib.error
    import urllib.request

    from course_tools.hub.records import Records, grid
    from course_tools.hub.room import make_app

    records = Records(tmp_path / "collection", create=True)
    t0 = 1_800_000_000.0
    records.check("ana", "ch01_scores_test", False, "your scores are 0.5 too high", now=t0)
    records.check("ana", "ch01_scores_test", False, "your scores are 0.7 too high", now=t0 + 60)
    records.check("bo", "ch01_scores_test", False, "your scores are 2 too high", now=t0 + 90)
    records.check("bo", "ch01_scores_test", True, now=t0 + 120)
    records.check("bo", "ch01_softmax_test", False, "`f` is not written yet", now=t0 + 130)
    g = grid(records, now=t0 + 600, order=["ch01_scores_test", "ch01_softmax_test"])
    assert [e["id"] for e in g["exercises"]] == ["ch01_scores_test", "ch01_softmax_test"]
    ana = g["learners"]["ana"]["ch01_scores_test"]
    assert (ana["passed"], ana["tries"], ana["stuck_s"]) == (False, 2, 600)
    assert g["learners"]["bo"]["ch01_scores_test"]["passed"] is True
    assert g["exercises"][0]["common_mistake"] == {"mistake": "your scores are # too high",
                                                   "learners": 2}
    box, thread = _serve(make_app(tmp_path / "collection", "/services/room/",
                                  FakeHubAuth({"access:services!service=room"}), order=[]))
    url = f"http://127.0.0.1:{box['port']}/services/room/"

    def fetch(path, token):
        req = urllib.request.Request(url + path, headers={"Authorization": f"token {token}"})
        try:
            with submit._LOCAL.open(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""

    try:
        status, body = fetch("state", "tok-admin")
        assert status == 200 and set(json.loads(body)["learners"]) == {"ana", "bo"}
        assert fetch("", "tok-admin")[0] == 200
        assert fetch("state", "tok-ana")[0] == 403 and fetch("", "tok-bo")[0] == 403
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(10)


def test_predictions_of_a_hub_handin_are_judged_on_the_hubs_record():
    """The hub's clock: a reveal before the commit fails it, after it does not; no commit on
    record is no commit, whatever the notebook says."""
    from course_lib.checks import commit_info, get
    from course_tools.grader.predictions import judge_service

    check = get("ch09.predicted_crossover")
    info = commit_info(check.id)
    assert info["reveals"] == ("ch09_predict_run",)
    commit = {"commits": {check.id: {"value": "6144", "t": 1000.0}}}
    assert judge_service(check, {**commit, "reveals": {"ch09_predict_run": 1001.0}}, info,
                         []).passed
    early = judge_service(check, {**commit, "reveals": {"ch09_predict_run": 999.0}}, info, [])
    assert not early.passed and "before your commit" in early.message
    none = judge_service(check, {"commits": {}, "reveals": {}}, info, [])
    assert not none.passed and "hub holds no commit" in none.message


# ---------------------------------------------------------------- grading by learner


def _solution_of_first_exercise() -> tuple[nbformat.NotebookNode, int]:
    """Chapter 01's blank exercise with its first answer filled in, and that answer's points."""
    ex = nbformat.read(REPO / "exercises" / "01_soft_dictionary.ipynb", as_version=4)
    sol = nbformat.read(REPO / "solutions" / "01_soft_dictionary.ipynb", as_version=4)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in sol.cells}
    answer = next(c for c in ex.cells if c.metadata.get("nbgrader", {}).get("solution"))
    answer.source = by_id[answer.metadata.nbgrader.grade_id].source
    test = ex.cells[ex.cells.index(answer) + 1]
    return ex, test.metadata.nbgrader.points


def _hand_typed_records(nb, values: dict[str, object]) -> None:
    """Type record lines into the check cells' outputs, as a learner could in the .ipynb."""
    from course_lib.checks._predict import record_line

    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        for name, value in values.items():
            if gid == f"ch01_{name}_test":
                cell.outputs = [nbformat.v4.new_output(
                    "stream", name="stdout", text=record_line(f"temperature_{name}"
                                                              if name == "why" else
                                                              "temperature_prediction", 1, value))]
                cell.execution_count = 1


def test_course_grade_of_a_collection_is_keyed_by_learner(tmp_path):
    """The real command on a collection: ana's latest hand-in is graded, bo's blank scores 0;
    commitments are judged on the hub's record, so record lines typed into a hand-in change
    nothing: ana's wrong first `why` stays wrong, bo's typed commits are no commits."""
    from course_lib.checks._predict import choice_texts
    from course_tools.hub.records import Records

    store = Collection(tmp_path / "collection", create=True)
    answered, points = _solution_of_first_exercise()
    right = choice_texts("ch01.temperature_why", "abc")[1]
    wrong = next(letter for letter in "abc" if letter != right)
    prediction = {"cold": 20.0, "hot": 25.0}
    _hand_typed_records(answered, {"temperature": prediction, "why": right})
    blank = nbformat.read(REPO / "exercises" / "01_soft_dictionary.ipynb", as_version=4)
    typed = nbformat.read(REPO / "exercises" / "01_soft_dictionary.ipynb", as_version=4)
    _hand_typed_records(typed, {"temperature": prediction, "why": right})
    store.add("ana", "01_soft_dictionary.ipynb", nbformat.writes(blank).encode())
    store.add("ana", "01_soft_dictionary.ipynb", nbformat.writes(answered).encode())
    store.add("bo", "01_soft_dictionary.ipynb", nbformat.writes(typed).encode())
    records = Records(store.root, create=True)   # what the hub kept while ana worked
    records.commit("ana", "ch01.temperature_prediction", repr(prediction))
    records.commit("ana", "ch01.temperature_why", repr(wrong))
    done = subprocess.run([str(Path(sys.executable).parent / "course"), "grade",
                           str(store.root), "--csv", "--jobs", "2"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert list(rows[0]) == ["learner", "notebook", "handed_in", "handins", "exercise", "score",
                             "max_score", "flagged", "feedback"]
    score = {(r["learner"], r["exercise"]): float(r["score"]) for r in rows}
    assert score[("ana", "ch01_temperature_test")] == 1, rows    # committed on the hub
    assert score[("ana", "ch01_temperature_why_test")] == 0, rows  # the hub kept the wrong one
    assert score[("bo", "ch01_temperature_test")] == score[("bo", "ch01_temperature_why_test")] \
        == 0, rows
    why = next(r for r in rows if r["learner"] == "ana" and r["exercise"].endswith("why_test"))
    assert f"you chose {wrong!r}" in why["feedback"], why
    total = {name: sum(float(r["score"]) for r in rows if r["learner"] == name)
             for name in ("ana", "bo")}
    assert total == {"ana": points + 1, "bo": 0}, rows
    assert {r["handins"] for r in rows if r["learner"] == "ana"} == {"2"}


def test_reports_by_learner_from_results():
    from course_tools.grader import ExerciseResult, SubmissionResult

    store_path = Path("/c/ana/2026-12-01T20-30-05.123456Z_01.ipynb")
    h = collection.Handin("ana", "01.ipynb", "2026-12-01T20-30-05.123456Z", store_path)
    r = SubmissionResult(str(store_path), [ExerciseResult("ch01_a_test", 2, 2, "passed"),
                                           ExerciseResult("ch01_b_test", 0, 3, "not yet")])
    broken = SubmissionResult("/c/bo/x.ipynb", error="not a readable Jupyter notebook")
    hb = collection.Handin("bo", "x.ipynb", "2026-12-01T20-31-00.000000Z", Path("/c/bo/x.ipynb"))
    graded = [(h, 2, r), (hb, 1, broken)]
    report = json.loads(collection.format_json(graded))
    assert report["ana"]["score"] == 2 and report["ana"]["max_score"] == 5
    assert report["ana"]["notebooks"][0]["handed_in"] == "2026-12-01T20:30:05Z"
    assert report["bo"]["notebooks"][0]["error"].startswith("not a readable")
    rows = list(csv.reader(io.StringIO(collection.format_csv(graded))))
    assert rows[1][:6] == ["ana", "01.ipynb", "2026-12-01T20:30:05Z", "2", "ch01_a_test", "2"]
    assert rows[-1][0] == "bo" and rows[-1][-1].startswith("not a readable")
    table = collection.format_table(graded)
    assert "ana: 01.ipynb (handed in 2026-12-01T20:30:05Z, the latest of 2 hand-ins)" in table
    assert table.rstrip().splitlines()[-2:] == ["ana" + " " * 22 + "2/5", "bo" + " " * 23 + "0/0"]


def test_course_grade_of_an_ordinary_folder_is_unchanged(tmp_path, monkeypatch):
    """Only a folder with the collection's marker is graded by learner."""
    import course_tools.grader as grading

    seen = []
    monkeypatch.setattr(grading, "main_grade", lambda args: seen.append("plain") or 0)
    monkeypatch.setattr(collection, "main_grade", lambda args: seen.append("learner") or 0)
    (tmp_path / "plain").mkdir()
    store = Collection(tmp_path / "collection", create=True)
    for folder in (tmp_path / "plain", store.root):
        args = build_parser().parse_args(["grade", str(folder)])
        assert args.func(args) == 0
    assert seen == ["plain", "learner"]


# ---------------------------------------------------------------- the hub's configuration


def test_the_config_serves_loopback_with_the_course_spawner_and_limits(tmp_path, monkeypatch):
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("COURSE_HUB_DIR", str(tmp_path / "hub"))
    monkeypatch.setenv("COURSE_HUB_MEM", "3G")
    c = PyFileConfigLoader(CONFIG_FILE.name, str(CONFIG_FILE.parent)).load_config()
    assert c.JupyterHub.ip == "127.0.0.1" and c.Spawner.ip == "127.0.0.1"
    assert c.JupyterHub.spawner_class == "course_tools.hub.spawner.CourseSpawner"
    assert c.JupyterHub.authenticator_class.endswith("FirstUseAuthenticator")
    assert c.Authenticator.admin_users == {"instructor"}
    assert c.Spawner.mem_limit == "3G" and c.Spawner.cpu_limit == 1.0
    assert {s["name"] for s in c.JupyterHub.services} == {"handin", "room", "idle-culler"}
    # the room is reachable with the admin role's scopes only: no learner's role names it
    user_role = next(r for r in c.JupyterHub.load_roles if r["name"] == "user")
    assert not any("room" in scope or scope == "access:services" for scope in user_role["scopes"])
    assert "ssl_cert" not in c.JupyterHub  # loopback: plain HTTP
    assert "access:services!service=handin" in c.Spawner.server_token_scopes
    assert c.Spawner.environment["COURSE_HANDIN_URL"].startswith("http://127.0.0.1:")
    assert stat.S_IMODE((tmp_path / "hub").stat().st_mode) == 0o700
    assert Path(c.ConfigurableHTTPProxy.command[0]).name == "configurable-http-proxy"


@needs_hub
def test_the_admin_gets_a_password_once(tmp_path):
    import dbm

    import bcrypt

    from course_tools.hub.launch import ensure_admin_password

    password = ensure_admin_password(tmp_path / "hub", "instructor")
    assert password and len(password) >= 16
    assert ensure_admin_password(tmp_path / "hub", "instructor") is None
    with dbm.open(str(tmp_path / "hub" / "passwords.dbm"), "r") as db:
        assert bcrypt.checkpw(password.encode(), db[b"instructor"])


@needs_hub
def test_closed_folders_on_the_way_are_found():
    """pyenv's Python under a 0700 /root: the topmost closed folder, with what lies under it."""
    import tempfile

    from course_tools.hub.spawner import closed_ancestors

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp is open; pytest's tmp_path may not be
    try:
        os.chmod(top, 0o755)
        (top / "closed" / "inner" / "python").mkdir(parents=True)
        (top / "open").mkdir()
        os.chmod(top / "closed", 0o700)
        os.chmod(top / "closed" / "inner", 0o700)
        python, other = str(top / "closed" / "inner" / "python"), str(top / "open")
        assert closed_ancestors([python, other]) == {str(top / "closed"): [python]}
    finally:
        shutil.rmtree(top)


def test_zero_to_jupyterhub_values_keep_the_hubs_limits(tmp_path, monkeypatch):
    """deploy/z2jh/values.yaml states the same limits, idle timeout and hand-in as the config."""
    import yaml
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("COURSE_HUB_DIR", str(tmp_path / "hub"))
    c = PyFileConfigLoader(CONFIG_FILE.name, str(CONFIG_FILE.parent)).load_config()
    values = yaml.safe_load((REPO / "deploy" / "z2jh" / "values.yaml").read_text())
    user = values["singleuser"]
    assert user["memory"]["limit"] == c.Spawner.mem_limit
    assert float(user["cpu"]["limit"]) == c.Spawner.cpu_limit
    culler = next(s for s in c.JupyterHub.services if s["name"] == "idle-culler")
    assert f"--timeout={values['cull']['timeout']}" in culler["command"]
    assert "handin" in values["hub"]["services"]
    assert user["extraEnv"]["COURSE_HANDIN_URL"].endswith("/services/handin/")
    assert values["hub"]["config"]["Spawner"]["server_token_scopes"] == \
        c.Spawner.server_token_scopes


# ---------------------------------------------------------------- TLS


@needs_hub
def test_off_loopback_the_hub_serves_https_with_a_certificate_for_its_address(tmp_path,
                                                                               monkeypatch):
    import ipaddress

    from cryptography import x509
    from traitlets.config.loader import PyFileConfigLoader

    from course_tools.hub import tls

    assert tls.choose("127.0.0.1", tmp_path).scheme == "http"          # nothing crosses a network
    assert tls.choose("10.7.0.1", tmp_path, insecure_http=True).scheme == "http"  # said so
    made = tls.choose("10.7.0.1", tmp_path)
    assert made.scheme == "https" and made.self_signed
    cert = x509.load_pem_x509_certificate(made.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.7.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert made.fingerprint == tls.fingerprint(made.cert.read_bytes())
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    assert tls.choose("10.7.0.1", tmp_path).fingerprint == made.fingerprint   # kept
    assert tls.choose("10.7.0.2", tmp_path).fingerprint != made.fingerprint   # another address
    given = tls.choose("10.7.0.1", tmp_path / "other", str(made.cert), str(made.key))
    assert not given.self_signed and given.cert == made.cert.resolve()
    with pytest.raises(ValueError, match="both --ssl-cert and --ssl-key"):
        tls.choose("10.7.0.1", tmp_path, cert=str(made.cert))
    monkeypatch.setenv("COURSE_HUB_DIR", str(tmp_path / "hub"))
    monkeypatch.setenv("COURSE_HUB_SSL_CERT", str(made.cert))
    monkeypatch.setenv("COURSE_HUB_SSL_KEY", str(made.key))
    c = PyFileConfigLoader(CONFIG_FILE.name, str(CONFIG_FILE.parent)).load_config()
    assert (c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key) == (str(made.cert), str(made.key))
    # `course hub --ssl-cert/--ssl-key/--insecure-http` reach the same choice as the variables
    from course_tools.hub.launch import _option

    monkeypatch.delenv("COURSE_HUB_SSL_CERT")
    args = build_parser().parse_args(["hub", "--ip", "10.7.0.1", "--ssl-cert", "c.pem",
                                      "--ssl-key", "k.pem", "--insecure-http"])
    assert (_option(args, "ssl_cert"), _option(args, "ssl_key"), args.insecure_http) == \
        ("c.pem", "k.pem", True)
    assert _option(build_parser().parse_args(["hub"]), "ssl_cert") is None


# ---------------------------------------------------------------- Kubernetes, with KubeSpawner


def test_kubespawner_builds_a_valid_pod_with_the_one_machine_hubs_limits(tmp_path, monkeypatch):
    """Offline: the pod KubeSpawner would submit for a learner, from deploy/z2jh/values.yaml,
    is valid by Kubernetes' own schema (1.37, strict) and has the one-machine hub's memory and
    CPU limits, the same hidden course folders, no collection and no API token."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    pytest.importorskip("kubespawner")
    from jupyterhub.traitlets import ByteSpecification
    from traitlets.config.loader import PyFileConfigLoader

    from course_tools.hub import kube
    from course_tools.hub.spawner import CourseSpawner

    monkeypatch.setenv("COURSE_HUB_DIR", str(tmp_path / "hub"))
    c = PyFileConfigLoader(CONFIG_FILE.name, str(CONFIG_FILE.parent)).load_config()
    values = kube.load_values()
    pod = kube.pod_manifest("ana", values)
    assert kubernetes_validate.validate(pod, "1.37.0", strict=True)
    (box,) = pod["spec"]["containers"]
    to_bytes = ByteSpecification().validate(None, c.Spawner.mem_limit)
    assert box["resources"]["limits"] == {"cpu": c.Spawner.cpu_limit, "memory": to_bytes}
    assert box["resources"]["requests"]["memory"] <= to_bytes
    assert box["image"] == "{name}:{tag}".format(**values["singleuser"]["image"])
    hidden = CourseSpawner.class_traits()["hidden"].default()
    assert kube.hidden_paths(values) == sorted(hidden)
    mounts = {m["mountPath"]: m for m in box["volumeMounts"]}
    for folder in hidden:
        assert mounts[f"{kube.IMAGE_COURSE_ROOT}/{folder}"].get("readOnly") is True
    assert not any("collection" in m for m in mounts), mounts   # the hub pod's only
    assert pod["spec"]["automountServiceAccountToken"] is False
    env = {e["name"]: e.get("value") for e in box["env"]}
    assert env["COURSE_HANDIN_URL"].endswith("/services/handin/")
    assert env["JUPYTERHUB_USER"] == "ana"
    assert env["OMP_NUM_THREADS"] == str(int(c.Spawner.cpu_limit))
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert "rm -rf solutions tests .git" in dockerfile and "AS learner" in dockerfile


# ---------------------------------------------------------------- the workshop plan


def test_the_workshop_plan_covers_every_chapter_and_exercise_set():
    """docs/instructors.md's plan is what course_tools/hub/plan.py makes from the files now:
    every chapter and exercise set in both versions, exercise times from their labels."""
    from course_tools.hub import plan

    text, problems = plan.markdown()
    assert problems == []
    assert plan.in_guide() == text, ("docs/instructors.md's plan is out of date: run "
                                     ".venv/bin/python -m course_tools.hub.plan --write")
    chapters = plan.chapters()
    assert [c.number for c in chapters] == sorted(p.name[:2] for p in
                                                  (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for version in plan.VERSIONS.values():
        planned = {n for _, entries in version for n, _ in entries}
        assert planned == {c.number for c in chapters}
    for c in chapters:
        if (REPO / "solutions" / Path(c.lecture).name).exists():
            assert c.exercises and c.exercise_file, c
