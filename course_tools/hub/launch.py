"""`course hub`: check what the hub needs, then run JupyterHub with the course's configuration."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from course_tools.hub import CONFIG_FILE, COURSE_ROOT

PROXY = COURSE_ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
# What a learner's server runs on: this environment, the Python under it, the course.
RUNS_ON = [Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix, COURSE_ROOT)]


def problems(home_root: Path) -> list[str]:
    """What stops the hub from working here, in words an instructor can act on."""
    found = []
    if sys.platform != "linux":
        found.append(f"`course hub` runs learners' servers as Linux users; this is {sys.platform}"
                     " (use Zero to JupyterHub or Binder: docs/instructors.md)")
    elif os.geteuid() != 0:
        found.append("`course hub` makes a system user per learner and starts their servers as "
                     "them, so it runs as root: sudo .venv/bin/course hub")
    if not PROXY.exists() and not shutil.which("configurable-http-proxy"):
        found.append("the hub's proxy is not installed: install Node.js with npm, then run "
                     "`python3 tools/bootstrap.py setup` (it runs `npm ci` for package.json)")
    if not found and unreachable([*RUNS_ON, home_root.parent]):
        probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x00020000) != 0)"
        if subprocess.run([sys.executable, "-c", probe]).returncode != 0:
            found.append("learners' servers must reach this Python and the course, and a "
                         f"folder on the way is closed to other users ({unreachable_text()}); "
                         "this machine gives no private mount namespace to open it for them: "
                         "put the course and its Python in folders such as /srv/attention-course")
    return found


def unreachable_text() -> str:
    paths = unreachable(RUNS_ON)
    return ", ".join(f"{p} is {stat.filemode(p.stat().st_mode)}" for p in paths)


def unreachable(paths: list[Path]) -> list[Path]:
    """Folders on the way to `paths` that other users may not enter (no o+x)."""
    bad = []
    for path in paths:
        path = Path(os.path.abspath(path))
        for folder in [*reversed(path.parents), path]:
            if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH and folder not in bad:
                bad.append(folder)
                break
    return bad


def ensure_admin_password(hub_dir: Path, admin: str) -> str | None:
    """Give the instructor a password before anyone can claim the name; -> it, the first time."""
    import dbm

    import bcrypt

    hub_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with dbm.open(str(hub_dir / "passwords.dbm"), "c", 0o600) as db:
        if admin.encode() in db:
            return None
        password = secrets.token_urlsafe(12)
        db[admin] = bcrypt.hashpw(password.encode(), bcrypt.gensalt())
        return password


def _option(args, name: str) -> str | None:
    """A TLS option: `course hub --ssl-cert ...` where the CLI has it, else $COURSE_HUB_..."""
    given = getattr(args, name, None)
    return str(given) if given else os.environ.get(f"COURSE_HUB_{name.upper()}") or None


def main(args) -> int:
    from course_tools.hub import tls

    hub_dir = Path(args.dir or COURSE_ROOT / ".hub").resolve()
    home_root = Path(args.home_root).resolve()
    found = problems(home_root)
    if found:
        for line in found:
            print(f"course hub: {line}", file=sys.stderr)
        return 1
    insecure = bool(getattr(args, "insecure_http", False)) or \
        os.environ.get("COURSE_HUB_INSECURE_HTTP", "") not in ("", "0")
    hub_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        served = tls.choose(args.ip, hub_dir, _option(args, "ssl_cert"),
                            _option(args, "ssl_key"), insecure_http=insecure)
    except ValueError as e:
        print(f"course hub: {e}", file=sys.stderr)
        return 1
    env = dict(os.environ, COURSE_HUB_DIR=str(hub_dir), COURSE_HUB_IP=args.ip,
               COURSE_HUB_PORT=str(args.port), COURSE_HUB_ADMINS=args.admin,
               COURSE_HUB_HOME_ROOT=str(home_root), COURSE_HUB_USER_PREFIX=args.user_prefix,
               COURSE_HUB_MEM=args.mem, COURSE_HUB_CPU=str(args.cpu),
               COURSE_HUB_IDLE=str(args.idle))
    if served.scheme == "https":
        env.update(COURSE_HUB_SSL_CERT=str(served.cert), COURSE_HUB_SSL_KEY=str(served.key))
    else:
        env.pop("COURSE_HUB_SSL_CERT", None)
        env.pop("COURSE_HUB_SSL_KEY", None)
    if args.extra_config:
        env["COURSE_HUB_EXTRA_CONFIG"] = str(Path(args.extra_config).resolve())
    password = ensure_admin_password(hub_dir, args.admin)
    if password:
        print(f"[course hub] {args.admin}'s password (shown this once; change it at "
              f"/hub/auth/change-password): {password}", flush=True)
    host = tls.names_for(args.ip)[0][0] if args.ip in ("0.0.0.0", "::") and \
        tls.names_for(args.ip)[0] else args.ip
    url = f"{served.scheme}://{host}:{args.port}/"
    if served.self_signed:
        print(f"[course hub] HTTPS with a certificate made for this room ({served.cert}): the "
              "browser warns once; learners compare the certificate's SHA-256 fingerprint with "
              f"this one before going on:\n[course hub]   SHA-256 {served.fingerprint}",
              flush=True)
    elif served.scheme == "https":
        print(f"[course hub] HTTPS with {served.cert} (SHA-256 {served.fingerprint})", flush=True)
    elif not tls.is_loopback(args.ip):
        print(f"[course hub] WARNING: plain HTTP on {args.ip} (--insecure-http): passwords and "
              "notebooks cross the network unencrypted", flush=True)
    print(f"[course hub] learners open {url} and pick a name and a password; hand-ins land in "
          f"{hub_dir / 'collection'}; the instructor's live view of the room is {url}services/"
          "room/ (Ctrl-C stops the hub and every learner's server)", flush=True)
    os.chdir(hub_dir)
    hub = Path(sys.executable).parent / "jupyterhub"
    os.execve(str(hub), [str(hub), "-f", str(CONFIG_FILE)], env)
    return 0  # not reached
