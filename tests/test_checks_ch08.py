"""Chapter 08's checkers pass right answers and turn every kind of wrong answer into feedback."""

import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from checker_cases import generic_wrong_answers

from course_lib.checks import CheckFailure
from course_lib.checks import ch08 as check


def update_ok(m, l, scores):
    m_new = torch.maximum(m, scores.amax(dim=1))
    return m_new, l * torch.exp(m - m_new) + torch.exp(scores - m_new[:, None]).sum(dim=1)


def update_numpy(m, l, scores):
    m, l, s = m.numpy(), l.numpy(), scores.numpy()
    m_new = np.maximum(m, s.max(axis=1))
    return m_new, l * np.exp(m - m_new) + np.exp(s - m_new[:, None]).sum(axis=1)


def update_no_rescale(m, l, scores):
    m_new = torch.maximum(m, scores.amax(dim=1))
    return m_new, l + torch.exp(scores - m_new[:, None]).sum(dim=1)


def update_unstable(m, l, scores):
    m_new = torch.maximum(m, scores.amax(dim=1))
    return m_new, (l * torch.exp(m) + torch.exp(scores).sum(dim=1)) / torch.exp(m_new)


def tiled_ok(q, k, v, block_size):
    scale = q.shape[-1] ** -0.5
    out = torch.empty(q.shape[0], v.shape[1], dtype=q.dtype)
    for i in range(0, q.shape[0], block_size):
        qb = q[i:i + block_size] * scale
        m = torch.full((qb.shape[0],), -math.inf, dtype=q.dtype)
        l = torch.zeros(qb.shape[0], dtype=q.dtype)
        acc = torch.zeros(qb.shape[0], v.shape[1], dtype=q.dtype)
        for j in range(0, k.shape[0], block_size):
            s = qb @ k[j:j + block_size].T
            m_new = torch.maximum(m, s.amax(dim=1))
            p, alpha = torch.exp(s - m_new[:, None]), torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=1)
            acc = acc * alpha[:, None] + p @ v[j:j + block_size]
            m = m_new
        out[i:i + block_size] = acc / l[:, None]
    return out


def tiled_full_grid(q, k, v, block_size):
    return torch.softmax(q @ k.T / math.sqrt(q.shape[1]), dim=-1) @ v


def tiled_drops_tail(q, k, v, block_size):
    n = (k.shape[0] // block_size) * block_size
    return tiled_ok(q, k[:n], v[:n], block_size)


def tiled_no_scale(q, k, v, block_size):
    return tiled_ok(q * math.sqrt(q.shape[1]), k, v, block_size)


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.online_update, update_ok),
    (check.tiled_forward, tiled_ok),
    (check.online_update, update_numpy),
    (check.tiled_forward, lambda q, k, v, b: (tiled_ok(q, k, v, b), None)),
    (check.tiled_forward, lambda q, k, v, b: tiled_ok(q, k, v, b).numpy()),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.online_update.hints[0]),
]


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "calls the course's own" feedback, not a pass.
REFERENCE_CALLS = [
    (check.tiled_forward, lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v)),
]


@pytest.mark.parametrize("wrong, words", [
    (update_no_rescale, "without rescaling"),
    (update_unstable, "overflows"),
    (lambda m, l, s: (s.amax(dim=1), l + torch.exp(s - s.amax(dim=1, keepdim=True)).sum(1)),
     "m_new|without rescaling"),  # both mistakes at once: the first case met names one
    (lambda m, l, s: (torch.maximum(m, s.amax(0)[:m.shape[0]]), l), "m_new"),
    (lambda m, l, s: update_ok(m, l, s)[0], "should return a pair"),
    (lambda m, l, s: (update_ok(m, l, s)[0], torch.full_like(l, math.nan)), "NaN"),
    (lambda m, l, s: (update_ok(m, l, s)[0], update_ok(m, l, s)[1][None]), "shape"),
])
def test_wrong_online_update(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.online_update(wrong)


@pytest.mark.parametrize("wrong, words", [
    (tiled_full_grid, "score grid"),
    (tiled_drops_tail, "shorter tile"),
    (tiled_no_scale, "1/√d"),
    (lambda q, k, v, b: tiled_ok(q, k, v, b)[:, :1], "shape"),
])
def test_wrong_tiled_forward(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.tiled_forward(wrong)


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no Triton")


STEPS = '''
@triton.jit
def step_ok(acc, l_i, m_i, qk, v):
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp(qk - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return acc, l_i, m_new

@triton.jit
def step_no_rescale(acc, l_i, m_i, qk, v):
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp(qk - m_new[:, None])
    return acc + tl.dot(p, v), l_i + tl.sum(p, 1), m_new

@triton.jit
def step_unstable(acc, l_i, m_i, qk, v):
    p = tl.exp(qk)
    return acc + tl.dot(p, v), l_i + tl.sum(p, 1), m_i

@triton.jit
def step_blank(acc, l_i, m_i, qk, v):
    raise NotImplementedError("rescale by alpha")
    return acc, l_i, m_i

@triton.jit
def step_pair(acc, l_i, m_i, qk, v):
    return acc, l_i
'''


@pytest.fixture(scope="module")
def tl_steps():
    """Learner-style Triton steps, defined the way the exercise notebook defines them."""
    import course_lib.flash as flash

    flash.prepare_triton(interpret=True, quiet=True)
    import triton
    import triton.language as tl

    if not flash.interpreter_ready():
        pytest.skip("triton was imported compiled (GPU) earlier in this process; the exercise "
                    "check needs it imported in interpreter mode")
    namespace = {"triton": triton, "tl": tl}   # Triton looks `tl` up in the function's globals
    exec(STEPS, namespace)
    names = ("ok", "no_rescale", "unstable", "blank", "pair")
    return {name: namespace[f"step_{name}"] for name in names}


@needs_triton
def test_triton_step_right_answer_passes(tl_steps, capsys):
    check.triton_inner_step(tl_steps["ok"])
    assert capsys.readouterr().out.startswith("✔")


@needs_triton
@pytest.mark.parametrize("name, words", [
    ("no_rescale", "differs"),
    ("unstable", "inf/NaN"),
    ("blank", r"not written yet. Hint: rescale by alpha"),
    ("pair", "raised"),
])
def test_triton_step_wrong_answers(tl_steps, name, words):
    with pytest.raises(CheckFailure, match=words):
        check.triton_inner_step(tl_steps[name])


@needs_triton
@pytest.mark.parametrize("wrong, words", [(None, "is None"),
                                          (update_ok, "decorate it with @triton.jit")])
def test_triton_step_not_a_kernel_function(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.triton_inner_step(wrong)


def test_triton_step_skips_cleanly_without_triton(monkeypatch, capsys):
    monkeypatch.setattr(check.flash, "triton_available", lambda: False)
    check.triton_inner_step(None)
    assert "skipped" in capsys.readouterr().out
