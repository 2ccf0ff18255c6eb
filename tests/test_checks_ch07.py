"""Chapter 07's checkers pass right answers and turn every kind of wrong answer into feedback."""

import math

import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib import position
from course_lib.checks import CheckFailure
from course_lib.checks import ch07 as check
from course_lib.checks._predict import forget


def rope_ok(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    angles = positions.to(x.dtype)[:, None] * theta  # (n, d/2)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def rope_complex(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    ones = torch.ones(len(positions), d // 2, dtype=torch.float64)
    z = z * torch.polar(ones, positions[:, None] * theta)
    return torch.view_as_real(z).flatten(-2)


def step_ok(q_new, k_new, v_new, k_cache, v_cache):
    k_cache = torch.cat([k_cache, k_new], dim=-2)
    v_cache = torch.cat([v_cache, v_new], dim=-2)
    w = torch.softmax(q_new @ k_cache.transpose(-2, -1) / math.sqrt(q_new.shape[-1]), dim=-1)
    return w @ v_cache, k_cache, v_cache


def bytes_ok(num_layers, num_heads, n, d_head, bytes_per_element, batch=1):
    return 2 * num_layers * batch * num_heads * n * d_head * bytes_per_element


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.apply_rope, rope_ok),
    (check.cached_attention_step, step_ok),
    (check.kv_cache_bytes, bytes_ok),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.apply_rope.hints[0]),
    (lambda *a: [float("nan")], "NaN|shape|returned nan|triple"),
]


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.apply_rope, lambda x, p: position.apply_rope(x, p)),
]


def test_other_correct_forms_pass(capsys):
    check.apply_rope(rope_complex)
    check.kv_cache_bytes(lambda *a: float(bytes_ok(*a)))
    check.kv_cache_bytes(lambda *a: torch.tensor(bytes_ok(*a)))
    from course_lib.attention import scaled_dot_product_attention as sdpa

    def step_with_course_sdpa(q, k, v, kc, vc):
        kc, vc = torch.cat([kc, k], -2), torch.cat([vc, v], -2)
        return sdpa(q, kc, vc)[0], kc, vc

    check.cached_attention_step(step_with_course_sdpa)
    assert capsys.readouterr().out.count("✔") == 4


@pytest.mark.parametrize("wrong,words", [
    (lambda x, p: rope_ok(x, p) * 1.5, "lengths"),
    (lambda x, p: rope_ok(x, p + 1), "differs from the expected"),
    (lambda x, p: rope_ok(x, p)[..., :-1], "shape"),
])
def test_wrong_rope(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.apply_rope(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda q, k, v, kc, vc: step_ok(q, k, v, kc, vc)[0], "triple"),
    (lambda q, k, v, kc, vc: (step_ok(q, k, v, kc, vc)[0], kc, vc), "still holds"),
    (lambda q, k, v, kc, vc: (step_ok(q, k, v, kc, vc)[0],
                              torch.cat([k, kc], -2), torch.cat([v, vc], -2)),
     "Old keys first"),
    (lambda q, k, v, kc, vc: (step_ok(q, k, v, kc, vc)[0][..., 0, :],
                              *step_ok(q, k, v, kc, vc)[1:]),
     "shape"),
])
def test_wrong_cached_step(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.cached_attention_step(wrong)


@pytest.mark.parametrize("wrong,words", [
    (lambda L, H, n, d, b, B=1: bytes_ok(L, H, n, d, b, B) + 1, "expected"),
    (lambda L, H, n, d, b, B=1: [1, 2], "2 numbers"),
    (lambda L, H, n, d, b, B=1: float("inf"), "returned inf"),
])
def test_wrong_cache_bytes(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.kv_cache_bytes(wrong)


def test_order_prediction_and_measurement(capsys):
    gaps = check.order_gaps()
    assert gaps["within"] < 1e-5 and gaps["across"] > 0.1
    forget()
    check.padded_is_blind(False)  # the causal lesson over-applied: committed, then shown
    assert "Recorded" in capsys.readouterr().out
    check.padded_is_blind(True)   # the first commit counts
    assert "prediction committed (not blind)" in capsys.readouterr().out
    check.blind_why("b")
    check.padding_gaps(gaps["within"], gaps["across"])
    check.padding_gaps(torch.tensor(0.0), torch.tensor(gaps["across"]))
    assert capsys.readouterr().out.count("✔") == 3
    forget()


@pytest.mark.parametrize("checker, got, words", [
    (check.blind_why, "a", "a fixed mask is not enough"),
    (check.blind_why, "c", "do not share the weight equally"),
    (check.padded_is_blind, None, "None"),
    (check.padded_is_blind, "no", "True or False"),
    (check.padding_gaps, (0.3, 1.0), "gap_within = 3.00e-01"),
    (check.padding_gaps, (0.0, 0.0), "changes nothing"),
    (check.padding_gaps, (0.0, 0.6), "gap_across is smaller than the check's run"),
    (check.padding_gaps, (0.0, 2.0), "gap_across is larger than the check's run"),
    (check.padding_gaps, (0.0, None), "None"),
    (check.padding_gaps, (0.0, float("inf")), "finite"),
    (check.padding_gaps, 0.6, "two numbers"),
])
def test_order_wrong_values_are_explained(checker, got, words):
    args = got if isinstance(got, tuple) else (got,)
    forget()
    with pytest.raises(CheckFailure, match=words) as info:
        checker(*args)
    assert f"{check.order_gaps()['across']:.2f}" not in str(info.value)  # never the measurement
