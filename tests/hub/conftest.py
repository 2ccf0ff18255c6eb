"""Fixtures for the hub test: a real JupyterHub (`course hub`) over HTTPS, off loopback.

The hub listens on the host's end of a veth pair the fixture makes (10.231.N.1), so `course
hub` serves HTTPS with a certificate it generates for that address; the browser runs in a
network namespace of its own at the other end (10.231.N.2, `ip netns exec`), so every request
of the test's learners crosses a network interface, as in a room.

The hub runs as root and starts each learner's server under a system user of its own, so the
test needs root (as CI has), `useradd`, the proxy (`npm ci` puts configurable-http-proxy in
node_modules/), and Chromium with Playwright (tests/browser/conftest.py). It makes its learners'
system users with a prefix of its own (`ct<pid>-`), their homes in a fresh folder under /tmp, and
the hub's folder under tmp_path; afterwards it stops the hub (which stops the learners'
servers), kills whatever of it is left by process id, and deletes the users.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the browser helpers
from browser.conftest import CHROMIUM  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HUB_START_TIMEOUT_S = 90
# Lab arguments the test adds to the course's: the lab object in the page, for the test's JS.
EXTRA_CONFIG = """
c.Spawner.args.append("--LabApp.expose_app_in_browser=True")
c.Spawner.start_timeout = 180
"""


def why_not() -> str | None:
    """Why the hub test cannot run here, or None."""
    from course_tools.hub.launch import PROXY

    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "the hub test makes system users for its learners: it needs root on Linux"
    if not shutil.which("useradd") or not shutil.which("userdel"):
        return "the hub test needs useradd/userdel (Debian: the passwd package)"
    if not PROXY.exists() and not shutil.which("configurable-http-proxy"):
        return ("the hub's proxy is not installed (npm ci in the course folder; "
                "tools/bootstrap.py setup does it when npm is present)")
    if not shutil.which("ip") or subprocess.run(["ip", "netns", "list"],
                                                 capture_output=True).returncode != 0:
        return "the hub test makes a network namespace: it needs iproute2's `ip netns`"
    if not CHROMIUM.exists():
        return f"the hub test needs Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the hub test needs the playwright package"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, real uid) of every process."""
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                status = (proc / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            found[int(proc.name)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]))
    return found


@dataclass
class Net:
    """A network namespace with a veth pair: the hub on `host`, the browser in `ns` at `peer`."""

    ns: str
    host: str
    peer: str

    @classmethod
    def make(cls) -> Net:
        n = os.getpid() % 250 + 1
        net = cls(f"cth{os.getpid()}", f"10.231.{n}.1", f"10.231.{n}.2")
        outer, inner = f"cth{os.getpid()}h", f"cth{os.getpid()}n"
        steps = [["ip", "netns", "add", net.ns],
                 ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
                 ["ip", "link", "set", inner, "netns", net.ns],
                 ["ip", "addr", "add", f"{net.host}/30", "dev", outer],
                 ["ip", "link", "set", outer, "up"],
                 ["ip", "netns", "exec", net.ns, "ip", "addr", "add", f"{net.peer}/30", "dev",
                  inner],
                 ["ip", "netns", "exec", net.ns, "ip", "link", "set", inner, "up"],
                 ["ip", "netns", "exec", net.ns, "ip", "link", "set", "lo", "up"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                net.remove()
                pytest.skip(f"could not make the test's network ({' '.join(step)}): "
                            f"{done.stderr.strip()}")
        return net

    def remove(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)  # and its veth

    def run(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns, *command], capture_output=True,
                              text=True, timeout=timeout)

    def browser(self, folder: Path) -> Path:
        """Chromium, started inside the namespace (Playwright talks to it over pipes)."""
        wrapper = folder / "chromium-in-netns"
        wrapper.write_text(f"#!/bin/sh\nexec ip netns exec {self.ns} {CHROMIUM} \"$@\"\n")
        wrapper.chmod(0o755)
        return wrapper


@dataclass
class Hub:
    url: str                 # https://10.231.N.1:PORT/
    hub_dir: Path            # database, passwords, collection/
    home_root: Path          # learners' homes: home_root/<name>
    prefix: str              # system user of learner NAME: prefix + NAME
    log: Path
    process: subprocess.Popen
    users: list[str] = field(default_factory=list)
    net: Net | None = None

    @property
    def cert(self) -> Path:
        return self.hub_dir / "tls" / "hub.crt"

    def printed(self, pattern: str) -> str | None:
        """The first group of `pattern` in what `course hub` printed."""
        import re

        m = re.search(pattern, self.log.read_text(errors="replace"))
        return m.group(1) if m else None

    @property
    def collection(self) -> Path:
        return self.hub_dir / "collection"

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no hub log)"

    def ours(self) -> list[int]:
        """The hub's process tree and every process of its learners' users."""
        import pwd

        uids = set()
        for name in self.users:
            try:
                uids.add(pwd.getpwnam(self.prefix + name).pw_uid)
            except KeyError:
                pass
        procs = _processes()
        tree, grew = {self.process.pid}, True
        while grew:
            more = {pid for pid, (ppid, _) in procs.items() if ppid in tree} - tree
            tree |= more
            grew = bool(more)
        return sorted((tree & procs.keys()) | {p for p, (_, u) in procs.items() if u in uids})


