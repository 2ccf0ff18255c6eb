"""Chapter 09's shared keys and values: grouped-query attention against PyTorch's enable_gqa, the
smaller projections of MultiHeadAttention(num_kv_heads=g), and TinyTransformer's smaller cache."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import grouped_query_attention, scaled_dot_product_attention
from course_lib.masks import causal_mask, sliding_window_mask
from course_lib.models import TinyTransformer, kv_cache_bytes
from course_lib.multihead import MultiHeadAttention


@pytest.mark.parametrize("seed", range(6))
def test_equals_sdpa_enable_gqa_on_random_shapes(seed):
    g = torch.Generator().manual_seed(seed)
    groups = int(torch.randint(1, 4, (1,), generator=g))
    h = groups * int(torch.randint(1, 4, (1,), generator=g))
    batch = int(torch.randint(1, 3, (1,), generator=g))
    n_q, n_k = (int(x) for x in torch.randint(1, 12, (2,), generator=g))
    d, d_v = (int(x) for x in torch.randint(1, 9, (2,), generator=g))
    q = torch.randn(batch, h, n_q, d, generator=g, dtype=torch.float64)
    k = torch.randn(batch, groups, n_k, d, generator=g, dtype=torch.float64)
    v = torch.randn(batch, groups, n_k, d_v, generator=g, dtype=torch.float64)
    masks = [None, torch.rand(n_q, n_k, generator=g) > 0.3,                   # shared mask
             torch.rand(batch, h, n_q, n_k, generator=g) > 0.3,               # one per query head
             torch.rand(batch, 1, 1, n_k, generator=g) > 0.2,                 # padding-like
             torch.randn(batch, h, n_q, n_k, generator=g, dtype=torch.float64)]  # additive
    for mask in masks:
        out, weights = grouped_query_attention(q, k, v, mask=mask)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        if mask is not None and mask.dtype == torch.bool:
            dead = ~mask.expand(batch, h, n_q, n_k).any(-1)      # fully masked rows: ours gives 0
            want = want.masked_fill(dead[..., None], 0.0)
        torch.testing.assert_close(out, want)
        assert weights.shape == (batch, h, n_q, n_k)
    out, _ = grouped_query_attention(q, k, v, scale=0.3)
    want = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, want)


def test_h_equals_g_is_plain_attention_and_g1_is_multi_query():
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k, v = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 4, 5, 8, generator=g)
    mask = causal_mask(5)
    assert all(torch.equal(a, b) for a, b in zip(grouped_query_attention(q, k, v, mask),
                                                 scaled_dot_product_attention(q, k, v, mask)))
    out, _ = grouped_query_attention(q, k[:, :1], v[:, :1], mask)
    for head in range(4):
        torch.testing.assert_close(out[:, head], scaled_dot_product_attention(
            q[:, head], k[:, 0], v[:, 0], mask)[0])


def test_gqa_bad_inputs_name_argument_and_shapes():
    q = torch.randn(1, 6, 3, 4)
    with pytest.raises(ValueError, match=r"not divisible.*h=6 query heads in q \(1, 6, 3, 4\), "
                                         r"g=4 in k \(1, 4, 3, 4\)"):
        grouped_query_attention(q, torch.randn(1, 4, 3, 4), torch.randn(1, 4, 3, 4))
    with pytest.raises(ValueError, match=r"k has 2 heads but v has 3"):
        grouped_query_attention(q, torch.randn(1, 2, 3, 4), torch.randn(1, 3, 3, 4))
    with pytest.raises(ValueError, match=r"q has shape \(3, 4\), wanted \(\.\.\., heads, n, d\)"):
        grouped_query_attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="floating"):
        grouped_query_attention(q.long(), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))


@pytest.mark.parametrize("h, g", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_multihead_with_kv_heads_equals_sdpa(h, g):
    torch.manual_seed(h * 10 + g)
    d = 24
    mha = MultiHeadAttention(d, h, num_kv_heads=g).double()
    assert mha.k_proj.weight.shape == (g * d // h, d) == mha.v_proj.weight.shape
    x = torch.randn(3, 7, d, dtype=torch.float64)
    mask = sliding_window_mask(7, 3)
    out, weights = mha(x, mask=mask)
    split = lambda t, n: t.view(3, 7, n, d // h).transpose(1, 2)  # noqa: E731
    heads = F.scaled_dot_product_attention(split(mha.q_proj(x), h), split(mha.k_proj(x), g),
                                           split(mha.v_proj(x), g), attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, mha.out_proj(heads.transpose(1, 2).reshape(3, 7, d)))
    assert weights.shape == (3, h, 7, 7)


def test_multihead_default_is_unchanged_and_bad_kv_heads_fail():
    torch.manual_seed(0)
    a = MultiHeadAttention(16, 4)
    torch.manual_seed(0)
    b = MultiHeadAttention(16, 4, num_kv_heads=4)
    x = torch.randn(2, 5, 16)
    assert torch.equal(a(x)[0], b(x)[0])
    with pytest.raises(ValueError, match=r"num_heads=6 is not divisible by num_kv_heads=4"):
        MultiHeadAttention(24, 6, num_kv_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(24, 6, num_kv_heads=0)
    with pytest.raises(ValueError, match="num_kv_heads"):
        shared = MultiHeadAttention(16, 4, num_kv_heads=2)
        shared.load_torch_weights(torch.nn.MultiheadAttention(16, 4))


@pytest.mark.parametrize("g", [4, 2, 1])
def test_tiny_transformer_kv_heads_cache_is_smaller_and_exact(g):
    torch.manual_seed(0)
    model = TinyTransformer(vocab_size=30, d_model=32, num_heads=4, num_layers=2, max_len=40,
                            num_kv_heads=g)
    prompt = torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(1))
    cached, logits_c = model.generate(prompt, 12, use_cache=True, return_logits=True)
    full, logits_f = model.generate(prompt, 12, use_cache=False, return_logits=True)
    assert torch.equal(cached, full)
    torch.testing.assert_close(logits_c, logits_f, atol=1e-5, rtol=1e-5)
    cache = model.new_cache(batch=2, capacity=17)
    assert cache.k.shape == (2, 2, g, 17, 8)
    model(cached[:, :17], cache=cache)
    assert cache.nbytes() == kv_cache_bytes(2, g, 17, 8, 4, batch=2)
    attn = model.blocks[0].attn
    qkv_and_out = 32 * 32 * 2 + 32 * 8 * g * 2 + 32 * 2 + 8 * g * 2   # weights and biases
    assert sum(p.numel() for p in attn.parameters()) == qkv_and_out


def test_tiny_transformer_default_unchanged_and_bad_kv_heads():
    torch.manual_seed(0)
    a = TinyTransformer(30, 32, 4, 1, 16)
    torch.manual_seed(0)
    b = TinyTransformer(30, 32, 4, 1, 16, num_kv_heads=4)
    idx = torch.randint(0, 30, (1, 9))
    assert torch.equal(a(idx), b(idx))
    with pytest.raises(ValueError, match=r"num_heads=4 is not divisible by num_kv_heads=3"):
        TinyTransformer(30, 32, 4, 1, 16, num_kv_heads=3)
