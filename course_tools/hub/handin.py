"""The hand-in service: a JupyterHub service that files a notebook under the learner's name.

The hub starts it (`jupyterhub_config.py`, `c.JupyterHub.services`) as the hub's own user, on
127.0.0.1. A learner's `course submit` POSTs the notebook with the token of their own server
($JUPYTERHUB_API_TOKEN, which the hub gives the scope `access:services!service=handin`); the
service asks the hub whose token it is and files the bytes under *that* name, so nobody can hand
in as someone else. The collection folder is the hub user's alone (mode 0700): learners write to
it only through this service and never read it.

    POST /services/handin/?name=04_masking.ipynb   body: the notebook   -> the stored hand-in
    GET  /services/handin/                         -> the learner's own hand-ins

While they work, the learner's kernel reports to the same service, with the same token
(`course_lib/checks/_hub.py`; kept in `records.py`, the service's clock on every entry):

    POST /services/handin/checks   {"exercise", "passed", "mistake", "notebook"}  a check ran
    POST /services/handin/commits  {"check", "value"}   a prediction's first commit (first wins)
    POST /services/handin/reveals  {"cell"}             a cell that shows an answer ran (first)
    GET  /services/handin/records                       the learner's own record, nobody else's
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from urllib.parse import urlparse

from course_tools.hub.collection import Collection
from course_tools.hub.records import RecordError, Records

MAX_MB = 16           # a notebook with its figures is 0.1-3 MB
MAX_HANDINS = 200     # per learner: bounds the disk a learner's loop could fill
MAX_REPORT_BYTES = 8192   # one check result or commit


def _handler_class():
    from jupyterhub.services.auth import HubAuthenticated
    from tornado import web
    from tornado.log import app_log

    class LearnerHandler(HubAuthenticated, web.RequestHandler):
        def initialize(self, collection: Collection, records: Records, hub_auth=None):
            self.collection, self.records = collection, records
            if hub_auth is not None:  # the tests' stand-in for the hub
                self.hub_auth = hub_auth

        def _learner(self) -> str:
            user = self.current_user
            if not user or user.get("kind", "user") != "user":
                raise web.HTTPError(403, "only a learner's own server can hand in")
            return user["name"]

        def _reply(self, status: int, body: dict) -> None:
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(body))

        def write_error(self, status_code, **kwargs):
            reason = self._reason
            exc = kwargs.get("exc_info", (None, None, None))[1]
            if isinstance(exc, web.HTTPError) and exc.log_message:
                reason = exc.log_message % exc.args if exc.args else exc.log_message
            self.finish(json.dumps({"error": reason}))

    class HandinHandler(LearnerHandler):
        @web.authenticated
        def get(self):
            learner = self._learner()
            self._reply(200, {"learner": learner, "handins": [
                {"notebook": h.notebook, "handed_in": h.handed_in}
                for h in self.collection.handins(learner)]})

        @web.authenticated
        def post(self):
            learner = self._learner()
            name = self.get_argument("name", "")
            try:
                nb = json.loads(self.request.body)
                if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                    raise ValueError
            except ValueError:
                raise web.HTTPError(400, "that file is not a Jupyter notebook") from None
            if len(self.collection.handins(learner)) >= MAX_HANDINS:
                raise web.HTTPError(429, f"{MAX_HANDINS} hand-ins already: ask the instructor")
            try:
                handin = self.collection.add(learner, name, self.request.body)
            except ValueError as e:
                raise web.HTTPError(400, str(e)) from None
            same = [h for h in self.collection.handins(learner) if h.notebook == name]
            app_log.info("hand-in: %s %s (%d bytes)", learner, handin.path.name,
                          len(self.request.body))
            self._reply(201, {"learner": learner, "notebook": name,
                              "handed_in": handin.handed_in, "count": len(same)})

    class RecordHandler(LearnerHandler):
        """What the learner's kernel reports: one JSON object; -> what the records keep."""

        def _body(self) -> dict:
            if len(self.request.body) > MAX_REPORT_BYTES:
                raise web.HTTPError(413, f"a report is at most {MAX_REPORT_BYTES} bytes")
            try:
                body = json.loads(self.request.body)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise web.HTTPError(400, "send one JSON object")
            return body

        @web.authenticated
        def get(self, what):
            if what != "records":
                raise web.HTTPError(405)
            learner = self._learner()
            state = self.records.state(learner)
            self._reply(200, {"learner": learner, **self.records.for_grading(learner),
                              "checks": state["checks"][-200:]})

        @web.authenticated
        def post(self, what):
            learner = self._learner()
            body = self._body()
            try:
                if what == "checks":
                    kept = self.records.check(learner, body.get("exercise"), body.get("passed"),
                                              body.get("mistake") or "", body.get("notebook") or "")
                elif what == "commits":
                    kept = self.records.commit(learner, body.get("check"), body.get("value"))
                elif what == "reveals":
                    kept = self.records.reveal(learner, body.get("cell"))
                else:
                    raise web.HTTPError(404, f"no such report: {what}")
            except RecordError as e:
                raise web.HTTPError(400, str(e)) from None
            self._reply(201, {"learner": learner, **kept})

    return HandinHandler, RecordHandler


def make_app(collection: Collection, prefix: str, hub_auth=None):
    from tornado import web

    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    handin, record = _handler_class()
    args = {"collection": collection, "records": Records(collection.root, create=True),
            "hub_auth": hub_auth}
    return web.Application([(prefix, handin, args),
                            (prefix + r"(checks|commits|reveals|records)", record, args)])


def main(argv: list[str] | None = None) -> None:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", type=Path, required=True)
    args = parser.parse_args(argv)
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app = make_app(Collection(args.collection, create=True),
                   os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"))

    async def serve():
        app.listen(url.port, address=url.hostname or "127.0.0.1", max_body_size=MAX_MB << 20)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:  # the hub stops its services with SIGINT
        pass


if __name__ == "__main__":
    main()
