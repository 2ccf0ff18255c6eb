"""The `course` command: build exercises, re-execute notebooks, check and grade submissions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_build_exercises(args: argparse.Namespace) -> int:
    from course_tools.exercises import build

    result = build(args.solutions, args.exercises, check=args.check)
    if args.check:
        if result.stale:
            for path in result.stale:
                print(f"stale: {path}")
            print("exercises/ is out of date: run `course build-exercises` and commit the result.")
            return 1
        print("exercises/ is up to date with solutions/.")
        return 0
    for path in result.written:
        print(f"wrote {path}")
    for path in result.removed:
        print(f"removed {path} (no solution notebook of that name)")
    if not (result.written or result.removed):
        print("exercises/ was already up to date.")
    return 0


def cmd_execute(args: argparse.Namespace) -> int:
    from course_tools.notebooks import execute_in_place

    paths: list[Path] = []
    for p in args.paths:
        p = Path(p)
        paths.extend(sorted(p.glob("*.ipynb")) if p.is_dir() else [p])
    for path in paths:
        seconds = execute_in_place(path, timeout=args.timeout)
        print(f"{seconds:6.1f} s  {path}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from course_lib.env import environment_report

    for key, value in environment_report().items():
        print(f"{key:>14}: {value}")
    return 0


def cmd_grade(args: argparse.Namespace) -> int:
    from course_tools.grader.pipeline import sandbox_gate
    from course_tools.hub.collection import is_collection

    refused = sandbox_gate(args)  # no sandbox: only with --unsafe-no-sandbox, said out loud
    if refused is not None:
        return refused
    args.no_sandbox = args.unsafe_no_sandbox  # what the hub's collection grader reads

    if len(args.submissions) == 1 and is_collection(args.submissions[0]):
        from course_tools.hub.collection import main_grade  # the hub's hand-ins, by learner

        return main_grade(args)
    from course_tools import grader as grading

    return grading.main_grade(args)


def cmd_hub(args: argparse.Namespace) -> int:
    from course_tools.hub.launch import main

    return main(args)


def cmd_submit(args: argparse.Namespace) -> int:
    from course_tools.hub.submit import main

    return main(args)


def cmd_check(args: argparse.Namespace) -> int:
    from course_tools import grader as grading

    return grading.main_check(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="course",
        description="Attention, from scratch: course tools for learners, authors and graders.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "build-exercises", help="generate exercises/ from solutions/ (--check: fail if stale)"
    )
    p.add_argument(
        "--check", action="store_true", help="only compare; exit 1 if exercises/ is out of date"
    )
    p.add_argument("--solutions", type=Path, default=Path("solutions"), help=argparse.SUPPRESS)
    p.add_argument("--exercises", type=Path, default=Path("exercises"), help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_build_exercises)

    p = sub.add_parser("execute", help="authors: re-execute notebooks in place, reproducibly")
    p.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    p.add_argument(
        "--timeout", type=int, default=300, help="seconds allowed per cell (default 300)"
    )
    p.set_defaults(func=cmd_execute)

    p = sub.add_parser("env", help="print versions, CPU/GPU and Triton status")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser(
        "check", help="learners: run your exercise notebook and show the score table with hints"
    )
    p.add_argument("notebook", type=Path)
    p.add_argument("--timeout", type=int, default=60, help="seconds allowed per cell (default 60)")
    p.add_argument(
        "--memory-mb", type=int, default=4096, help="memory cap for the kernel in MB (default 4096)"
    )
    p.add_argument("--solutions", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--python-path", action="append", metavar="DIR", default=None,
                   help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("grade", help="instructors: grade submitted exercise notebooks")
    p.add_argument(
        "submissions",
        nargs="+",
        type=Path,
        metavar="SUBMISSION",
        help="exercise notebooks, or folders of them",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument(
        "--json", action="store_true", help="print one JSON object per submission, as a list"
    )
    fmt.add_argument(
        "--csv", action="store_true", help="print one CSV row per submission and exercise"
    )
    p.add_argument("--timeout", type=int, default=60, help="seconds allowed per cell (default 60)")
    p.add_argument(
        "--memory-mb", type=int, default=4096, help="memory cap per kernel in MB (default 4096)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="submissions graded at once (default: half the CPU cores, 2 to 4)",
    )
    p.add_argument(
        "--solutions",
        type=Path,
        default=None,
        help="folder of source notebooks (default: the course's solutions/)",
    )
    p.add_argument("--python-path", action="append", metavar="DIR", default=None,
                   help="a folder the kernel may import from (e.g. your own checkers); read-only")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run the kernels without bubblewrap (where there is none, or to debug); "
                        "prints what a submission can then do")
    p.add_argument("--no-sandbox", action="store_true", help=argparse.SUPPRESS)  # renamed
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("hub", help="instructors: run the workshop's JupyterHub (as root, Linux)")
    p.add_argument("--ip", default="127.0.0.1", help="address learners connect to (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port learners connect to (8000)")
    p.add_argument("--dir", type=Path, default=None,
                   help="the hub's own folder: database, passwords, collection/ (.hub/)")
    p.add_argument("--admin", default="instructor", help="the admin's user name (instructor)")
    p.add_argument("--home-root", default="/home/course", help="learners' homes (/home/course)")
    p.add_argument("--user-prefix", default="course-",
                   help="system user of learner NAME: PREFIX+NAME (course-)")
    p.add_argument("--mem", default="2G", help="memory per learner process (2G)")
    p.add_argument("--cpu", type=float, default=1.0, help="CPU cores per learner (1)")
    p.add_argument("--idle", type=int, default=3600,
                   help="seconds before an idle kernel or server is shut down (3600)")
    p.add_argument("--ssl-cert", default=None,
                   help="the room's TLS certificate (PEM); off loopback without one, the hub "
                        "makes a self-signed one and prints its fingerprint")
    p.add_argument("--ssl-key", default=None, help="the private key of --ssl-cert (PEM)")
    p.add_argument("--insecure-http", action="store_true",
                   help="serve plain HTTP on a non-loopback address (passwords cross the network "
                        "in clear: a network you trust only)")
    p.add_argument("--extra-config", default=None, help="a jupyterhub_config.py loaded last")
    p.set_defaults(func=cmd_hub)

    p = sub.add_parser("submit", help="learners on the hub: hand in an exercise notebook")
    p.add_argument("notebook", nargs="*", type=Path,
                   help="the .ipynb file(s), as saved: save (Ctrl-S) before handing in")
    p.add_argument("--list", action="store_true", help="list your hand-ins so far")
    p.set_defaults(func=cmd_submit)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
