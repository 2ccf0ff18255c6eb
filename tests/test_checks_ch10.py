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
from course_lib.models import TransformerBlock
from course_lib.multihead import merge_heads, split_heads


def make_block(kind="right"):
    """A learner's transformer_block, right or with one of the usual mistakes."""

    def block(x, p, num_heads, mask=None):
        d = x.shape[-1]

        def ln(t, i):
            return F.layer_norm(t, (d,), p[f"ln{i}.weight"], p[f"ln{i}.bias"])

        def lin(t, name):
            return F.linear(t, p[f"{name}.weight"], p[f"{name}.bias"])

        def attn(t):
            q, k, v = (split_heads(lin(t, f"attn.{c}_proj"), num_heads) for c in "qkv")
            width = d if kind == "scale_d_model" else d // num_heads
            scores = q @ k.transpose(-2, -1) / math.sqrt(width)
            if mask is not None and kind != "no_mask":
                scores = scores.masked_fill(~mask, float("-inf"))
            return lin(merge_heads(torch.softmax(scores, dim=-1) @ v), "attn.out_proj")

        def mlp(t):
            act = torch.relu if kind == "relu" else F.gelu
            return lin(act(lin(t, "mlp.0")), "mlp.2")

        if kind == "post_ln":
            x = ln(x + attn(x), 1)
            return ln(x + mlp(x), 2)
        if kind == "normed_residual":
            h = ln(x, 1)
            x = h + attn(h)
            h = ln(x, 2)
            return h + mlp(h)
        if kind == "no_residual":
            return mlp(ln(attn(ln(x, 1)), 2))
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


def ablate_rows(w, head, num_heads):  # the planted bug of exercise 2
    d_head = w.shape[0] // num_heads
    w = w.clone()
    w[head * d_head:(head + 1) * d_head, :] = 0
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
REFERENCE_CALLS = [(check.transformer_block, by_reference)]


@pytest.mark.parametrize("kind, words", [
    ("post_ln", "POST-LN"),
    ("normed_residual", "NORMALISED stream"),
    ("no_residual", "residual connections are missing"),
    ("relu", "ReLU"),
    ("scale_d_model", "√d_model"),
    ("no_mask", "mask is ignored"),
    ("one_sublayer", "differs from the expected values"),
])
def test_block_mistakes_are_named(kind, words):
    assert_feedback(check.transformer_block, make_block(kind), words)


@pytest.mark.parametrize("wrong, words", [
    (ablate_rows, "ROWS of W_O were zeroed"),
    (lambda w, head, num_heads: w.clone(), "unchanged"),
    (ablate_in_place, "changed the out_weight it was given"),
    (lambda w, head, num_heads: torch.zeros_like(w), "only the columns of head"),
])
def test_ablation_mistakes_are_named(wrong, words):
    assert_feedback(check.ablate_head, wrong, words)


def test_the_prediction_is_judged_against_the_shipped_one_layer_model(capsys):
    check.one_layer_accuracy(0.1)
    assert "the model scores 0.12" in capsys.readouterr().out
    for wrong, words in [(0.9, "a key is made from its own token only"),
                         (0.0, "it is not blind either"), (None, "None"),
                         (1.5, "between 0 and 1"), ("high", "between 0 and 1")]:
        with pytest.raises(CheckFailure, match=re.escape(words)):
            check.one_layer_accuracy(wrong)


def test_the_ablation_experiment_is_judged_against_a_measurement(capsys):
    check.ablated_accuracy([3, 0], 0.122)
    assert "from 1.00 to 0.12" in capsys.readouterr().out
    for heads, accuracy, words in [([0], 0.122, "previous_heads = [0]"),
                                   ([0, 3], 1.0, "with every head in place"),
                                   ([0, 3], 0.5, "scores 0.122"),
                                   (None, 0.1, "list of head numbers"),
                                   ([0, 3], None, "None")]:
        with pytest.raises(CheckFailure, match=re.escape(words)):
            check.ablated_accuracy(heads, accuracy)


def test_every_check_has_tiered_hints_without_code_in_the_first():
    for c in (check.transformer_block, check.ablate_head, check.one_layer_accuracy,
              check.ablated_accuracy):
        assert len(c.hints) >= 3 and "solutions/10_the_transformer.ipynb" in c.hints[-1]
        assert not any(s in c.hints[0] for s in ("(", "=", "[", "torch", "F."))
