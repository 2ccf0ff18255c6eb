"""Chapter 06's pictures draw the task's own definition: the cells a timeline fills are the tokens
the recall task can still ask about, and the heatmap and curves draw the numbers they are given."""

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from course_lib.diagrams.recurrence import (
    draw_alignment,
    draw_length_curves,
    draw_question_timelines,
    summary_must_hold,
)
from course_lib.models.recall import recall_batch

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_the_token_held_for_the_answer_is_the_one_the_task_asks_for():
    n, vocab = 16, 8
    tokens, targets = recall_batch(torch.Generator().manual_seed(0), batch=64, n=n, vocab=vocab)
    for row, target in zip(tokens.tolist(), targets[:, -1].tolist()):
        k = row[-1] - vocab
        for first in (False, True):
            (p,) = summary_must_hold(n, k, first)[-1]["held"]   # held when the answer is read
            assert row[p - 1] == target                          # x_p is the task's answer


@pytest.mark.parametrize("n, k", [(1, 1), (5, 2), (16, 16)])
def test_what_the_summary_must_hold_step_by_step(n, k):
    p = n + 1 - k
    last, first = summary_must_hold(n, k, False), summary_must_hold(n, k, True)
    assert [s["token"] for s in last] == [f"x{t}" for t in range(1, n + 1)] + [f"Q_{k}"]
    assert [s["token"] for s in first] == [f"Q_{k}"] + [f"x{t}" for t in range(1, n + 1)] + ["?"]
    assert [s["held"] for s in last[:-1]] == [list(range(1, t + 1)) for t in range(1, n + 1)]
    assert [s["held"] for s in first[1:-1]] == [[p] if t >= p else [] for t in range(1, n + 1)]
    for steps in (last, first):
        assert [s["reads_answer"] for s in steps] == [False] * (len(steps) - 1) + [True]


def test_the_timelines_fill_the_cells_the_task_asks_for():
    values = [3, 1, 4, 1, 5, 9]
    axes = draw_question_timelines(values, k=2)
    for ax, first in zip(axes, (False, True)):
        filled = {p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("held")}
        steps = summary_must_hold(6, 2, first)
        assert filled == {f"held x{pos} step {c}" for c, s in enumerate(steps) for pos in s["held"]}
        counts = {t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith(
            "count")}
        assert counts == {f"count step {c}": str(len(s["held"])) for c, s in enumerate(steps)}
    labels = [t.get_text() for t in axes[0].get_xticklabels()]
    assert labels[:2] == ["x1\n3", "x2\n1"] and labels[-1] == "Q_2"


def test_bad_input():
    with pytest.raises(ValueError, match="k must lie in 1..n=4, got 5"):
        summary_must_hold(4, 5, True)
    with pytest.raises(ValueError, match=r"weights has shape \(2, 3\), wanted .* = \(2, 2\)"):
        draw_alignment(torch.ones(2, 3), ["a", "b"], ["A", "B"])
    with pytest.raises(ValueError, match="runs must hold at least one row"):
        draw_length_curves([])


def test_the_heatmap_and_the_curves_draw_their_numbers():
    w = torch.tensor([[0.0, 1.0], [0.7, 0.3]])
    ax = draw_alignment(w, ["the", "dog"], ["DOG", "THE"])
    torch.testing.assert_close(torch.as_tensor(ax.images[0].get_array()), w)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["DOG", "THE"]
    runs = [{"attention": a, "steps": 5, "seed": s, "bins": [[1, 2], [3, 4]],
             "word_accuracy": [0.9, 0.5 + 0.1 * s]} for a in ("none", "dot") for s in (0, 1)]
    ax = draw_length_curves(runs)
    line = next(x for x in ax.lines if x.get_gid() == "none 5")
    assert list(line.get_xdata()) == [1.5, 3.5]
    torch.testing.assert_close(torch.as_tensor(line.get_ydata()), torch.tensor([0.9, 0.55]))