def _started(pid: int) -> str | None:
    """When the process started (clock ticks since boot): a pid with another start is another."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _stop(hub: Hub) -> None:
    """Stop the hub (it stops the learners' servers), kill what is left of it, delete users."""
    seen = {pid: _started(pid) for pid in hub.ours()}
    if hub.process.poll() is None:
        hub.process.send_signal(signal.SIGTERM)
        try:
            hub.process.wait(timeout=45)
        except subprocess.TimeoutExpired:
            hub.process.kill()
            hub.process.wait(timeout=10)
    seen.update({pid: _started(pid) for pid in hub.ours()})
    for pid, started in seen.items():
        if started is not None and _started(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for name in hub.users:
        subprocess.run(["userdel", hub.prefix + name], capture_output=True)
    shutil.rmtree(hub.home_root.parent, ignore_errors=True)


def _opener(cert: Path):
    """urllib over HTTPS trusting only the hub's own certificate (which must name its IP)."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=str(cert))
    return urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                       urllib.request.HTTPSHandler(context=context))


@pytest.fixture
def hub(tmp_path: Path):
    """`course hub` over HTTPS on the host's end of a fresh veth pair (a free port), with
    learners `ana` and `bo` to log in and the browser's network namespace at the other end."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    net = Net.make()
    homes = Path(tempfile.mkdtemp(prefix="course-hub-homes-", dir="/tmp"))
    os.chmod(homes, 0o755)  # learners enter it to reach their own (0700) homes
    extra = tmp_path / "extra_config.py"
    extra.write_text(EXTRA_CONFIG)
    port = _free_port()
    prefix = f"ct{os.getpid() % 100000}-"
    command = [str(Path(sys.executable).parent / "course"), "hub", "--port", str(port),
               "--ip", net.host,
               "--dir", str(tmp_path / "hub"), "--home-root", str(homes / "home"),
               "--user-prefix", prefix, "--extra-config", str(extra)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_"))}
    env.pop("MPLBACKEND", None)
    log = tmp_path / "hub.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    hub = Hub(f"https://{net.host}:{port}/", tmp_path / "hub", homes / "home", prefix, log,
              process, users=["ana", "bo"], net=net)
    try:
        deadline = time.monotonic() + HUB_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"course hub exited with {process.returncode}:\n{hub.log_tail()}")
            try:
                with _opener(hub.cert).open(hub.url + "hub/api/", timeout=5) as r:
                    if json.loads(r.read()).get("version"):
                        break
            except (urllib.error.URLError, OSError, ValueError):  # ssl errors are OSErrors
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the hub did not answer in {HUB_START_TIMEOUT_S} s:\n"
                            + hub.log_tail())
            time.sleep(0.25)
        yield hub
    finally:
        try:
            _stop(hub)
        finally:
            net.remove()
