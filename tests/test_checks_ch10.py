"""Chapter 10's checkers name the planted and the usual mistakes; the right answers, the generic
wrong ones and the reference calls listed here run in tests/test_checks_generic.py."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from checker_cases import assert_feedback, generic_wrong_answers

from course_lib.checks import CheckFailure
from course_lib.checks import ch10 as check
from course_lib.checks._predict import forget
from course_lib.models import TransformerBlock
from course_lib.multihead import merge_heads, split_heads


def make_block(kind="right"):
    """A learner's transformer_block, right or with one of the mistakes its judge names itself."""

    def block(x, p, num_heads, mask=None):
        d = x.shape[-1]

        def ln(t, i):
            return F.layer_norm(t, (d,), p[f"ln{i}.weight"], p[f"ln{i}.bias"])

        def lin(t, name):
            return F.linear(t, p[f"{name}.weight"], p[f"{name}.bias"])

        def attn(t):
            q, k, v = (split_heads(lin(t, f"attn.{c}_proj"), num_heads) for c in "qkv")
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // num_heads)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            return lin(merge_heads(weights @ v), "attn.out_proj")

        def mlp(t):
            return lin(F.gelu(lin(t, "mlp.0")), "mlp.2")

        if kind == "one_sublayer":
            return x + attn(ln(x, 1))
        x = x + attn(ln(x, 1))
        return x + mlp(ln(x, 2))

    return block


def ablate_ok(w, head, num_heads):
    d_head = w.shape[0] // num_heads
    w = w.clone()
    w[:, head * d_head:(head + 1) * d_head] = 0
    return w


def ablate_in_place(w, head, num_heads):
    d_head = w.shape[0] // num_heads
    w[:, head * d_head:(head + 1) * d_head] = 0
    return w


def by_reference(x, p, num_heads, mask=None):
    block = TransformerBlock(x.shape[-1], num_heads, p["mlp.0.weight"].shape[0]).double()
    block.load_state_dict(p)
    return block(x, mask)


CORRECT = [
    (check.transformer_block, make_block()),
    (check.transformer_block, lambda *a: make_block()(*a).numpy()),
    (check.ablate_head, ablate_ok),
]
GENERIC_WRONG = generic_wrong_answers("think about it")
# (check, malformed prediction or wrong why, words its feedback must hold): test_checks_generic
PREDICTION_MISTAKES = [
    (check.head_why, "b", "only through its d_head columns"),
    (check.head_why, "c", "run side by side"),
    (check.one_head_accuracy, None, "None"),
    (check.one_head_accuracy, 1.5, "outside the possible range [0, 1]"),
    (check.one_head_accuracy, "high", "between 0 and 1"),
]
REFERENCE_CALLS = [(check.transformer_block, by_reference)]


def test_a_block_that_is_no_named_mistake_gets_the_general_feedback():
    assert_feedback(check.transformer_block, make_block("one_sublayer"),
                    "differs from the expected values")


@pytest.mark.parametrize("wrong, words", [
    (ablate_in_place, "changed the out_weight it was given"),
    (lambda w, head, num_heads: torch.zeros_like(w), "only the columns of head"),
])
def test_ablation_mistakes_are_named(wrong, words):
    assert_feedback(check.ablate_head, wrong, words)


def test_the_prediction_is_committed_then_shown(capsys):
    forget()
    check.one_head_accuracy(1 / 32)  # chance: committed (a point), then the run is shown
    out = capsys.readouterr().out
    assert "Recorded" in out and "the model scores 0.83" in out
    check.one_head_accuracy(0.85)   # the first commit counts
    assert "you predicted 0.03" in capsys.readouterr().out
    check.head_why("a")
    forget()


def test_the_ablation_experiment_is_judged_without_printing_its_numbers(capsys):
    _, layer1, _ = check._measured_single_heads()
    check.single_head_ablations([round(a, 3) for a in layer1])
    assert "head 1 matters most" in capsys.readouterr().out
    shifted = [layer1[0], layer1[1] + 0.05, *layer1[2:]]
    for got, words in [(shifted, "head 1 too high"), ([0.5] * 3, "list of 4 accuracies"),
                       (None, "None")]:
        with pytest.raises(CheckFailure, match=re.escape(words)) as info:
            check.single_head_ablations(got)
        assert not any(f"{a:.2f}" in str(info.value) or f"{a:.3f}" in str(info.value)
                       for a in layer1), info.value  # direction only, never the measurement


def test_every_check_has_tiered_hints_without_code_in_the_first():
    for c in (check.transformer_block, check.ablate_head, check.one_head_accuracy,
              check.head_why, check.single_head_ablations):
        assert len(c.hints) >= 3 and "solutions/10_the_transformer.ipynb" in c.hints[-1]
        assert not any(s in c.hints[0] for s in ("(", "=", "[", "torch", "F."))
