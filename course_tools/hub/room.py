"""The room: the instructor's live view of who is stuck where, a JupyterHub service.

The hub starts it (`jupyterhub_config.py`) as the hub's own user on 127.0.0.1 and the proxy
serves it at /services/room/. Only the admin may open it: it is a service like the hand-in
one, and the scope to reach it, `access:services!service=room`, is in the admin role and in no
learner's (the hub's OAuth login, `HubOAuthenticated`: a learner who opens the address gets
403). It reads what the hand-in service records of each check a learner runs (`records.py`) and
shows learners x exercises, refreshed every 2 s:

    GET /services/room/          the page (a grid; it asks for state every 2 s)
    GET /services/room/state     the grid as JSON (records.grid)

A cell is green once the exercise's latest check passed, red while it fails, with how long it
has been failing (stuck) and the named mistake; each column's head has the most common named
mistake of that exercise and how many learners hit it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from urllib.parse import urlparse

from course_tools.hub import COURSE_ROOT
from course_tools.hub.records import Records, grid

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>The room</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #bbb; padding: 4px 6px; vertical-align: top; }
th.ex { writing-mode: vertical-rl; transform: rotate(180deg); max-height: 14em; }
td.pass { background: #c8efc8; } td.fail { background: #f6c6c6; } td.none { color: #999; }
.mistake { font-size: 11px; color: #555; max-width: 14em; }
#updated { color: #777; }
</style></head>
<body>
<h1>The room</h1>
<p>Each check a learner runs, as it runs: green passed, red failing (for how long, and the named
mistake). <span id="updated">loading...</span></p>
<table id="grid"></table>
<h2>Most common mistake per exercise</h2>
<ul id="common"></ul>
<script>
const XSRF = "{xsrf}";
function minutes(s) { return s < 60 ? s + ' s' : Math.floor(s / 60) + ' min'; }
function esc(t) { const d = document.createElement('div'); d.textContent = t; return d.innerHTML; }
async function refresh() {
  // JupyterHub checks a cookie-authenticated fetch for its XSRF token
  const r = await fetch('state', {credentials: 'same-origin', redirect: 'manual',
                                  headers: {'X-XSRFToken': XSRF}});
  if (!r.ok) { document.getElementById('updated').textContent = 'error ' + r.status; return; }
  const s = await r.json();
  let html = '<tr><th>learner</th>' + s.exercises.map(
      e => '<th class="ex" title="' + esc(e.notebook) + '">' + esc(e.id) + '</th>').join('') +
      '</tr>';
  for (const [name, cells] of Object.entries(s.learners)) {
    html += '<tr data-learner="' + esc(name) + '"><th>' + esc(name) + '</th>';
    for (const e of s.exercises) {
      const c = cells[e.id];
      if (!c) { html += '<td class="none" data-exercise="' + esc(e.id) + '">-</td>'; continue; }
      const cls = c.passed ? 'pass' : 'fail';
      const text = c.passed ? '\\u2714 ' + c.tries : 'stuck ' + minutes(c.stuck_s) + ', ' +
          c.tries + ' tries<div class="mistake">' + esc(c.mistake || '') + '</div>';
      html += '<td class="' + cls + '" data-exercise="' + esc(e.id) + '">' + text + '</td>';
    }
    html += '</tr>';
  }
  document.getElementById('grid').innerHTML = html;
  document.getElementById('common').innerHTML = s.exercises.filter(e => e.common_mistake).map(
      e => '<li><b>' + esc(e.id) + '</b> (' + e.common_mistake.learners + ' learner(s)): ' +
           esc(e.common_mistake.mistake) + '</li>').join('');
  document.getElementById('updated').textContent =
      'updated ' + new Date(s.now * 1000).toLocaleTimeString();
}
refresh(); setInterval(refresh, 2000);
</script>
</body></html>
"""


def exercise_order(solutions: Path = COURSE_ROOT / "solutions") -> list[str]:
    """Every check cell's grade_id in the course's order (chapter, then position)."""
    order = []
    for path in sorted(Path(solutions).glob("[0-9][0-9]_*.ipynb")):
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for cell in cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("grade") and meta.get("grade_id"):
                order.append(meta["grade_id"])
    return order


def _handlers():
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado import web

    class RoomHandler(HubOAuthenticated, web.RequestHandler):
        def initialize(self, records: Records, order: list[str], hub_auth=None):
            self.records, self.order = records, order
            if hub_auth is not None:  # the tests' stand-in for the hub
                self.hub_auth = hub_auth

        @web.authenticated
        def get(self, what=""):
            self.set_header("Cache-Control", "no-store")
            if what == "state":
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(grid(self.records, order=self.order)))
            else:
                self.set_header("Content-Type", "text/html; charset=utf-8")
                token = self.xsrf_token
                token = token.decode() if isinstance(token, bytes) else str(token)
                self.finish(PAGE.replace('"{xsrf}"', json.dumps(token)))

    return RoomHandler, HubOAuthCallbackHandler


def make_app(collection: Path, prefix: str, hub_auth=None, order: list[str] | None = None):
    from tornado import web

    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    room, callback = _handlers()
    args = {"records": Records(collection), "order": order if order is not None
            else exercise_order(), "hub_auth": hub_auth}
    return web.Application([(prefix + "oauth_callback", callback),
                            (prefix + r"(state)?", room, args)],
                           cookie_secret=os.urandom(32))


def main(argv: list[str] | None = None) -> None:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", type=Path, required=True)
    args = parser.parse_args(argv)
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app = make_app(args.collection, os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"))

    async def serve():
        app.listen(url.port, address=url.hostname or "127.0.0.1")
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:  # the hub stops its services with SIGINT
        pass


if __name__ == "__main__":
    main()
