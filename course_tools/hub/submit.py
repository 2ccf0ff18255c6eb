"""`course submit NOTEBOOK`: a learner on the course's hub hands in an exercise notebook.

Runs in the learner's own server (a terminal, or `!course submit ...` in a notebook). It sends the
saved file to the hub's hand-in service with the server's own token; the service files it under
the learner's name, timestamped, next to any earlier hand-in (which it keeps).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

URL_VAR = "COURSE_HANDIN_URL"   # set by the hub's spawner (jupyterhub_config.py)
TOKEN_VAR = "JUPYTERHUB_API_TOKEN"
# The service is on the hub's machine: never route it through an $http_proxy.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SubmitError(Exception):
    """A reason the hand-in did not happen, in words a learner can act on."""


def _endpoint() -> tuple[str, str]:
    url, token = os.environ.get(URL_VAR), os.environ.get(TOKEN_VAR)
    if not url or not token:
        raise SubmitError("`course submit` hands in to the course's JupyterHub, and this is not a "
                          "server the hub started (no $COURSE_HANDIN_URL here). On your own "
                          "machine, send the .ipynb file to your instructor instead.")
    return url, token


def _request(method: str, query: str = "", data: bytes | None = None) -> dict:
    url, token = _endpoint()
    req = urllib.request.Request(url + query, data=data, method=method, headers={
        "Authorization": f"token {token}", "Content-Type": "application/x-ipynb+json"})
    try:
        with _LOCAL.open(req, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        try:
            why = json.loads(e.read()).get("error") or e.reason
        except ValueError:
            why = e.reason
        raise SubmitError(f"the hub refused the hand-in ({e.code}): {why}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SubmitError(f"could not reach the hub's hand-in service at {url}: {e}") from None


def submit(path: Path) -> dict:
    """Hand in one notebook; -> the service's answer (learner, notebook, handed_in, count)."""
    path = Path(path)
    if not path.is_file():
        raise SubmitError(f"{path}: no such file")
    if path.suffix != ".ipynb":
        raise SubmitError(f"{path}: hand in the exercise notebook itself (a .ipynb file)")
    data = path.read_bytes()
    try:
        json.loads(data)
    except ValueError:
        raise SubmitError(f"{path} is not a readable notebook (is it saved completely?)") from None
    return _request("POST", "?" + urllib.parse.urlencode({"name": path.name}), data)


def main(args) -> int:
    try:
        if args.list:
            answer = _request("GET")
            for h in answer["handins"]:
                print(f"{h['handed_in']}  {h['notebook']}")
            print(f"{len(answer['handins'])} hand-in(s) by {answer['learner']}.")
            return 0
        if not args.notebook:
            raise SubmitError("name the notebook to hand in: course submit exercises/NN_name.ipynb")
        for path in args.notebook:
            answer = submit(path)
            kept = (" (earlier hand-ins of it are kept; the latest is graded)"
                    if answer["count"] > 1 else "")
            print(f"handed in {path} as {answer['learner']} at {answer['handed_in']}: hand-in "
                  f"{answer['count']} of {answer['notebook']}{kept}.")
    except SubmitError as e:
        print(f"course submit: {e}", file=sys.stderr)
        return 1
    return 0
