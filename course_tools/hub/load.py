"""How many learners one machine serves: N learners run a lecture at once through a real hub.

    sudo .venv/bin/python -m course_tools.hub.load --learners 1,2,4,6,8

Starts `course hub` on a free 127.0.0.1 port (its own folders in a temporary directory, system
users `cl<pid>-loadK`), then for each N: makes N learners through the hub's REST API, starts their
servers, and has each run every code cell of the lecture (chapter 05 by default) in a kernel of
its own over the server's REST and websocket API, all at once. It reports per N the slowest cell,
each learner's whole-notebook time and the learners' peak memory, and says whether every cell
stayed under the limit (`--cell-limit`, the grader's 60 s per cell). Everything is bounded: a
cell that runs past the limit ends that learner's run, and the hub, the servers and the users are
removed at the end. Loopback only. CPU-heavy: run it once, by hand, on an otherwise idle machine.

As a room runs it (issue 38): the hub serves HTTPS (a certificate made for 127.0.0.1), and with
`--notebook solutions/NN_*.ipynb` each learner runs a chapter's exercises answered, every cell
sent with its cell id as JupyterLab sends it, so each check cell reports to the hand-in service
(the live view) and each prediction's commit is kept there; an instructor's client asks the room
for its grid every 2 s meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from course_tools.hub import COURSE_ROOT

_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))
EXTRA_CONFIG = """
c.JupyterHub.services.append({{"name": "load", "api_token": {token!r}}})
c.JupyterHub.load_roles.append({{"name": "load", "services": ["load"],
    "scopes": ["admin:users", "admin:servers", "access:servers", "list:users",
               "access:services!service=room"]}})
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubClient:
    def __init__(self, url: str, token: str, ca: Path | None = None):
        import ssl

        self.url, self.token, self.ca = url, token, ca
        self.opener = _LOCAL if ca is None else urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(
                context=ssl.create_default_context(cafile=str(ca))))

    def api(self, method: str, path: str, body=None, timeout: float = 60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with self.opener.open(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def wait_ready(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending:
            for name in sorted(pending):
                server = self.api("GET", f"hub/api/users/{name}")["servers"].get("", {})
                if server.get("ready"):
                    pending.discard(name)
            if time.monotonic() > deadline:
                raise TimeoutError(f"servers not ready after {timeout:.0f} s: {sorted(pending)}")
            time.sleep(0.5)


def run_notebook(hub: HubClient, name: str, cells: list[tuple[str, str]], limit: float,
                 path: str = "notebooks/load.ipynb") -> dict:
    """Every code cell, in order, in a fresh kernel of learner `name`; -> times and errors."""
    import websocket

    session = hub.api("POST", f"user/{name}/api/sessions", {
        "path": path, "type": "notebook", "kernel": {"name": "python3"}})
    kernel = session["kernel"]["id"]
    ws_url = hub.url.replace("http", "ws", 1) + f"user/{name}/api/kernels/{kernel}/channels"
    ws = websocket.create_connection(ws_url, header=[f"Authorization: token {hub.token}"],
                                     timeout=limit, http_proxy_host=None,
                                     sslopt={"ca_certs": str(hub.ca)} if hub.ca else None)
    times, error, sid = [], None, uuid.uuid4().hex
    try:
        for cell_id, code in cells:
            msg_id = uuid.uuid4().hex
            ws.send(json.dumps({
                "header": {"msg_id": msg_id, "session": sid, "username": "load",
                           "msg_type": "execute_request", "version": "5.3"},
                "parent_header": {}, "metadata": {"cellId": cell_id}, "channel": "shell",
                "buffers": [],
                "content": {"code": code, "silent": False, "store_history": True,
                            "user_expressions": {}, "allow_stdin": False,
                            "stop_on_error": True}}))
            start, replied, idle = time.monotonic(), False, False
            while not (replied and idle):
                if time.monotonic() - start > limit:
                    raise TimeoutError(f"a cell ran past {limit:.0f} s")
                msg = json.loads(ws.recv())
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "execute_reply":
                    replied = True
                    if msg["content"]["status"] != "ok":
                        error = f"{msg['content'].get('ename')}: {msg['content'].get('evalue')}"
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
            times.append(time.monotonic() - start)
            if error:
                break
    except (TimeoutError, websocket.WebSocketTimeoutException) as e:
        error = f"{type(e).__name__}: {e}"
    finally:
        ws.close()
        hub.api("DELETE", f"user/{name}/api/sessions/{session['id']}")
    return {"learner": name, "cells": times, "total": sum(times), "error": error}


def _rss_of_uids(uids: set[int]) -> int:
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines()
                          if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) in uids and "VmRSS" in fields:
            total += int(fields["VmRSS"].split()[0]) * 1024
    return total


def measure(hub: HubClient, prefix: str, n: int, cells: list[tuple[str, str]], limit: float,
            path: str = "notebooks/load.ipynb") -> dict:
    import pwd

    names = [f"load{k}" for k in range(1, n + 1)]
    hub.api("POST", "hub/api/users", {"usernames": names})
    for name in names:
        hub.api("POST", f"hub/api/users/{name}/server")
    hub.wait_ready(names, timeout=300)
    uids = {pwd.getpwnam(prefix + name).pw_uid for name in names}
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.wait(1.0):
            peak[0] = max(peak[0], _rss_of_uids(uids))

    def watch():   # the instructor's room page, asking for the grid every 2 s
        while not stop.wait(2.0):
            try:
                rooms.append(len(hub.api("GET", "services/room/state", timeout=10)["learners"]))
            except OSError:
                rooms.append(-1)

    rooms: list[int] = []
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results: list[dict] = []
    threads = [threading.Thread(target=lambda m=name: results.append(
        run_notebook(hub, m, cells, limit, path))) for name in names]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    stop.set()
    sampler.join()
    watcher.join()
    for name in names:
        hub.api("DELETE", f"hub/api/users/{name}/server", timeout=120)
    return {"learners": n, "wall": wall, "peak_rss": peak[0], "results": results,
            "slowest_cell": max((max(r["cells"], default=0) for r in results), default=0),
            "ok": all(r["error"] is None for r in results),
            "room_polls": len(rooms), "room_learners": max(rooms, default=0)}


def code_cells(notebook: Path) -> list[tuple[str, str]]:
    """(cell id, source) of every code cell."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return [(c.get("id", ""), c.source) for c in nb.cells
            if c.cell_type == "code" and c.source.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", default="1,2,4,6,8", help="the N to try, in order")
    parser.add_argument("--notebook", type=Path, default=COURSE_ROOT / "notebooks" /
                        "05_multihead.ipynb")
    parser.add_argument("--cell-limit", type=float, default=60.0)
    parser.add_argument("--mem", default="2G")
    parser.add_argument("--no-tls", action="store_true", help="plain HTTP, as before issue 38")
    args = parser.parse_args(argv)
    cells = code_cells(args.notebook)
    # a solution notebook runs as its exercise notebook would: the kernel's session names it
    path = (f"exercises/{args.notebook.name}" if args.notebook.parent.name == "solutions"
            else "notebooks/load.ipynb")
    top = Path(tempfile.mkdtemp(prefix="course-hub-load-", dir="/tmp"))
    os.chmod(top, 0o755)
    token, prefix, port = secrets.token_hex(16), f"cl{os.getpid() % 100000}-", _free_port()
    (top / "extra.py").write_text(EXTRA_CONFIG.format(token=token))
    env = dict(os.environ)
    ca = None
    if not args.no_tls:
        from course_tools.hub.tls import make_self_signed

        ca, key = make_self_signed(top / "tls", "127.0.0.1")
        env.update(COURSE_HUB_SSL_CERT=str(ca), COURSE_HUB_SSL_KEY=str(key))
    log = open(top / "hub.log", "wb")  # noqa: SIM115 - closed in finally
    hub_proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "course"), "hub", "--port", str(port),
         "--dir", str(top / "hub"), "--home-root", str(top / "home"), "--user-prefix", prefix,
         "--mem", args.mem, "--extra-config", str(top / "extra.py")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        env=env)
    hub = HubClient(f"{'http' if ca is None else 'https'}://127.0.0.1:{port}/", token, ca)
    made: set[str] = set()
    try:
        for _ in range(240):
            try:
                hub.api("GET", "hub/api/", timeout=5)
                break
            except OSError:
                time.sleep(0.5)
        print(f"{len(cells)} code cells of {args.notebook.name}; cell limit {args.cell_limit:.0f}"
              f" s; memory limit {args.mem} per process", flush=True)
        for n in (int(x) for x in args.learners.split(",")):
            made |= {f"load{k}" for k in range(1, n + 1)}
            r = measure(hub, prefix, n, cells, args.cell_limit, path)
            totals = sorted(x["total"] for x in r["results"])
            errors = [f"{x['learner']}: {x['error']}" for x in r["results"] if x["error"]]
            print(f"N={n:2d}  wall {r['wall']:6.1f} s  notebook {totals[0]:5.1f}-{totals[-1]:5.1f}"
                  f" s  slowest cell {r['slowest_cell']:5.1f} s  peak RSS "
                  f"{r['peak_rss'] / 2**30:4.1f} GiB  room polled {r['room_polls']}x "
                  f"(rows {r['room_learners']})  {'ok' if r['ok'] else 'FAILED'}"
                  + (f"  ({'; '.join(errors)})" if errors else ""), flush=True)
            if not r["ok"]:
                break
    finally:
        hub_proc.send_signal(signal.SIGTERM)
        try:
            hub_proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            hub_proc.kill()
        log.close()
        import pwd

        uids = set()
        for name in made:
            try:
                uids.add(pwd.getpwnam(prefix + name).pw_uid)
            except KeyError:
                pass
        for proc in Path("/proc").iterdir():  # whatever of the learners outlived the hub
            try:
                if proc.name.isdigit() and proc.stat().st_uid in uids:
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass
        for name in sorted(made):
            subprocess.run(["userdel", prefix + name], capture_output=True)
        subprocess.run(["rm", "-rf", str(top)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
