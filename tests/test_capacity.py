"""Chapter 06's capacity sweep: seeded, complete, and recorded by the command that writes it."""

import json

import pytest

from course_lib.models import capacity
from course_lib.models.capacity_results import LONGER, RESULTS


def test_one_cell_is_seeded_and_scored():
    first = capacity.train_recall(3, 4, steps=3, test_size=50)
    assert first == capacity.train_recall(3, 4, steps=3, test_size=50)
    assert 0.0 <= first <= 1.0


def test_the_recorded_sweep_covers_the_grid_it_claims():
    assert [(r["n"], r["d_hidden"]) for r in RESULTS] == [
        (n, d) for n in capacity.NS for d in capacity.HIDDEN_SIZES]
    assert all(r["steps"] == capacity.STEPS and r["kind"] == "gru" for r in RESULTS)
    # the lecture's claim: at every state size, more tokens to hold means lower accuracy
    for d in capacity.HIDDEN_SIZES:
        by_n = [r["accuracy"] for r in RESULTS if r["d_hidden"] == d]
        assert by_n == sorted(by_n, reverse=True)


def test_the_longer_runs_help_but_keep_the_order():
    assert [(r["n"], r["d_hidden"]) for r in LONGER] == list(capacity.LONGER_CELLS)
    assert all(r["steps"] == capacity.LONGER_STEPS for r in LONGER)
    short = {(r["n"], r["d_hidden"]): r["accuracy"] for r in RESULTS}
    assert all(r["accuracy"] > short[r["n"], r["d_hidden"]] for r in LONGER)
    assert LONGER[0]["accuracy"] > LONGER[1]["accuracy"]  # n = 8 still above n = 16


def test_the_command_writes_the_record(tmp_path):
    out = tmp_path / "results.json"
    capacity.main(["--steps", "1", "--out", str(out)])
    record = json.loads(out.read_text())
    assert len(record["results"]) == len(capacity.NS) * len(capacity.HIDDEN_SIZES)
    assert [r["steps"] for r in record["longer"]] == [3] * len(capacity.LONGER_CELLS)


def test_bad_input():
    with pytest.raises(ValueError, match="should be positive"):
        capacity.train_recall(0, 8)
