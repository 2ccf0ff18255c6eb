"""Chapter 11's checkers name the planted and the usual mistakes; the right answers, the generic
wrong ones and the reference calls listed here run in tests/test_checks_generic.py."""

import math
import re
import types

import pytest
import torch
from checker_cases import assert_feedback, generic_wrong_answers

from course_lib.checks import CheckFailure
from course_lib.checks import ch11 as check
from course_lib.checks._predict import forget
from course_lib.masks import causal_mask
from course_lib.multihead import merge_heads, split_heads
from course_lib.position import apply_rope
from course_lib.stacking import composition
from course_lib.stacking.induction import ablate_head
from course_lib.train import accuracy


def patched(block, clean, ablated, side):
    """A learner's patched_block, written from the block's parts."""
    attn, n = block.attn, clean.shape[1]
    reads = {part: ablated if part == side else clean for part in ("queries", "keys", "values")}
    q, k, v = (split_heads(proj(block.ln1(reads[part])), attn.num_heads) for proj, part in
               ((attn.q_proj, "queries"), (attn.k_proj, "keys"), (attn.v_proj, "values")))
    scores = apply_rope(q) @ apply_rope(k).transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~causal_mask(n), -math.inf), dim=-1)
    x = clean + attn.out_proj(merge_heads(weights @ v))
    return x + block.mlp(block.ln2(x)), weights


def through_the_module(block, clean, ablated, side):
    """The lecture's patch, values added: the block's own attention does the work."""
    reads = {part: block.ln1(ablated if part == side else clean)
             for part in ("queries", "keys", "values")}
    out, weights = block.attn(reads["queries"], reads["keys"], reads["values"],
                              mask=causal_mask(clean.shape[1]),
                              positions=torch.arange(clean.shape[1]))
    x = clean + out
    return x + block.mlp(block.ln2(x)), weights


def through_the_lecture(block, clean, ablated, side):
    """composition.patch_queries_keys on a stand-in model whose stream before block 1 is clean."""
    fake = types.SimpleNamespace(embed=lambda tokens: clean, blocks=[lambda x, *a, **k: x, block],
                                 ln_f=lambda x: x, lm_head=lambda x: x)
    tokens = torch.zeros(clean.shape[:2], dtype=torch.long)
    return composition.patch_queries_keys(fake, tokens, ablated, 1, side)


def answer_weight_buggy(weights, answer_at):
    """The notebook's colleague's measure (the planted bug)."""
    batch, heads, n, _ = weights.shape
    rows = torch.arange(batch)[:, None].expand(batch, n)
    queries = torch.arange(n).expand(batch, n)
    return weights[rows, :, queries, answer_at].mean(dim=(0, 1))


def answer_weight_ok(weights, answer_at):
    scored = answer_at >= 0
    picked = weights.gather(-1, answer_at.clamp(min=0)[:, None, :, None]
                            .expand(-1, weights.shape[1], -1, 1))[..., 0]  # (B, heads, n)
    return picked.transpose(0, 1)[:, scored].mean(dim=1)


def measure(model, tokens, targets, side):
    """A learner's patched_accuracy, through the course's stream_before and ablate_head."""
    with torch.no_grad():
        clean = composition.stream_before(model, tokens, 1)
        with ablate_head(model, 0, list(range(model.blocks[0].attn.num_heads))):
            ablated = composition.stream_before(model, tokens, 1)
        x, _ = patched(model.blocks[1], clean, ablated, side)
        return accuracy(model.lm_head(model.ln_f(x)), targets)


def measure_by_the_table(model, tokens, targets, side):
    with torch.no_grad():
        clean = composition.stream_before(model, tokens, 1)
        return accuracy(composition.patch_queries_keys(model, tokens, clean, 1, "none")[0],
                        targets)


CORRECT = [
    (check.patched_block, patched),
    (check.patched_block, lambda *a: tuple(t.numpy() for t in patched(*a))),
    (check.answer_weight, answer_weight_ok),
    (check.patched_accuracy, measure),
]
GENERIC_WRONG = generic_wrong_answers("think about it")
# (check, malformed prediction or wrong why, words its feedback must hold): test_checks_generic
PREDICTION_MISTAKES = [
    (check.values_why, "b", "values do matter"),
    (check.values_why, "c", "the query's own position does not hold"),
    (check.values_accuracy, None, "None"),
    (check.values_accuracy, 1.5, "outside the possible range [0, 1]"),
    (check.values_accuracy, "high", "between 0 and 1"),
]
REFERENCE_CALLS = [(check.patched_block, through_the_module),
                   (check.patched_block, through_the_lecture),
                   (check.patched_accuracy, measure_by_the_table)]


def test_the_colleagues_function_is_named_when_it_comes_back():
    assert_feedback(check.answer_weight, answer_weight_buggy, "colleague's function again")


def test_a_block_that_is_no_named_mistake_gets_the_general_feedback():
    def no_mlp(block, clean, ablated, side):
        out, weights = patched(block, clean, ablated, side)
        x = out - block.mlp(block.ln2(out))       # not the block's MLP: wrong, and named by none
        return x, weights
    assert_feedback(check.patched_block, no_mlp, "look at the values, the output projection")


def test_the_prediction_is_committed_then_shown(capsys):
    forget()
    check.values_accuracy(0.1)   # committed (a point), then the run is shown
    out = capsys.readouterr().out
    assert "Recorded" in out and "the model scores 1.00" in out
    check.values_accuracy(0.9)   # the first commit counts
    assert "you predicted 0.10" in capsys.readouterr().out
    check.values_why("a")
    forget()


def test_the_experiment_is_judged_without_printing_its_numbers():
    cases = check._accuracy_cases(0, False)
    wants = [check._patched_accuracy(check._judge_model(c["model"]), c["tokens"], c["targets"],
                                     c["side"]) for c in cases]

    def off(model, tokens, targets, side):
        return min(1.0, measure(model, tokens, targets, side) + 0.1) if side == "values" \
            else measure(model, tokens, targets, side)
    with pytest.raises(CheckFailure, match=re.escape("side='values') is too high")) as info:
        check.patched_accuracy(off)
    message = str(info.value)
    assert not any(f"{w:.2f}" in message or f"{w:.3f}" in message for w in wants), message


def test_every_check_has_tiered_hints_without_code_in_the_first():
    for c in (check.patched_block, check.answer_weight, check.values_accuracy, check.values_why,
              check.patched_accuracy):
        assert len(c.hints) >= 3 and "solutions/11_reading_a_transformer.ipynb" in c.hints[-1]
        assert not any(s in c.hints[0] for s in ("(", "=", "[", "torch", "F."))


def test_the_lectures_patch_is_a_stub_in_the_grading_kernel():
    """The trap watches composition's functions undecorated (their no_grad wrapper is torch's,
    shared with the allowed stream_before); the strip still finds them, so the grading kernel's
    course_lib holds neither."""
    from course_tools.grader import strip

    targets = strip.exercise_targets(["ch11"])
    assert {"patch_queries_keys", "patching_table"} <= set(
        targets["course_lib.stacking.composition"])
    assert "stream_before" not in targets["course_lib.stacking.composition"]
