"""Chapter 07's checkers pass right answers and turn every kind of wrong answer into feedback."""

import math

import numpy as np
import pytest
import torch
from checker_cases import generic_wrong_answers

from course_lib import position
from course_lib.checks import CheckFailure
from course_lib.checks import ch07 as check


def sinusoidal_ok(n, d):
    pe = torch.zeros(n, d)
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    pe[:, 0::2] = torch.sin(pos * w)
    pe[:, 1::2] = torch.cos(pos * w)
    return pe


def sinusoidal_numpy(n, d):
    pos = np.arange(n)[:, None]
    w = 10000.0 ** (-np.arange(0, d, 2) / d)
    pe = np.zeros((n, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos * w), np.cos(pos * w)
    return pe


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
    (check.sinusoidal_positions, sinusoidal_ok),
    (check.apply_rope, rope_ok),
    (check.cached_attention_step, step_ok),
    (check.kv_cache_bytes, bytes_ok),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.sinusoidal_positions.hints[0]),
    (lambda *a: [float("nan")], "NaN|shape|returned nan|triple"),
]


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "calls the course's own" feedback, not a pass.
REFERENCE_CALLS = [
    (check.apply_rope, lambda x, p: position.apply_rope(x, p)),
    (check.sinusoidal_positions, lambda n, d: position.sinusoidal_positions(n, d)),
]


def test_other_correct_forms_pass(capsys):
    check.sinusoidal_positions(sinusoidal_numpy)
    check.apply_rope(rope_complex)
    check.kv_cache_bytes(lambda *a: float(bytes_ok(*a)))
    check.kv_cache_bytes(lambda *a: torch.tensor(bytes_ok(*a)))
    from course_lib.attention import scaled_dot_product_attention as sdpa

    def step_with_course_sdpa(q, k, v, kc, vc):
        kc, vc = torch.cat([kc, k], -2), torch.cat([vc, v], -2)
        return sdpa(q, kc, vc)[0], kc, vc

    check.cached_attention_step(step_with_course_sdpa)
    assert capsys.readouterr().out.count("✔") == 5


@pytest.mark.parametrize("wrong,words", [
    (lambda n, d: sinusoidal_ok(n, d).T, r"expected \(n, d\)"),
    (lambda n, d: sinusoidal_ok(n, d)[:, [c ^ 1 for c in range(d)]], "swapped"),
    (lambda n, d: torch.cat([sinusoidal_ok(n, d)[:, 0::2], sinusoidal_ok(n, d)[:, 1::2]], 1),
     "INTERLEAVES"),
    (lambda n, d: _sinusoidal_wrong_frequency(n, d), "pair i is 10000"),
    (lambda n, d: sinusoidal_ok(n, d) * 2, "differs from the expected"),
    (lambda n, d: sinusoidal_ok(n, d)[:, :-1], "shape"),
    (lambda n, d: torch.full((n, d), float("nan")), "NaN"),
])
def test_wrong_sinusoidal(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.sinusoidal_positions(wrong)


def _sinusoidal_wrong_frequency(n, d):
    pe = torch.zeros(n, d)
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    w = 10000.0 ** (-torch.arange(0, d // 2, dtype=torch.float32) / d)  # i instead of 2i
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * w), torch.cos(pos * w)
    return pe


def _rope_half(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    angles = positions.to(x.dtype)[:, None] * theta
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


@pytest.mark.parametrize("wrong,words", [
    (lambda x, p: x, "nothing was rotated"),
    (lambda x, p: rope_ok(x, -p), "wrong way"),
    (_rope_half, "rotate half"),
    (lambda x, p: rope_ok(x, p) * 1.5, "lengths"),
    (lambda x, p: rope_ok(x, p + 1), "differs from the expected"),
    (lambda x, p: rope_ok(x, p)[..., :-1], "shape"),
])
def test_wrong_rope(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.apply_rope(wrong)


def _step_no_scale(q, k, v, kc, vc):
    kc, vc = torch.cat([kc, k], -2), torch.cat([vc, v], -2)
    return torch.softmax(q @ kc.transpose(-2, -1), -1) @ vc, kc, vc


@pytest.mark.parametrize("wrong,words", [
    (lambda q, k, v, kc, vc: step_ok(q, k, v, kc, vc)[0], "triple"),
    (lambda q, k, v, kc, vc: (step_ok(q, k, v, kc, vc)[0], kc, vc), "still holds"),
    (lambda q, k, v, kc, vc: (step_ok(q, k, v, kc, vc)[0], k, v), "only the new key"),
    (lambda q, k, v, kc, vc: (v, *step_ok(q, k, v, kc, vc)[1:]), "just the new value"),
    (_step_no_scale, "scaling"),
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
    (lambda L, H, n, d, b, B=1: bytes_ok(L, H, n, d, b, B) // 2, "K AND V"),
    (lambda L, H, n, d, b, B=1: bytes_ok(L, H, n, d, b, 1), "forgets the batch"),
    (lambda L, H, n, d, b, B=1: bytes_ok(L, H, n, d, 1, B), "counts elements"),
    (lambda L, H, n, d, b, B=1: bytes_ok(1, H, n, d, b, B), "one layer"),
    (lambda L, H, n, d, b, B=1: bytes_ok(L, H, n, d, b, B) + 1, "expected"),
    (lambda L, H, n, d, b, B=1: [1, 2], "2 numbers"),
    (lambda L, H, n, d, b, B=1: float("inf"), "returned inf"),
])
def test_wrong_cache_bytes(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.kv_cache_bytes(wrong)
