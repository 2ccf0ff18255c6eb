"""course_lib.multihead against torch.nn.MultiheadAttention (batch_first) with copied weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.masks import causal_mask, padding_mask
from course_lib.multihead import MultiHeadAttention, merge_heads, split_heads

TOL = {torch.float32: dict(atol=1e-6, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def pair(d_model, num_heads, dtype, bias=True, seed=0):
    """A torch MHA with random weights (biases too) and ours loaded from it."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d_model, num_heads, batch_first=True, bias=bias).to(dtype)
    if bias:  # torch initialises biases to 0; random ones make the copy test meaningful
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    ours = MultiHeadAttention(d_model, num_heads, bias=bias).to(dtype).load_torch_weights(ref)
    return ours, ref


def rand(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def compare(ours, ref, q, k, v, mask=None, torch_mask=None, key_padding_mask=None,
            dtype=torch.float32):
    out, w = ours(q, k, v, mask=mask)
    ref_out, ref_w = ref(q, k, v, attn_mask=torch_mask, key_padding_mask=key_padding_mask,
                         average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    torch.testing.assert_close(w, ref_w, **TOL[dtype])
    return out, w


CASES = [(1, 3, 8, 1), (2, 5, 16, 4), (3, 7, 12, 3), (2, 1, 32, 8)]  # (batch, n, d_model, heads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,n,d_model,heads", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch(batch, n, d_model, heads, dtype, bias):
    ours, ref = pair(d_model, heads, dtype, bias=bias, seed=n)
    x = rand(batch, n, d_model, dtype=dtype, seed=1)
    out, w = compare(ours, ref, x, x, x, dtype=dtype)
    assert w.shape == (batch, heads, n, n)
    torch.testing.assert_close(ours(x)[0], out)  # key and value default to the query


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,n,d_model,heads", CASES)
def test_cross_attention_matches_torch(batch, n, d_model, heads, dtype):
    ours, ref = pair(d_model, heads, dtype, seed=2)
    q = rand(batch, n, d_model, dtype=dtype, seed=3)
    kv = rand(batch, n + 4, d_model, dtype=dtype, seed=4)
    v = rand(batch, n + 4, d_model, dtype=dtype, seed=5)
    _, w = compare(ours, ref, q, kv, v, dtype=dtype)
    assert w.shape == (batch, heads, n, n + 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,n,d_model,heads", CASES)
def test_causal_mask_matches_torch(batch, n, d_model, heads, dtype):
    ours, ref = pair(d_model, heads, dtype, seed=6)
    x = rand(batch, n, d_model, dtype=dtype, seed=7)
    mask = causal_mask(n)
    # torch's boolean attn_mask means True = NOT allowed: the opposite of ours
    _, w = compare(ours, ref, x, x, x, mask=mask, torch_mask=~mask, dtype=dtype)
    assert (w.masked_select(~mask) == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_padding_mask_matches_torch_key_padding_mask(dtype):
    ours, ref = pair(16, 4, dtype, seed=8)
    q, kv = rand(3, 4, 16, dtype=dtype, seed=9), rand(3, 6, 16, dtype=dtype, seed=10)
    lengths = [6, 2, 4]
    mask = padding_mask(lengths, 6)  # (3, 1, 6), True = real key
    compare(ours, ref, q, kv, kv, mask=mask, key_padding_mask=~mask[:, 0], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_head_mask_matches_torch_3d_attn_mask(dtype):
    batch, heads, n = 2, 4, 5
    ours, ref = pair(16, heads, dtype, seed=11)
    x = rand(batch, n, 16, dtype=dtype, seed=12)
    g = torch.Generator().manual_seed(13)
    mask = torch.rand(batch, heads, n, n, generator=g) < 0.7
    mask[..., 0] = True  # every query keeps one key (torch gives NaN for fully masked rows)
    # torch wants a 3-D mask as (batch * heads, n_q, n_k), True = blocked
    compare(ours, ref, x, x, x, mask=mask, torch_mask=~mask.reshape(batch * heads, n, n),
            dtype=dtype)


def test_additive_float_mask_matches_torch():
    ours, ref = pair(8, 2, torch.float64, seed=14)
    x = rand(2, 4, 8, dtype=torch.float64, seed=15)
    additive = torch.zeros(4, 4, dtype=torch.float64).masked_fill(~causal_mask(4), float("-inf"))
    additive[2, 0] = -1.5  # a finite bias is added to the score
    compare(ours, ref, x, x, x, mask=additive, torch_mask=additive, dtype=torch.float64)


def test_fully_masked_row_gives_zeros_not_nan():
    ours, _ = pair(8, 2, torch.float32)
    x = rand(1, 3, 8, dtype=torch.float32, seed=16)
    mask = causal_mask(3).clone()
    mask[1] = False
    out, w = ours(x, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (w[:, :, 1] == 0).all()


def test_gradients_match_torch():
    ours, ref = pair(12, 3, torch.float64, seed=17)
    x = rand(2, 5, 12, dtype=torch.float64, seed=18).requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    ours(x, mask=causal_mask(5))[0].pow(2).sum().backward()
    ref(x2, x2, x2, attn_mask=~causal_mask(5))[0].pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **TOL[torch.float64])
    torch.testing.assert_close(ours.q_proj.weight.grad, ref.in_proj_weight.grad[:12],
                               **TOL[torch.float64])


@pytest.mark.parametrize("batch,n,d,h", [(1, 1, 4, 1), (2, 3, 12, 3), (3, 5, 16, 8)])
def test_split_merge_round_trip(batch, n, d, h):
    x = rand(batch, n, d, dtype=torch.float32, seed=19)
    s = split_heads(x, h)
    assert s.shape == (batch, h, n, d // h)
    i, w = 1 % h, d // h
    torch.testing.assert_close(s[:, i, :, :], x[..., i * w:(i + 1) * w])
    torch.testing.assert_close(merge_heads(s), x)


def test_equal_to_looping_over_heads():
    """Multi-head = each head's attention on its slice of Q, K, V, concatenated, then W_O."""
    ours, _ = pair(12, 3, torch.float64, seed=20)
    x = rand(2, 4, 12, dtype=torch.float64, seed=21)
    q, k, v = ours.q_proj(x), ours.k_proj(x), ours.v_proj(x)
    heads = []
    for i in range(3):
        sl = slice(4 * i, 4 * i + 4)
        w = torch.softmax(q[..., sl] @ k[..., sl].transpose(-2, -1) / 2.0, dim=-1)
        heads.append(w @ v[..., sl])
    torch.testing.assert_close(ours(x)[0], ours.out_proj(torch.cat(heads, dim=-1)))


# ---------------------------------------------------------------- bad input

def test_d_model_not_divisible():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(8, 0)


@pytest.mark.parametrize("bad_shape", [(5, 5), (4, 4, 4), (2, 3, 4, 4), (2, 4, 5)])
def test_bad_mask_shapes(bad_shape):
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"mask has shape \(" + ", ".join(map(str, bad_shape))):
        mha(x, mask=torch.ones(bad_shape, dtype=torch.bool))


@pytest.mark.parametrize("good_shape", [(4, 4), (2, 4, 4), (2, 1, 4), (1, 4), (4,), (2, 2, 4, 4),
                                        (1, 1, 1, 4), (2, 1, 4, 4), (1, 2, 1, 4)])
def test_every_broadcastable_mask_shape_masks(good_shape):
    """Each accepted mask shape is applied, broadcast the way its shape says: the result equals
    torch's SDPA on the same heads with the mask expanded by hand to (batch, heads, n_q, n_k)."""
    batch, heads, n, d_model = 2, 2, 4, 8
    mha = MultiHeadAttention(d_model, heads)
    x = rand(batch, n, d_model, dtype=torch.float32, seed=22)
    mask = torch.rand(good_shape, generator=torch.Generator().manual_seed(23)) < 0.5
    mask[..., 0] = True  # every query keeps a key (SDPA gives NaN for fully masked rows)
    mask[..., -1] = False  # and loses one, so a mask that were ignored would show
    out, w = mha(x, mask=mask)
    full = (mask[:, None] if mask.dim() == 3 else mask).expand(batch, heads, n, n)
    assert not full.all() and (w.masked_select(~full) == 0).all()
    q, k, v = (split_heads(p(x), heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    heads_out = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    torch.testing.assert_close(out, mha.out_proj(merge_heads(heads_out)), **TOL[torch.float32])


def test_bad_mask_dtype():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="mask must be boolean.*got dtype torch.int64.*mask.bool"):
        mha(torch.randn(1, 3, 8), mask=torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="mask must be a torch.Tensor"):
        mha(torch.randn(1, 3, 8), mask=[[True] * 3] * 3)


def test_bad_inputs():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError,
                       match=r"query has shape \(3, 8\), wanted \(batch, n, d_model=8\)"):
        mha(torch.randn(3, 8))
    with pytest.raises(ValueError, match=r"key has shape \(1, 3, 6\)"):
        mha(torch.randn(1, 3, 8), torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match="one value per key"):
        mha(torch.randn(1, 3, 8), torch.randn(1, 3, 8), torch.randn(1, 4, 8))
    with pytest.raises(ValueError, match="query has batch 2 but key has batch 1"):
        mha(torch.randn(2, 3, 8), torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="dtype"):
        mha(torch.ones(1, 3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="query has dtype torch.float64 but this module's "
                                         "weights are torch.float32"):
        mha(torch.ones(1, 3, 8, dtype=torch.float64))


def test_load_torch_weights_rejects_mismatches():
    with pytest.raises(ValueError, match="embed_dim=8, num_heads=4"):
        MultiHeadAttention(8, 2).load_torch_weights(nn.MultiheadAttention(8, 4))
    with pytest.raises(ValueError, match="bias"):
        MultiHeadAttention(8, 2, bias=False).load_torch_weights(nn.MultiheadAttention(8, 2))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention(8, 2).load_torch_weights(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="torch.nn.MultiheadAttention"):
        MultiHeadAttention(8, 2).load_torch_weights(nn.Linear(8, 8))


# ---------------------------------------------------------------- one route: positions and cache

B = H = 4  # batch == heads: a 3-d mask put on the head axis would go unnoticed by the shapes
N, D = 6, 16


def _mask_of(shape, seed):
    """A random bool mask of `shape` (dims of size B, H or N) whose diagonal is always open."""
    m = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    if shape[-2] == N:  # no fully masked row, so torch's SDPA (NaN there) can be the reference
        m = m | torch.eye(N, dtype=torch.bool)
    else:
        m[..., 0] = True
    return m


MASK_SHAPES = [None, (N, N), (B, N, N), (B, 1, N), (1, N, N), (B, 1, N, N), (B, H, N, N),
               (1, H, N, N), (B, 1, 1, N), "additive"]


def _mask(kind, seed=7):
    if kind is None:
        return None
    if kind == "additive":  # float 0/-inf with finite biases, (B, n_q, n_k)
        m = _mask_of((B, N, N), seed)
        return torch.where(m, rand(B, N, N, dtype=torch.float32, seed=seed), -torch.inf)
    return _mask_of(kind, seed)


def _rows(mask, q0, q1, k1):
    """The part of `mask` for queries q0..q1-1 over keys 0..k1-1 (size-1 dims stay)."""
    if mask is None:
        return None
    rows = slice(q0, q1) if mask.shape[-2] != 1 else slice(None)
    return mask[..., rows, :k1]


def _reference(mha, x, mask, positions=None):
    """The formula by hand: projections, heads, RoPE on q and k, torch's SDPA, W_O."""
    from course_lib.position import apply_rope
    b, n, _ = x.shape
    q, k, v = (p(x).view(b, n, H, D // H).transpose(1, 2)
               for p in (mha.q_proj, mha.k_proj, mha.v_proj))  # (B, h, n, d_head)
    if positions is not None:
        at = positions[:, None] if positions.dim() == 2 else positions
        q, k = apply_rope(q, at), apply_rope(k, at)
    if mask is not None and mask.dim() == 3:
        mask = mask[:, None]  # (B, 1, n_q, n_k): one mask per sequence, every head
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return mha.out_proj(heads.transpose(1, 2).reshape(b, n, D))


def _positions(kind):
    if kind == "none":
        return None
    if kind == "arange":
        return torch.arange(N)
    return torch.stack([torch.arange(N) + 3 * b for b in range(B)])  # (B, n): own offsets


@pytest.mark.parametrize("mask_kind", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("pos_kind", ["none", "arange", "per_sequence"])
def test_forward_with_positions_equals_the_formula_for_every_mask_shape(mask_kind, pos_kind):
    torch.manual_seed(11)
    mha = MultiHeadAttention(D, H).eval()
    x, mask, positions = rand(B, N, D, dtype=torch.float32, seed=12), _mask(mask_kind), \
        _positions(pos_kind)
    with torch.no_grad():
        got, w = mha(x, mask=mask, positions=positions)
        want = _reference(mha, x, mask, positions)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if mask is not None and mask.dtype == torch.bool:  # a blocked key gets exactly no weight
        full = mask[:, None] if mask.dim() == 3 else mask
        assert float(w.masked_fill(full, 0).abs().max()) == 0.0


@pytest.mark.parametrize("mask_kind", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("pos_kind", ["none", "per_sequence"])
def test_forward_with_a_cache_equals_recomputing_the_prefix(mask_kind, pos_kind):
    """Prefill 2 tokens, then 1 at a time: each step's rows equal attention over the prefix."""
    from course_lib.models.transformer import KVCache
    torch.manual_seed(13)
    mha = MultiHeadAttention(D, H).eval()
    x, mask, positions = rand(B, N, D, dtype=torch.float32, seed=14), _mask(mask_kind), \
        _positions(pos_kind)
    cache = KVCache(1, B, H, N, D // H)
    with torch.no_grad():
        for q0, q1 in [(0, 2), *((t, t + 1) for t in range(2, N))]:
            at = None if positions is None else positions[:, q0:q1]
            got, w = mha(x[:, q0:q1], mask=_rows(mask, q0, q1, q1), positions=at, cache=cache)
            cache.advance(q1 - q0)
            assert w.shape == (B, H, q1 - q0, q1)
            prefix = None if positions is None else positions[:, :q1]
            want = _reference(mha, x[:, :q1], _rows(mask, 0, q1, q1), prefix)[:, q0:q1]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_3d_mask_is_per_sequence_like_torch_repeated_per_head():
    """torch's 3-d attn_mask is (B*heads, n, n); ours is (B, n, n), the same for every head."""
    ours, ref = pair(D, H, torch.float32, seed=15)
    x = rand(B, N, D, dtype=torch.float32, seed=16)
    m3 = _mask_of((B, N, N), 17)
    compare(ours, ref, x, x, x, mask=m3, torch_mask=~m3.repeat_interleave(H, dim=0))
    with torch.no_grad():  # positions 0 turn nothing: the same route, the same answer
        torch.testing.assert_close(ours(x, mask=m3, positions=torch.zeros(B, N))[0],
                                   ours(x, mask=m3)[0])


def test_positions_and_cache_are_checked():
    from course_lib.models.transformer import KVCache
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, N, D)
    with pytest.raises(ValueError, match=r"positions has shape \(5,\), wanted \(6,\) or"):
        mha(x, positions=torch.arange(5))
    with pytest.raises(ValueError, match="positions must be integers or real"):
        mha(x, positions=torch.ones(N, dtype=torch.bool))
    with pytest.raises(ValueError, match="as many keys as queries, got n_q=6 and n_k=3"):
        mha(x, torch.randn(B, 3, D), positions=torch.arange(N))
    with pytest.raises(ValueError, match="d_head = d_model / num_heads = 3 is odd"):
        MultiHeadAttention(6, 2)(torch.randn(1, 2, 6), positions=torch.arange(2))
    cache = KVCache(1, B, H, 2 * N, D // H)
    mha(x, cache=cache)
    cache.advance(N)
    with pytest.raises(ValueError, match=r"mask has shape \(1, 6\), wanted \(n_q, n_k\)=\(1, 7\)"):
        mha(x[:, :1], mask=torch.ones(1, N, dtype=torch.bool), cache=cache)  # 6 cached + 1 new
