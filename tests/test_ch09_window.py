"""Chapter 09's sliding window: the mask, and tiled attention that skips blocks outside it."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from course_lib.flash import tiled_attention
from course_lib.masks import causal_mask, sliding_window_mask


def test_mask_is_the_definition():
    for n_q, window, n_k in [(5, 2, None), (7, 1, None), (6, 10, None), (4, 3, 9)]:
        m = sliding_window_mask(n_q, window, n_k)
        i = torch.arange(n_q)[:, None]
        j = torch.arange(n_k or n_q)[None, :]
        assert m.dtype == torch.bool and torch.equal(m, (i - j >= 0) & (i - j < window))
    assert torch.equal(sliding_window_mask(6, 6), causal_mask(6))
    assert torch.equal(sliding_window_mask(3, 1), torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tiled_window_equals_sdpa_with_the_same_mask(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 200, (1,), generator=g))
    window = int(torch.randint(1, n + 5, (1,), generator=g))
    block = [4, 16, 32, 64][seed]
    heads = int(torch.randint(1, 4, (1,), generator=g))
    d = int(torch.randint(1, 33, (1,), generator=g))
    q, k, v = (torch.randn(2, heads, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    out, lse = tiled_attention(q, k, v, window=window, block_size=block)
    mask = sliding_window_mask(n, window)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, want)
    scores = (q @ k.transpose(-2, -1)) * d ** -0.5
    want_lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(lse, want_lse.float())


@pytest.mark.parametrize("window, block", [(1, 16), (3, 16), (16, 16), (17, 16), (5, 64)])
def test_fully_masked_tiles_give_no_nan(window, block):
    # rows whose window starts after a visited tile see a fully masked tile there
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 70, 8, generator=g) * 30 for _ in range(3))   # large logits too
    out, _ = tiled_attention(q, k, v, window=window, block_size=block)
    assert torch.isfinite(out).all()
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                          attn_mask=sliding_window_mask(70, window))
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4)


def _flops(n, **kwargs):
    x = torch.zeros(1, 1, n, 16, device="meta")
    with FlopCounterMode(display=False) as counter:
        tiled_attention(x, x, x, block_size=32, **kwargs)
    return counter.get_total_flops()


def test_blocks_outside_the_window_are_never_computed():
    # work per query is bounded by the window: linear in n, and exactly the visited tiles
    for n in (256, 512, 1024):
        blocks = 0
        for start_m in range(0, n, 32):
            lo = max(0, start_m - 64 + 1) // 32 * 32
            blocks += len(range(lo, start_m + 32, 32))
        assert _flops(n, window=64) == blocks * 2 * (2 * 32 * 32 * 16)
    assert _flops(2048, window=64) / _flops(1024, window=64) < 2.05   # x2 per doubling
    assert _flops(1024, causal=True) > 5 * _flops(1024, window=64)


def test_window_gradients_match_sdpa():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 1, 40, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    out, _ = tiled_attention(q, k, v, window=5, block_size=8)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(40, 5))
    want = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b)


def test_bad_windows_name_the_argument():
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(4, 0)
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(4, 2.5)
    q = torch.randn(1, 8, 4)
    with pytest.raises(ValueError, match="window.*0"):
        tiled_attention(q, q, q, window=0)
    with pytest.raises(ValueError, match=r"as many queries as keys.*\(1, 3, 4\)"):
        tiled_attention(torch.randn(1, 3, 4), q, q, window=2)
