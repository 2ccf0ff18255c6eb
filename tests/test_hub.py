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
    """What the hub answers about a token: ana's, bo's, or a service's."""

    access_scopes = None
    users = {"tok-ana": {"name": "ana", "kind": "user"}, "tok-bo": {"name": "bo", "kind": "user"},
             "tok-svc": {"name": "culler", "kind": "service"}}

    def _persist_url_token_if_set(self, handler):
        pass

    def get_user(self, handler):
        token = handler.request.headers.get("Authorization", "").removeprefix("token ")
        return self.users.get(token)


@pytest.fixture
def service(tmp_path, monkeypatch):
    """The hand-in service on a free loopback port, in a thread; stopped after the test."""
    from tornado.httpserver import HTTPServer

    from course_tools.hub.handin import make_app

    store = Collection(tmp_path / "collection", create=True)
    started, box = threading.Event(), {}

    def serve():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = HTTPServer(make_app(store, "/services/handin/", FakeHubAuth()),
                            max_body_size=1 << 20)
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


def test_course_grade_of_a_collection_is_keyed_by_learner(tmp_path):
    """The real command on a collection: ana's latest hand-in is graded, bo's blank scores 0."""
    store = Collection(tmp_path / "collection", create=True)
    answered, points = _solution_of_first_exercise()
    blank = (REPO / "exercises" / "01_soft_dictionary.ipynb").read_bytes()
    store.add("ana", "01_soft_dictionary.ipynb", blank)
    store.add("ana", "01_soft_dictionary.ipynb", nbformat.writes(answered).encode())
    store.add("bo", "01_soft_dictionary.ipynb", blank)
    done = subprocess.run([str(Path(sys.executable).parent / "course"), "grade",
                           str(store.root), "--csv", "--jobs", "2"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert list(rows[0]) == ["learner", "notebook", "handed_in", "handins", "exercise", "score",
                             "max_score", "flagged", "feedback"]
    total = {name: sum(float(r["score"]) for r in rows if r["learner"] == name)
             for name in ("ana", "bo")}
    assert total == {"ana": points, "bo": 0}, rows
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
    assert {s["name"] for s in c.JupyterHub.services} == {"handin", "idle-culler"}
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
