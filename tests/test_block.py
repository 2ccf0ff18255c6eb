"""TransformerBlock against torch.nn.TransformerEncoderLayer with copied weights."""

import pytest
import torch
from torch import nn

from course_lib.masks import causal_mask
from course_lib.models import TransformerBlock


def _pair(d_model, num_heads, d_mlp, seed, dtype=torch.float32):
    torch.manual_seed(seed)
    theirs = nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=d_mlp, dropout=0.0,
                                        activation="gelu", batch_first=True, norm_first=True)
    with torch.no_grad():  # LayerNorms start at (1, 0): make them matter
        for norm in (theirs.norm1, theirs.norm2):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    theirs = theirs.to(dtype).eval()
    ours = TransformerBlock(d_model, num_heads, d_mlp).to(dtype).load_torch_weights(theirs)
    return ours, theirs


@pytest.mark.parametrize("batch,n,d_model,num_heads,d_mlp,seed", [
    (1, 1, 8, 1, 16, 0), (2, 7, 16, 4, 64, 1), (3, 12, 24, 3, 40, 2), (2, 33, 64, 8, 256, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_equals_torch_encoder_layer(batch, n, d_model, num_heads, d_mlp, seed, causal):
    ours, theirs = _pair(d_model, num_heads, d_mlp, seed)
    x = torch.randn(batch, n, d_model)
    mask = causal_mask(n) if causal else None
    with torch.no_grad():
        want = theirs(x, src_mask=None if mask is None else ~mask)  # torch: True = blocked
        got = ours(x, mask=mask)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert ours.weights.shape == (batch, num_heads, n, n)
    if causal and n > 1:  # the mask reached the scores: no weight above the diagonal
        assert float(ours.weights.triu(1).abs().max()) == 0.0


def test_block_equals_torch_in_float64_and_gradients_match():
    ours, theirs = _pair(16, 2, 32, seed=4, dtype=torch.float64)
    x = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    mask = causal_mask(9)
    theirs.train()  # no fast path: the plain autograd graph
    (g_theirs,) = torch.autograd.grad(theirs(x, src_mask=~mask).square().sum(), x)
    (g_ours,) = torch.autograd.grad(ours(x, mask=mask).square().sum(), x)
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-10, rtol=1e-8)


def test_a_causal_block_does_not_leak_the_future():
    torch.manual_seed(5)
    block = TransformerBlock(16, 4, 32).eval()
    x = torch.randn(1, 10, 16)
    y = x.clone()
    y[0, 6:] = torch.randn(4, 16)  # change tokens 6..9
    with torch.no_grad():
        a, b = block(x, causal_mask(10)), block(y, causal_mask(10))
    torch.testing.assert_close(a[0, :6], b[0, :6])
    assert not torch.allclose(a[0, 6:], b[0, 6:])


def test_the_residual_stream_is_kept():
    """With both sub-layers' output maps zeroed, the block is the identity (pre-LN, x + ...)."""
    block = TransformerBlock(8, 2, 16)
    with torch.no_grad():
        for linear in (block.attn.out_proj, block.mlp[2]):
            linear.weight.zero_()
            linear.bias.zero_()
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(block(x), x)


@pytest.mark.parametrize("args,match", [
    ((8, 3, 16), "d_model=8 is not divisible by num_heads=3"),
    ((8, 2, 0), "d_mlp"),
    ((0, 2, 16), "d_model"),
    ((8, 2, 16.0), "d_mlp"),
])
def test_bad_arguments_name_themselves(args, match):
    with pytest.raises(ValueError, match=match):
        TransformerBlock(*args)


def test_bad_input_and_bad_torch_layers_are_refused():
    block = TransformerBlock(8, 2, 16)
    with pytest.raises(ValueError, match=r"x has shape \(2, 5, 4\), wanted \(batch, n, d_model=8"):
        block(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="TransformerEncoderLayer"):
        block.load_torch_weights(nn.Linear(8, 8))
    post_ln = nn.TransformerEncoderLayer(8, 2, 16, activation="gelu", batch_first=True)
    with pytest.raises(ValueError, match="norm_first=False"):
        block.load_torch_weights(post_ln)
    relu = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=True)
    with pytest.raises(ValueError, match="activation"):
        block.load_torch_weights(relu)
    wide = nn.TransformerEncoderLayer(8, 2, 32, activation="gelu", batch_first=True,
                                      norm_first=True)
    with pytest.raises(ValueError, match=r"dim_feedforward\)=\(8, 2, 32\)"):
        block.load_torch_weights(wide)


def test_grouped_key_value_heads_equal_sdpa_with_enable_gqa():
    torch.manual_seed(6)
    block = TransformerBlock(32, 8, 64, num_kv_heads=2).eval()
    assert block.attn.k_proj.out_features == 2 * 4  # g heads of d_head = 4
    x = torch.randn(2, 9, 32)
    h = block.ln1(x)
    q = block.attn.q_proj(h).view(2, 9, 8, 4).transpose(1, 2)
    k = block.attn.k_proj(h).view(2, 9, 2, 4).transpose(1, 2)
    v = block.attn.v_proj(h).view(2, 9, 2, 4).transpose(1, 2)
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=True)
    mid = x + block.attn.out_proj(heads.transpose(1, 2).reshape(2, 9, 32))
    want = mid + block.mlp(block.ln2(mid))
    with torch.no_grad():
        torch.testing.assert_close(block(x, causal_mask(9)), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="num_kv_heads"):
        TransformerBlock(32, 8, 64, num_kv_heads=3)


def test_a_3d_padding_mask_means_the_same_with_positions_and_a_cache():
    """Issue 24: with batch == heads, a (B, n_q, n_k) mask must stay on the batch axis whether
    or not positions or a cache come along (the block once had a second route that forgot)."""
    from course_lib.models.transformer import KVCache
    torch.manual_seed(8)
    batch = heads = 4
    block = TransformerBlock(16, heads, 32).eval()
    x = torch.randn(batch, 6, 16)
    real = torch.arange(6)[None, :] < torch.tensor([6, 4, 3, 1])[:, None]  # (B, n_k)
    m3 = (causal_mask(6)[None] & real[:, None, :]) | torch.eye(6, dtype=torch.bool)  # (B, 6, 6)
    with torch.no_grad():
        plain = block(x, m3)
        w_plain = block.weights
        rotated_by_nothing = block(x, m3, positions=torch.zeros(batch, 6, dtype=torch.long))
        cached = block(x, m3, cache=KVCache(1, batch, heads, 6, 4))
    torch.testing.assert_close(rotated_by_nothing, plain)
    torch.testing.assert_close(cached, plain)
    padded = ~m3[:, None].expand_as(w_plain)  # no weight at all on a blocked (padded) key
    assert float(block.weights[padded].abs().max()) == 0.0 == float(w_plain[padded].abs().max())
