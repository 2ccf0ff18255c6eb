"""Each learner's server: JupyterHub's LocalProcessSpawner, under a system user of their own.

The hub runs as root. For hub user `ana` the spawner makes (once) the system user `course-ana`
(`user_prefix` + name) with a private home (mode 0700) under `home_root`, copies the course's
`notebooks/` and `exercises/` into it (never `solutions/`), and starts `jupyterhub-singleuser`
as that user with this environment's Python, so the kernel is the course's. Learners therefore
cannot read each other's files (Unix permissions) nor the hub's folder with the collection (the
hub user's, 0700). The server also runs in a mount namespace of its own (`private_view`) in
which the course's `solutions/`, `.git` (its history holds the solutions) and `tests/` are
empty, unreadable folders (the course folder itself must stay readable: the kernel imports
`course_lib`), and in which a closed folder on the way to what the server runs on (pyenv's
Python under a 0700 /root) is an empty folder with only that path in it.

Limits (jupyterhub_config.py sets them): `mem_limit` is enforced per process as RLIMIT_DATA
(what the grader uses: torch's address-space reservations make RLIMIT_AS unusable), `cpu_limit`
caps the threads torch and NumPy use (OMP_NUM_THREADS, ...) and the server runs at `nice` 5, so
the hub stays responsive. A hard CPU share between learners needs cgroups: on Kubernetes
(deploy/z2jh/values.yaml) the same figures are enforced by the container runtime.
"""

from __future__ import annotations

import ctypes
import math
import os
import pwd
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import List, Unicode

from course_tools.hub import COURSE_ROOT

CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 4096, 0x4000, 1 << 18
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RDONLY = 2, 4, 8, 1
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")


def closed_ancestors(paths: list[str]) -> dict[str, list[str]]:
    """{the topmost folder other users may not enter on the way to a path: the paths under it}.

    /root is 0700 on many machines, and pyenv puts the Python a venv runs on under it."""
    plan: dict[str, list[str]] = {}
    for path in paths:
        for folder in [*reversed(Path(path).parents), Path(path)][:-1]:
            if not folder.stat().st_mode & stat.S_IXOTH:
                plan.setdefault(str(folder), []).append(path)
                break
    return plan


def private_view(expose: dict[str, list[str]], hidden: list[str]) -> None:
    """The learner's own mount namespace: `expose` opened up, `hidden` folders empty and closed.

    Each closed folder of `expose` becomes an empty tmpfs other users may enter, with only the
    paths under it that the server needs bound back in place (from file descriptors opened
    before the folder was covered); each `hidden` folder is covered by an empty tmpfs nobody may
    enter. Runs in the child between fork and exec, as root. Raises OSError when the kernel
    refuses (no CAP_SYS_ADMIN, e.g. in some containers); the caller decides what that means."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), what)

    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    for folder, paths in expose.items():
        fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in paths]
        check(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                         b"size=64k,mode=0755"), f"opening {folder}")
        for path, fd in zip(paths, fds):
            os.makedirs(path, mode=0o755, exist_ok=True)
            check(libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None,
                             MS_BIND | MS_REC, None), f"binding {path}")
            os.close(fd)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY
    for path in hidden:
        if os.path.isdir(path):
            check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"size=4k,mode=000"),
                  f"covering {path}")


class CourseSpawner(LocalProcessSpawner):
    """LocalProcessSpawner with a system user, a home and a copy of the course per learner."""

    user_prefix = Unicode("course-", help="system user name = user_prefix + hub user name"
                          ).tag(config=True)
    home_root = Unicode("/home/course", help="learners' homes: home_root/<hub user name>"
                        ).tag(config=True)
    course_root = Unicode(str(COURSE_ROOT), help="the course checkout").tag(config=True)
    copy_folders = List(Unicode(), ["notebooks", "exercises"],
                        help="folders of the course each learner gets a copy of").tag(config=True)
    hidden = List(Unicode(), ["solutions", ".git", "tests"],
                  help="course folders (relative) covered in the learner's view").tag(config=True)
    hide_also = List(Unicode(), help="absolute folders covered too (the hub's own folder)"
                     ).tag(config=True)

    @property
    def system_user(self) -> str:
        return self.user_prefix + self.user.name

    @property
    def home(self) -> str:
        return os.path.join(self.home_root, self.user.name)

    # ------------------------------------------------------------ the learner's account and home

    def ensure_account(self) -> pwd.struct_passwd:
        """The system user (made on first start) and its private home with the course's copy."""
        try:
            account = pwd.getpwnam(self.system_user)
        except KeyError:
            os.makedirs(self.home_root, mode=0o755, exist_ok=True)
            subprocess.run(["useradd", "--no-create-home", "--home-dir", self.home,
                            "--shell", "/bin/bash", "--user-group",
                            "--comment", f"course learner {self.user.name}", self.system_user],
                           check=True, capture_output=True)
            account = pwd.getpwnam(self.system_user)
            self.log.info("created system user %s for %s", self.system_user, self.user.name)
        home = account.pw_dir
        os.makedirs(home, mode=0o700, exist_ok=True)
        for name in self.copy_folders:
            target = os.path.join(home, name)
            if not os.path.exists(target):  # the learner's work is never overwritten
                shutil.copytree(os.path.join(self.course_root, name), target, ignore=IGNORE)
                self._chown_tree(target, account)
        os.chown(home, account.pw_uid, account.pw_gid)
        os.chmod(home, 0o700)
        return account

    @staticmethod
    def _chown_tree(top: str, account: pwd.struct_passwd) -> None:
        for folder, dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(name, account.pw_uid, account.pw_gid)

    async def start(self):
        import asyncio

        await asyncio.to_thread(self.ensure_account)
        return await super().start()

    # ------------------------------------------------------------ the process

    def hidden_paths(self) -> list[str]:
        return [os.path.join(self.course_root, p) for p in self.hidden] + list(self.hide_also)

    def needed_paths(self) -> list[str]:
        """What the learner's server runs on: this Python, its environment, the course."""
        return sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix,
                                                     self.course_root, self.home_root)})

    def make_preexec_fn(self, name):  # `name` is the hub user's; we run as the system user
        become = set_user_setuid(self.system_user)
        expose, hidden = closed_ancestors(self.needed_paths()), self.hidden_paths()
        mem = int(self.mem_limit or 0)

        def preexec():
            try:
                private_view(expose, hidden)
            except OSError as e:
                print(f"[course hub] no private view for this learner ({e}): solutions/ is "
                      "readable to them", file=sys.stderr, flush=True)
            if mem:
                resource.setrlimit(resource.RLIMIT_DATA, (mem, mem))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.nice(5)
            become()

        return preexec

    def user_env(self, env):
        account = pwd.getpwnam(self.system_user)
        env.update(USER=self.system_user, LOGNAME=self.system_user, HOME=account.pw_dir,
                   SHELL=account.pw_shell or "/bin/bash")
        return env

    def get_env(self):
        env = super().get_env()
        if self.cpu_limit:
            threads = str(max(1, math.floor(self.cpu_limit)))
            env.update({var: threads for var in THREAD_VARS})
        bin_dir = os.path.dirname(sys.executable)  # `course`, `python`: this environment's
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH") or os.defpath])
        return env
