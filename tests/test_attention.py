"""course_lib.attention against PyTorch's own softmax and scaled_dot_product_attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import scaled_dot_product_attention, softmax
from course_lib.masks import as_additive, causal_mask, padding_mask

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}
NEG_INF = float("-inf")


def rand(*shape, dtype=torch.float32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def reference(q, k, v, mask=None, scale=None):
    """PyTorch's SDPA, plus the weights it does not return (computed the textbook way)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    s = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * s
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF) if mask.dtype == torch.bool else scores + mask
    return out, torch.softmax(scores, dim=-1)


def allowed_rows(mask, shape):
    """Boolean (..., n_q) of query rows that may attend to at least one key."""
    if mask is None:
        return torch.ones(shape[:-1], dtype=torch.bool)
    allowed = mask if mask.dtype == torch.bool else mask > NEG_INF
    return allowed.expand(shape).any(dim=-1)


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,dim", [((7,), -1), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4, 6), 1),
                                       ((2, 3, 4, 6), -1)])
def test_softmax_matches_torch(shape, dim, dtype):
    x = rand(*shape, dtype=dtype, seed=len(shape)) * 3
    torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim), **TOL[dtype])


@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_softmax_stable_for_large_logits(values):
    x = torch.tensor(values, dtype=torch.float64)
    w = softmax(x)
    assert torch.isfinite(w).all()
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(w, torch.softmax(x, dim=-1))


def test_softmax_extreme_logits_do_not_overflow():
    x = torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, -1e4]])
    torch.testing.assert_close(softmax(x), torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]))


def test_softmax_all_minus_inf_row_is_zeros_not_nan():
    x = torch.tensor([[NEG_INF, NEG_INF, NEG_INF], [0.0, NEG_INF, 0.0]], requires_grad=True)
    w = softmax(x)
    assert torch.equal(w.detach(), torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.5]]))
    (w * torch.arange(3.0)).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.equal(x.grad[0], torch.zeros(3))


def test_softmax_gradient_matches_torch():
    x = rand(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(softmax, (x,))
    upstream = rand(4, 6, dtype=torch.float64, seed=1)
    (g_ours,) = torch.autograd.grad((softmax(x) * upstream).sum(), x)
    (g_ref,) = torch.autograd.grad((torch.softmax(x, -1) * upstream).sum(), x)
    torch.testing.assert_close(g_ours, g_ref)


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([1, 2, 3]), "scores must be a floating-point tensor"),
    ([1.0, 2.0], "scores must be a torch.Tensor"),
])
def test_softmax_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        softmax(bad)


def test_softmax_rejects_dim_out_of_range():
    with pytest.raises(ValueError, match=r"dim=2 is out of range for scores of shape \(3, 4\)"):
        softmax(torch.zeros(3, 4), dim=2)
    with pytest.raises(ValueError, match=r"scores of shape \(3, 0\) have no entries along dim=-1"):
        softmax(torch.zeros(3, 0))


# ---------------------------------------------------------------- attention vs SDPA

shapes = st.tuples(
    st.lists(st.integers(1, 3), min_size=0, max_size=2),  # leading batch/head dims
    st.integers(1, 7), st.integers(1, 7),                  # n_q, n_k
    st.integers(1, 9), st.integers(1, 9),                  # d_k, d_v
)


@given(shapes, st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from(["none", "bool", "additive", "causal"]), st.integers(0, 2**16))
@settings(max_examples=80, deadline=None)
def test_matches_torch_sdpa(shape, dtype, mask_kind, seed):
    lead, n_q, n_k, d_k, d_v = shape
    q = rand(*lead, n_q, d_k, dtype=dtype, seed=seed)
    k = rand(*lead, n_k, d_k, dtype=dtype, seed=seed + 1)
    v = rand(*lead, n_k, d_v, dtype=dtype, seed=seed + 2)
    g = torch.Generator().manual_seed(seed + 3)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(*lead, n_q, n_k, generator=g) > 0.3
    elif mask_kind == "additive":
        mask = as_additive(torch.rand(n_q, n_k, generator=g) > 0.3, dtype=dtype)
    elif mask_kind == "causal":
        mask = causal_mask(n_q, n_k)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    ref_out, ref_weights = reference(q, k, v, mask)
    assert out.shape == (*lead, n_q, d_v) and weights.shape == (*lead, n_q, n_k)
    rows = allowed_rows(mask, weights.shape)
    torch.testing.assert_close(out[rows], ref_out[rows], **TOL[dtype])
    torch.testing.assert_close(weights[rows], ref_weights[rows], **TOL[dtype])
    # fully masked rows: exactly zero, never NaN
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (out[~rows] == 0).all() and (weights[~rows] == 0).all()


@pytest.mark.parametrize("scale", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_custom_scale(scale, dtype):
    q, k = rand(2, 5, 8, dtype=dtype), rand(2, 6, 8, dtype=dtype, seed=1)
    v = rand(2, 6, 3, dtype=dtype, seed=2)
    out, weights = scaled_dot_product_attention(q, k, v, scale=scale)
    ref_out, ref_weights = reference(q, k, v, scale=scale)
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    torch.testing.assert_close(weights, ref_weights, **TOL[dtype])


def test_default_scale_is_one_over_sqrt_dk():
    q, k, v = rand(3, 16), rand(4, 16, seed=1), rand(4, 2, seed=2)
    a, _ = scaled_dot_product_attention(q, k, v)
    b, _ = scaled_dot_product_attention(q, k, v, scale=0.25)
    torch.testing.assert_close(a, b)


def test_bool_and_additive_masks_agree():
    q, k, v = rand(2, 4, 5, 8), rand(2, 4, 6, 8, seed=1), rand(2, 4, 6, 3, seed=2)
    mask = padding_mask([4, 2], 6)[:, None]  # (2, 1, 1, 6)
    a = scaled_dot_product_attention(q, k, v, mask)
    b = scaled_dot_product_attention(q, k, v, as_additive(mask))
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_weights_are_a_distribution_with_no_exact_zero_unmasked():
    q, k, v = rand(3, 7, 16), rand(3, 9, 16, seed=1), rand(3, 9, 4, seed=2)
    _, w = scaled_dot_product_attention(q, k, v)
    assert (w > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 7))


