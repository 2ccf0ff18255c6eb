"""Recorded by `python -m course_lib.models.capacity` (seeded; see capacity.py): the sweep's rows,
kept as data in course_lib/data/capacity_results.json."""

import json
from pathlib import Path

_RECORD = json.loads((Path(__file__).parents[1] / "data" / "capacity_results.json").read_text())
RESULTS: list[dict] = _RECORD["results"]  # one trained GRU per (n, d_hidden)
LONGER: list[dict] = _RECORD["longer"]    # two of its cells trained three times longer
