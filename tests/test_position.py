"""Tests for course_lib.position: sinusoidal positions and rotary embeddings (RoPE).

RoPE has no PyTorch reference, so it is checked against two direct formulations written out here
independently: complex multiplication (torch.view_as_complex) and an explicit block-diagonal
rotation matrix.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from course_lib.position import apply_rope, frequencies, sinusoidal_positions

TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=2e-5, rtol=1e-5),
       torch.bfloat16: dict(atol=3e-2, rtol=2e-2), torch.float16: dict(atol=4e-3, rtol=2e-3)}


# ---------------------------------------------------------------- sinusoidal positions

def _sinusoidal_loop(n, d):
    """The formula of Vaswani et al. written with Python floats, one entry at a time."""
    table = torch.empty(n, d, dtype=torch.float64)
    for pos in range(n):
        for col in range(d):
            i = col // 2
            angle = pos / 10000 ** (2 * i / d)
            table[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return table


@pytest.mark.parametrize("n,d", [(1, 2), (7, 4), (16, 10), (50, 64), (9, 5), (3, 1)])
def test_sinusoidal_matches_the_formula(n, d):
    table = sinusoidal_positions(n, d)
    assert table.shape == (n, d) and table.dtype == torch.float32
    assert_close(table.double(), _sinusoidal_loop(n, d), atol=1e-6, rtol=0)


def test_sinusoidal_row_zero_and_range():
    table = sinusoidal_positions(100, 16)
    assert_close(table[0], torch.tensor([0.0, 1.0] * 8))
    assert table.abs().max() <= 1.0


@pytest.mark.parametrize("d", [8, 32])
def test_sinusoidal_dot_product_depends_on_distance_only(d):
    # sin a sin b + cos a cos b = cos(a - b): PE[m] . PE[n] = sum_i cos((m - n) theta_i)
    table = sinusoidal_positions(60, d).double()
    dots = table @ table.T
    theta = frequencies(d, dtype=torch.float64)
    for m, n in [(3, 0), (40, 37), (10, 25), (59, 44)]:
        want = torch.cos((m - n) * theta).sum()
        assert_close(dots[m, n], want, atol=1e-6, rtol=0)
    assert_close(dots[5, 2], dots[50, 47], atol=1e-6, rtol=0)
    assert_close(torch.diagonal(dots), torch.full((60,), d / 2, dtype=torch.float64), atol=1e-6,
                 rtol=0)


def test_sinusoidal_zero_rows():
    assert sinusoidal_positions(0, 4).shape == (0, 4)


@pytest.mark.parametrize("n,d,arg", [(-1, 4, "n"), (4, 0, "d"), (4.0, 4, "n"), (4, 2.5, "d"),
                                     (True, 4, "n"), (4, "8", "d")])
def test_sinusoidal_bad_input(n, d, arg):
    with pytest.raises(ValueError, match=rf"^{arg} must be (an|a positive) integer"):
        sinusoidal_positions(n, d)


# ---------------------------------------------------------------- RoPE: reference formulations

def _rope_complex(x, positions, base=10000.0):
    """Pair (x[2i], x[2i+1]) as the complex number x[2i] + j x[2i+1], times exp(j pos theta_i)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[..., None] * theta  # (..., n, d/2)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = z * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(rotated).reshape(*rotated.shape[:-1], d)


def _rotation_matrix(pos, d, base=10000.0):
    """The d x d block-diagonal matrix with one 2x2 rotation by pos * theta_i per pair."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        a = pos * base ** (-2 * i / d)
        c, s = math.cos(a), math.sin(a)
        R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return R


@pytest.mark.parametrize("shape", [(5, 2), (3, 7, 8), (2, 4, 9, 16), (1, 1, 33, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1])
def test_rope_matches_complex_formulation(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    got = apply_rope(x)
    assert got.shape == x.shape and got.dtype == dtype
    want = _rope_complex(x, torch.arange(shape[-2]))
    assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("base", [10000.0, 500.0, 1e6])
def test_rope_matches_rotation_matrices(base):
    g = torch.Generator().manual_seed(3)
    n, d = 12, 10
    positions = torch.randint(0, 2000, (n,), generator=g)
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    want = torch.stack([_rotation_matrix(int(p), d, base) @ x[i] for i, p in enumerate(positions)])
    assert_close(apply_rope(x, positions, base=base), want, atol=1e-9, rtol=1e-9)


def test_rope_positions_default_to_arange_and_zero_is_identity():
    x = torch.randn(2, 3, 6, 8)
    assert_close(apply_rope(x), apply_rope(x, torch.arange(6)))
    assert_close(apply_rope(x, [0] * 6), x)


def test_rope_per_sequence_positions_broadcast_over_heads():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 5, 8, generator=g)  # (batch, heads, n, d)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])[:, None, :]  # (batch, 1, n)
    got = apply_rope(x, positions)
    for b in range(2):
        assert_close(got[b], apply_rope(x[b], positions[b, 0]))
    assert_close(got.double(), _rope_complex(x, positions), **TOL[torch.float32])


def test_rope_float_positions_match_complex():
    x = torch.randn(4, 6, dtype=torch.float64)
    positions = torch.tensor([0.5, 1.25, 3.0, 10.75])
    assert_close(apply_rope(x, positions), _rope_complex(x, positions))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_preserves_norms(dtype):
    x = torch.randn(3, 40, 32, dtype=dtype)
    assert_close(apply_rope(x).norm(dim=-1), x.norm(dim=-1), **TOL[dtype])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rope_score_depends_only_on_offset(seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 16, dtype=torch.float64, generator=g)

    def score(m, n):
        return float(apply_rope(q, [m]) @ apply_rope(k, [n]).T)

    for m, n in [(5, 2), (0, 9), (30, 30)]:
        for shift in (1, 17, 1000):
            assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-9)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)  # the offset does matter


def test_rope_gradient_is_the_transposed_rotation():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 4, dtype=torch.float64)
    (apply_rope(x) * upstream).sum().backward()
    want = torch.stack([_rotation_matrix(p, 4).T @ upstream[p] for p in range(3)])
    assert_close(x.grad, want)


@pytest.mark.parametrize("x,match", [
    (torch.randn(4, 7), r"d=7 .*must be even"),
    (torch.randn(4, 0), r"d=0 .*must be even"),
    (torch.randn(8), r"x has shape \(8,\), wanted \(\.\.\., n, d\)"),
    (torch.ones(4, 8, dtype=torch.long), r"floating-point"),
    ([[1.0, 2.0]], r"x must be a torch.Tensor"),
])
def test_rope_bad_x(x, match):
    with pytest.raises(ValueError, match=match):
        apply_rope(x)


@pytest.mark.parametrize("positions,match", [
    (torch.arange(5), r"positions has shape \(5,\) but x has shape \(2, 6, 8\)"),
    (torch.zeros(3, 6), r"positions has shape \(3, 6\), which does not broadcast"),
    (torch.zeros(1, 2, 6), r"positions has shape \(1, 2, 6\) but x has shape"),
    (torch.tensor(3), r"positions has shape \(\)"),
    (torch.ones(6, dtype=torch.bool), r"integers or real numbers"),
    ("abc", r"positions must be a tensor of numbers"),
])
def test_rope_bad_positions(positions, match):
    with pytest.raises(ValueError, match=match):
        apply_rope(torch.randn(2, 6, 8), positions)


@pytest.mark.parametrize("base", [1.0, 0.5, -3, float("nan"), float("inf"), "10000"])
def test_rope_bad_base(base):
    with pytest.raises(ValueError, match="base must be a finite number > 1"):
        apply_rope(torch.randn(3, 4), base=base)
