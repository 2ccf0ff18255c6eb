# The course's JupyterHub: `course hub` runs `jupyterhub -f` on this file (you can too).
#
# A workshop on one machine: JupyterHub on 127.0.0.1 behind configurable-http-proxy (npm, pinned in
# package-lock.json), learners log in with FirstUseAuthenticator (the password they choose at
# their first login is theirs from then on), each gets a server of their own under a system user
# of their own (spawner.py) with a copy of notebooks/ and exercises/, and hands in with
# `course submit` to the hand-in service (handin.py), which files it in the collection. Every
# check a learner runs and every prediction's first commit go to the same service while they
# work (records.py); the instructor's live grid is the room service (room.py, admin only).
# Over the network the proxy serves HTTPS (launch.py gives it a certificate: the instructor's,
# or one it generates); plain HTTP on loopback only, or when asked for in so many words.
#
# Every setting below can be changed through the environment (`course hub --help` sets these):
#   COURSE_HUB_DIR      the hub's own folder (database, cookie secret, passwords, collection/)
#   COURSE_HUB_IP, COURSE_HUB_PORT            where learners connect (127.0.0.1:8000)
#   COURSE_HUB_SSL_CERT, COURSE_HUB_SSL_KEY   the proxy's TLS certificate and key (PEM files)
#   COURSE_HUB_ADMINS   comma-separated admin user names (instructor)
#   COURSE_HUB_HOME_ROOT, COURSE_HUB_USER_PREFIX   learners' homes, system user names
#   COURSE_HUB_MEM, COURSE_HUB_CPU, COURSE_HUB_IDLE   per-learner limits (2G, 1, 3600 s)
#   COURSE_HUB_EXTRA_CONFIG   a further config file loaded last (the tests use it)
# The same limits in Kubernetes form are in deploy/z2jh/values.yaml.
# ruff: noqa: F821 - `c` and `load_subconfig` are provided by JupyterHub when it loads this file

import os
import shutil
import socket
import sys
from pathlib import Path

from course_tools.hub import COURSE_ROOT, HANDIN_SERVICE, ROOM_SERVICE


def _env(name, default):
    return os.environ.get(f"COURSE_HUB_{name}") or default


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


hub_dir = Path(_env("DIR", COURSE_ROOT / ".hub")).resolve()
hub_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
os.chmod(hub_dir, 0o700)  # database, tokens, passwords and the collection: the hub's alone
collection = hub_dir / "collection"
admins = {a.strip() for a in _env("ADMINS", "instructor").split(",") if a.strip()}

# ---------------------------------------------------------------- the hub and its proxy
c.JupyterHub.ip = _env("IP", "127.0.0.1")
c.JupyterHub.port = int(_env("PORT", 8000))
if _env("SSL_CERT", ""):   # the proxy serves HTTPS with it (launch.py: given, or generated)
    c.JupyterHub.ssl_cert = _env("SSL_CERT", "")
    c.JupyterHub.ssl_key = _env("SSL_KEY", "")
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(_env("HUB_PORT", 0)) or _free_port()
c.JupyterHub.db_url = f"sqlite:///{hub_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(hub_dir / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(hub_dir / "jupyterhub.pid")
proxy_api_port = int(_env("PROXY_API_PORT", 0)) or _free_port()
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = str(hub_dir / "proxy.pid")
chp = COURSE_ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
c.ConfigurableHTTPProxy.command = [str(chp) if chp.exists()
                                   else shutil.which("configurable-http-proxy") or str(chp)]
c.JupyterHub.cleanup_servers = True   # stopping the hub stops every learner's server
c.JupyterHub.cleanup_proxy = True

# ---------------------------------------------------------------- who may log in
c.JupyterHub.authenticator_class = "firstuseauthenticator.FirstUseAuthenticator"
c.FirstUseAuthenticator.dbm_path = str(hub_dir / "passwords.dbm")
c.FirstUseAuthenticator.min_password_length = 8
c.FirstUseAuthenticator.create_users = True   # a workshop: anyone in the room picks a name
c.Authenticator.admin_users = admins
c.Authenticator.allow_all = True
# lower-case letters, digits, '-' and '_': they become system user names (spawner.py)
c.Authenticator.username_pattern = r"^[a-z][a-z0-9_-]{0,23}$"

# ---------------------------------------------------------------- each learner's server
c.JupyterHub.spawner_class = "course_tools.hub.spawner.CourseSpawner"
c.CourseSpawner.home_root = _env("HOME_ROOT", "/home/course")
c.CourseSpawner.user_prefix = _env("USER_PREFIX", "course-")
c.CourseSpawner.hide_also = [str(hub_dir)]
c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab/tree/exercises"
c.Spawner.notebook_dir = "~"
c.Spawner.ip = "127.0.0.1"
c.Spawner.start_timeout = 120   # a busy 2-core machine starting several learners at once
c.Spawner.http_timeout = 120
c.Spawner.args = [
    "--MappingKernelManager.default_kernel_name=python3",
    # idle kernels are shut down (their memory back); idle servers are culled by the service below
    f"--MappingKernelManager.cull_idle_timeout={int(_env('IDLE', 3600))}",
    "--MappingKernelManager.cull_interval=120",
    # a quiet lab: no news, update checks or extension-manager queries to the internet
    "--LabApp.news_url=None",
    "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
    "--LabApp.extension_manager=readonly",
]

# ---------------------------------------------------------------- limits per learner
c.Spawner.mem_limit = _env("MEM", "2G")   # RLIMIT_DATA per process here; a hard cap on Kubernetes
c.Spawner.cpu_limit = float(_env("CPU", 1))   # threads of torch/NumPy here; a CPU quota on k8s
c.JupyterHub.concurrent_spawn_limit = 10

# ---------------------------------------------------------------- hand-in and idle culling
handin_port = int(_env("HANDIN_PORT", 0)) or _free_port()
room_port = int(_env("ROOM_PORT", 0)) or _free_port()
c.Spawner.environment = {
    "COURSE_HANDIN_URL": f"http://127.0.0.1:{handin_port}/services/{HANDIN_SERVICE}/",
}
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                 f"access:services!service={HANDIN_SERVICE}"]
c.JupyterHub.services = [
    {"name": HANDIN_SERVICE, "url": f"http://127.0.0.1:{handin_port}", "display": False,
     "command": [sys.executable, "-m", "course_tools.hub.handin",
                 "--collection", str(collection)]},
    # the instructor's live grid: behind the hub's login, reachable with the admin's scopes only
    {"name": ROOM_SERVICE, "url": f"http://127.0.0.1:{room_port}", "display": True,
     "oauth_no_confirm": True,
     "command": [sys.executable, "-m", "course_tools.hub.room", "--collection", str(collection)]},
    {"name": "idle-culler",
     "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                 f"--timeout={int(_env('IDLE', 3600))}", "--cull-every=300"]},
]
c.JupyterHub.load_roles = [
    # learners reach the hand-in service (and report to it), never the room: only the admin
    # role's `access:services` covers it
    {"name": "user", "scopes": ["self", f"access:services!service={HANDIN_SERVICE}"]},
    # the instructor's live grid: behind the hub's login, reachable with the admin's scopes only
    {"name": ROOM_SERVICE, "url": f"http://127.0.0.1:{room_port}", "display": True,
     "oauth_no_confirm": True,
     "command": [sys.executable, "-m", "course_tools.hub.room", "--collection", str(collection)]},
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]

if _env("EXTRA_CONFIG", ""):
    load_subconfig(_env("EXTRA_CONFIG", ""))