def test_masked_weights_are_exact_zeros():
    q, k, v = rand(5, 4), rand(5, 4, seed=1), rand(5, 4, seed=2)
    _, w = scaled_dot_product_attention(q, k, v, causal_mask(5))
    assert torch.equal(w == 0, ~causal_mask(5))


def test_fully_masked_rows_give_zero_output_and_finite_grads():
    q, k, v = (rand(2, 3, 4, dtype=torch.float64, seed=s, requires_grad=True) for s in range(3))
    mask = padding_mask([3, 0], 3)  # second sequence: every key masked
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[1], torch.zeros(3, 4, dtype=torch.float64))
    assert torch.equal(w[1], torch.zeros(3, 3, dtype=torch.float64))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[1], torch.zeros(3, 4, dtype=torch.float64))


def test_large_logits_stay_finite():
    q = rand(4, 8) * 1e3
    k = rand(6, 8, seed=1) * 1e3
    v = rand(6, 2, seed=2)
    out, w = scaled_dot_product_attention(q, k, v)
    ref_out, _ = reference(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_gradients_match_sdpa_in_float64(mask_kind):
    q = rand(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    k = rand(2, 3, 6, 4, dtype=torch.float64, seed=1, requires_grad=True)
    v = rand(2, 3, 6, 3, dtype=torch.float64, seed=2, requires_grad=True)
    mask = {"none": None, "bool": causal_mask(5, 6),
            "additive": as_additive(causal_mask(5, 6), torch.float64)}[mask_kind]
    upstream = rand(2, 3, 5, 3, dtype=torch.float64, seed=3)
    ours = torch.autograd.grad((scaled_dot_product_attention(q, k, v, mask)[0] * upstream).sum(),
                               (q, k, v))
    ref = torch.autograd.grad((F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                               * upstream).sum(), (q, k, v))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


def test_gradcheck_with_mask():
    q = rand(3, 4, dtype=torch.float64, requires_grad=True)
    k = rand(5, 4, dtype=torch.float64, seed=1, requires_grad=True)
    v = rand(5, 2, dtype=torch.float64, seed=2, requires_grad=True)
    mask = padding_mask([3], 5)[0]  # (1, 5)
    assert torch.autograd.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask),
                                    (q, k, v))


def test_leading_dims_broadcast():
    q = rand(2, 4, 5, 8)         # (B, H, n_q, d_k)
    k = rand(1, 4, 6, 8, seed=1)  # shared over the batch
    v = rand(1, 4, 6, 3, seed=2)
    out, w = scaled_dot_product_attention(q, k, v)
    ref_out, ref_w = reference(q, k.expand(2, 4, 6, 8), v.expand(2, 4, 6, 3))
    torch.testing.assert_close(out, ref_out)
    assert w.shape == (2, 4, 5, 6)


# ---------------------------------------------------------------- bad input

Q, K, V = torch.zeros(2, 5, 64), torch.zeros(2, 6, 64), torch.zeros(2, 6, 16)


@pytest.mark.parametrize("args,kwargs,match", [
    ((Q, torch.zeros(2, 6, 32), V), {}, r"q has d_k=64 but k has d_k=32"),
    ((Q, K, torch.zeros(2, 7, 16)), {}, r"k has n_k=6 keys but v has 7 values"),
    ((Q, torch.zeros(2, 0, 64), torch.zeros(2, 0, 16)), {},
     r"k has shape \(2, 0, 64\), wanted at least one key"),
    ((Q.long(), K, V), {}, r"q must be a floating-point tensor.*int64"),
    ((Q, K.double(), V), {}, r"q is torch.float32, k is torch.float64"),
    ((Q, K, V.half()), {}, r"v is torch.float16"),
    ((torch.zeros(5), K, V), {}, r"q has shape \(5,\), wanted \(\.\.\., n_q, d_k\)"),
    (("q", K, V), {}, r"q must be a torch.Tensor, got str"),
    ((Q, torch.zeros(3, 6, 64), torch.zeros(3, 6, 16)), {},
     r"leading \(batch/head\) dims .* do not broadcast"),
    ((Q, K, V), {"mask": torch.ones(5, 7, dtype=torch.bool)},
     r"mask has shape \(5, 7\), wanted one that broadcasts to the scores' shape \(2, 5, 6\)"),
    ((Q, K, V), {"mask": torch.ones(3, 5, 6, dtype=torch.bool)}, r"mask has shape \(3, 5, 6\)"),
    ((Q, K, V), {"mask": torch.ones(5, 6, dtype=torch.long)},
     r"mask must be boolean .* got dtype torch.int64"),
    ((Q, K, V), {"mask": [[True]]}, r"mask must be a torch.Tensor"),
    ((Q, K, V), {"mask": torch.full((5, 6), float("nan"))}, r"NaN or \+inf"),
    ((Q, K, V), {"scale": 0.0}, r"scale must be a finite number > 0"),
    ((Q, K, V), {"scale": float("inf")}, r"scale must be a finite number > 0"),
    ((Q, K, V), {"scale": True}, r"scale must be a finite number > 0"),
])
def test_bad_input_raises_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(*args, **kwargs)
