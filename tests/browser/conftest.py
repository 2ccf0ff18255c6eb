"""Fixtures for the real-browser tests: a throw-away JupyterLab server and a headless Chromium.

Everything a test touches lives under its own `tmp_path`: the lab's root folder, Jupyter's
config/data/runtime folders, the lab's settings and workspaces, and Chromium's profile. The
server listens on a port the OS picks on 127.0.0.1, so parallel runs (pytest-xdist) never clash.

The browser is Debian's `chromium` package driven by Playwright through `executable_path`
(never a browser download). Without /usr/bin/chromium (or $COURSE_CHROMIUM) the tests skip.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
    # containers (CI) often have a 64 MB /dev/shm; Chromium crashes in it
    "--disable-dev-shm-usage",
    "--no-proxy-server",  # the lab is on loopback: never route it through an $http_proxy
]
SERVER_START_TIMEOUT_S = 180  # generous: the suite shares two cores with nbval workers

# Lab settings for a quiet, deterministic test session: no news or update checks (no network),
# and every cell attached to the DOM so the test can see all outputs.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "checkForUpdates": False, "fetchNews": "false"},
}
DISABLED_PLUGINS = ["@jupyterlab/apputils-extension:announcements"]


def _need_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="browser tests need the playwright package")


@dataclass
class Lab:
    url: str          # http://127.0.0.1:PORT/
    root: Path        # the lab's root folder: put the notebooks to open here
    log: Path         # the server's combined stdout/stderr
    runtime_dir: Path  # the server's runtime folder (connection files of its kernels)
    process: subprocess.Popen | None = None

    def kernel_commands(self) -> list[list[str]]:
        """The command lines of the kernels this server is running."""
        commands = []
        for pid in _our_kernels(self.runtime_dir):
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            commands.append(raw.decode(errors="replace").rstrip("\0").split("\0"))
        return commands

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"


def _read_port(runtime_dir: Path, pid: int) -> int | None:
    info = runtime_dir / f"jpserver-{pid}.json"
    try:
        return int(json.loads(info.read_text())["port"])
    except (OSError, ValueError, KeyError):
        return None  # not written yet, or written half-way


# Talk to the loopback server directly, whatever $http_proxy says.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _is_up(url: str) -> bool:
    try:
        with _LOCAL.open(url + "api/status", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _our_kernels(runtime_dir: Path) -> list[int]:
    """PIDs of kernels this server started: their command line names a file in our runtime dir."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(runtime_dir) in cmdline and "ipykernel" in cmdline:
            pids.append(int(proc.name))
    return pids


def _stop(process: subprocess.Popen, url: str | None, runtime_dir: Path) -> None:
    """Shut the server down cleanly (it stops its kernels), then make sure nothing is left."""
    if url is not None and process.poll() is None:
        try:
            request = urllib.request.Request(url + "api/shutdown", method="POST", data=b"")
            _LOCAL.open(request, timeout=10).close()
        except (urllib.error.URLError, OSError):
            pass
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)  # the server runs in its own session: its group is ours
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # Kernels run in process groups of their own; end any that outlived the server.
    for pid in _our_kernels(runtime_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def _lab_server(tmp_path: Path):
    """Start JupyterLab (without waiting for it) so Chromium can start meanwhile; stop it after.

    Yields a `Lab` whose url the `lab` fixture fills in once the server answers.
    """
    _need_chromium()
    root = tmp_path / "root"
    jupyter = tmp_path / "jupyter"
    config_dir, data_dir, runtime_dir = jupyter / "config", jupyter / "data", jupyter / "runtime"
    settings_dir, workspaces_dir = jupyter / "lab-user-settings", jupyter / "lab-workspaces"
    for folder in (root, config_dir, data_dir, runtime_dir, settings_dir, workspaces_dir):
        folder.mkdir(parents=True)
    for name, values in LAB_SETTINGS.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    (config_dir / "labconfig").mkdir()
    (config_dir / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {plugin: True for plugin in DISABLED_PLUGINS}}))

    env = dict(os.environ)
    for name in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_TOKEN", "JUPYTER_PORT",
                 "MPLBACKEND"):  # MPLBACKEND=Agg (the test runner's) would break inline plots
        env.pop(name, None)
    env.update(JUPYTER_CONFIG_DIR=str(config_dir), JUPYTER_DATA_DIR=str(data_dir),
               JUPYTER_RUNTIME_DIR=str(runtime_dir), IPYTHONDIR=str(jupyter / "ipython"),
               JUPYTER_PLATFORM_DIRS="0", PYTHONUNBUFFERED="1")
    # The kernel: the "python3" spec this environment registers (in .venv/share/jupyter, found
    # through sys.prefix even with JUPYTER_DATA_DIR isolated); its argv names .venv's python, or
    # plain "python", which Jupyter runs under the server's own interpreter: this environment's.
    # The test checks the running kernel's command line.
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0", "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
        "--ServerApp.terminals_enabled=False",
        "--ServerApp.jpserver_extensions=jupyter_lsp=False",
        "--ServerApp.jpserver_extensions=jupyter_server_terminals=False",
        "--ServerApp.jpserver_extensions=notebook_shim=False",
        "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        f"--LabApp.user_settings_dir={settings_dir}", f"--LabApp.workspaces_dir={workspaces_dir}",
        "--LabApp.extension_manager=readonly",  # no PyPI queries from the extension manager
        "--MappingKernelManager.default_kernel_name=python3",
    ]
    if os.geteuid() == 0:  # containers and CI run as root
        command.append("--allow-root")
    log = tmp_path / "jupyterlab.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    server = Lab(url="", root=root, log=log, runtime_dir=runtime_dir, process=process)
    try:
        yield server
    finally:
        _stop(process, server.url or None, runtime_dir)


@pytest.fixture
def lab(_lab_server: Lab) -> Lab:
    """A token-less JupyterLab on 127.0.0.1 (port picked by the OS), isolated under tmp_path."""
    server, process = _lab_server, _lab_server.process
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {process.returncode} while starting:\n"
                        + server.log_tail())
        port = _read_port(server.runtime_dir, process.pid)
        if port and _is_up(f"http://127.0.0.1:{port}/"):
            server.url = f"http://127.0.0.1:{port}/"
            return server
        time.sleep(0.25)
    pytest.fail(f"JupyterLab did not answer within {SERVER_START_TIMEOUT_S} s:\n"
                + server.log_tail())


@pytest.fixture
def page(tmp_path: Path, _lab_server: Lab):
    """A page in a fresh headless Chromium profile; closed (with the browser) after the test.

    Depends on `_lab_server` only for the order: the server starts first and boots while
    Chromium launches, and the browser closes before the server stops.
    """
    _need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
        try:
            context.set_default_timeout(60_000)
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
