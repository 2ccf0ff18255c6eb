"""The workshop hub: the course on a real JupyterHub, one server per learner, hand-in and grading.

    course hub                        # JupyterHub on 127.0.0.1:8000 (jupyterhub_config.py)
    course submit exercises/04_masking.ipynb     # a learner hands in, from a terminal or `!`
    course grade .hub/collection --csv           # the instructor grades, keyed by learner

One module per part: `jupyterhub_config.py` (the hub's configuration, also usable as
`jupyterhub -f`), `spawner.py` (each learner's server under a system user of their own, with their
own copy of notebooks/ and exercises/, solutions/ hidden, limits), `handin.py` (the hub service
that files a hand-in under the authenticated learner's name, and records each check a learner
runs and each first commit: `records.py`), `room.py` (the instructor's live grid, admin only),
`tls.py` (the certificate the hub serves HTTPS with), `kube.py` (KubeSpawner for Zero to
JupyterHub, from deploy/z2jh/values.yaml), `plan.py` (the workshop plan from the exercises'
labels), `submit.py` (`course submit`),
`collection.py` (`course grade` of a collection, keyed by learner), `launch.py` (`course hub`)
and `load.py` (the learners-per-machine measurement).
"""

from __future__ import annotations

from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILE = Path(__file__).resolve().parent / "jupyterhub_config.py"
# Written into every collection folder, so `course grade` knows to key its report by learner.
COLLECTION_MARKER = ".course-collection"
HANDIN_SERVICE = "handin"
ROOM_SERVICE = "room"     # the instructor's live grid (room.py)
