"""tiled_attention and naive_attention against torch's scaled_dot_product_attention."""

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.flash import naive_attention, tiled_attention
from course_lib.measure import peak_bytes

TOL = {torch.float64: (1e-10, 1e-8), torch.float32: (2e-5, 1e-4),
       torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.5e-2, 1.5e-2)}


def reference(q, k, v, causal=False, scale=None):
    """SDPA in float64 (or float32) as the truth, plus the row log-sum-exp of the scaled scores."""
    wide = torch.float64
    q, k, v = q.to(wide), k.to(wide), v.to(wide)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return out, torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("shape", [(1, 1, 1, 16), (2, 3, 17, 32), (1, 2, 100, 64), (3, 130, 8),
                                   (64, 16)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [16, 64, 512])
def test_tiled_matches_sdpa(shape, causal, block_size):
    torch.manual_seed(sum(shape) + block_size)
    q, k, v = (torch.randn(shape) for _ in range(3))
    out, lse = tiled_attention(q, k, v, causal=causal, block_size=block_size)
    want, want_lse = reference(q, k, v, causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    torch.testing.assert_close(out, want.float(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, want_lse.float(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_tiled_dtypes(dtype):
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, 75, 32, dtype=dtype) for _ in range(3))
    out, _ = tiled_attention(q, k, v, causal=True, block_size=32)
    want, _ = reference(q, k, v, causal=True)
    assert out.dtype == dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, want.to(dtype), atol=atol, rtol=rtol)


def test_tiled_cross_attention_and_value_width():
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 40, 16), torch.randn(2, 90, 16), torch.randn(2, 90, 24)
    out, _ = tiled_attention(q, k, v, block_size=32, scale=0.3)
    want, _ = reference(q, k, v, scale=0.3)
    assert out.shape == (2, 40, 24)
    torch.testing.assert_close(out, want.float(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("big", [1e4, -1e4])
def test_tiled_stable_for_huge_logits(big):
    torch.manual_seed(5)
    q = torch.randn(1, 50, 16, dtype=torch.float64)
    k = torch.randn(1, 50, 16, dtype=torch.float64) * big
    v = torch.randn(1, 50, 16, dtype=torch.float64)
    out, lse = tiled_attention(q, k, v, causal=True, block_size=16)
    want, want_lse = reference(q, k, v, causal=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out, want, atol=1e-8, rtol=1e-6)


def test_naive_matches_sdpa():
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 3, 33, 16) for _ in range(3))
    for causal in (False, True):
        want, _ = reference(q, k, v, causal)
        torch.testing.assert_close(naive_attention(q, k, v, causal=causal), want.float(),
                                   atol=2e-5, rtol=1e-4)


def test_tiled_never_builds_the_grid():
    """Peak extra memory stays far below one n x n grid; the naive version needs two."""
    torch.manual_seed(7)
    n, d = 1024, 64
    q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
    grid = n * n * 4
    naive = peak_bytes(lambda: naive_attention(q, k, v))
    tiled = peak_bytes(lambda: tiled_attention(q, k, v, block_size=64))
    assert naive >= 2 * grid
    assert 0 < tiled < grid / 8


@pytest.mark.parametrize("args, match", [
    ((torch.randn(4, 8), torch.randn(4, 6), torch.randn(4, 6)), r"q has d_k=8 but k has d_k=6"),
    ((torch.randn(2, 4, 8), torch.randn(3, 4, 8), torch.randn(3, 4, 8)),
     r"leading .* do not broadcast"),
    ((torch.randn(4, 8), torch.randn(5, 8), torch.randn(6, 8)), r"k has n_k=5 keys but v has 6"),
    ((torch.randn(4, 8), torch.randn(4, 8).double(), torch.randn(4, 8)), r"share one dtype"),
    ((torch.randn(8), torch.randn(4, 8), torch.randn(4, 8)),
     r"q has shape \(8,\), wanted \(\.\.\., n_q, d_k\)"),
    ((torch.ones(4, 8, dtype=torch.long),) * 3, r"floating-point"),
    (([[1.0]], torch.randn(4, 8), torch.randn(4, 8)), r"q must be a torch.Tensor, got list"),
    ((torch.randn(0, 8), torch.randn(4, 8), torch.randn(4, 8)), r"at least one query"),
])
def test_tiled_rejects_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        tiled_attention(*args)


@pytest.mark.parametrize("attention", [tiled_attention, naive_attention])
def test_leading_dims_broadcast_like_sdpa(attention):
    """The course's one rule for q, k, v: leading (batch/head) dims broadcast, as in SDPA."""
    torch.manual_seed(4)
    q = torch.randn(2, 3, 20, 16)
    k, v = torch.randn(1, 3, 24, 16), torch.randn(1, 3, 24, 8)   # shared over the batch
    out = attention(q, k, v, causal=False)
    out = out[0] if isinstance(out, tuple) else out
    want = F.scaled_dot_product_attention(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1))
    assert out.shape == (2, 3, 20, 8)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)


def test_tiled_rejects_bad_options():
    q = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"causal=True needs as many queries as keys, got n_q=4"):
        tiled_attention(q, torch.randn(5, 8), torch.randn(5, 8), causal=True)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            tiled_attention(q, q, q, block_size=bad)
    for bad in (0.0, -1.0, math.nan, "0.1"):
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            tiled_attention(q, q, q, scale=bad)


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_gradients_match_sdpa(causal):
    """Plain torch all the way, so autograd differentiates it (the running max is a detached
    shift, which the softmax does not depend on)."""
    torch.manual_seed(9)
    q, k, v = (torch.randn(2, 3, 70, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, _ = tiled_attention(q, k, v, causal=causal, block_size=16)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                               (q, k, v), dout)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-8)
