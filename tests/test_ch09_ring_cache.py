"""Chapter 09's sliding window in generation: the ring-buffer KV cache and WindowedTransformer."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.masks import sliding_window_mask
from course_lib.models import TinyTransformer, kv_cache_bytes
from course_lib.models.windowed import RingKVCache, WindowedTransformer
from course_lib.multihead import merge_heads, split_heads
from course_lib.position import apply_rope


def _model(seed, dtype=torch.float64):
    """A random small WindowedTransformer: window, layers, heads and KV heads drawn by seed."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda *options: options[int(torch.randint(len(options), (1,), generator=g))]  # noqa: E731
    heads = pick(1, 2, 4)
    kv_heads = pick(*[h for h in (1, 2, 4) if heads % h == 0])
    torch.manual_seed(seed)
    model = WindowedTransformer(vocab_size=pick(11, 30), d_model=heads * pick(2, 4, 8),
                                num_heads=heads, num_layers=pick(1, 2, 3),
                                window=pick(1, 2, 3, 5, 8), num_kv_heads=kv_heads)
    return model.to(dtype).eval(), g


def _reference_logits(model, idx):
    """The same model written out with PyTorch's SDPA and the window as a dense mask."""
    n = idx.shape[1]
    mask, at = sliding_window_mask(n, model.window), torch.arange(n)
    x = model.embed(idx)
    for block in model.blocks:
        a, h = block.attn, block.ln1(x)
        q = apply_rope(split_heads(a.q_proj(h), a.num_heads), at)
        k = apply_rope(split_heads(a.k_proj(h), a.num_kv_heads), at)
        v = split_heads(a.v_proj(h), a.num_kv_heads)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + a.out_proj(merge_heads(heads))
        x = x + block.mlp(block.ln2(x))
    return model.lm_head(model.ln_f(x))


@pytest.mark.parametrize("seed", range(6))
@torch.no_grad()
def test_windowed_logits_equal_sdpa_with_a_window_mask(seed):
    model, g = _model(seed)
    idx = torch.randint(0, model.vocab_size, (2, int(torch.randint(1, 40, (1,), generator=g))),
                        generator=g)
    torch.testing.assert_close(model(idx), _reference_logits(model, idx))


@pytest.mark.parametrize("seed", range(6))
@torch.no_grad()
def test_ring_cache_in_chunks_equals_recomputation(seed):
    # chunks of random sizes, some longer than the window, so the ring wraps inside a chunk
    model, g = _model(seed)
    n = 30
    idx = torch.randint(0, model.vocab_size, (3, n), generator=g)
    want = model(idx)
    cache, got, start = model.new_cache(3), [], 0
    while start < n:
        t = min(n - start, int(torch.randint(1, 2 * model.window + 2, (1,), generator=g)))
        got.append(model(idx[:, start:start + t], cache=cache))
        start += t
        assert cache.seen == start and cache.length == min(start, model.window)
        held = cache.positions()
        assert sorted(held.tolist()) == list(range(max(0, start - model.window), start))
    torch.testing.assert_close(torch.cat(got, dim=1), want)


@pytest.mark.parametrize("seed", range(4))
def test_generation_with_the_ring_gives_the_tokens_of_recomputation(seed):
    model, g = _model(seed, torch.float32)
    prompt = torch.randint(0, model.vocab_size, (2, int(torch.randint(1, 12, (1,), generator=g))),
                           generator=g)
    cached = model.generate(prompt, 30, use_cache=True)
    assert torch.equal(cached, model.generate(prompt, 30, use_cache=False))
    assert cached.shape == (2, prompt.shape[1] + 30)


def test_cache_bytes_stay_flat_in_the_length():
    model, _ = _model(1)
    cache = model.new_cache(2)
    sizes = []
    for _ in range(40):
        model(torch.zeros(2, 1, dtype=torch.long), cache=cache)
        sizes.append(cache.nbytes())
    full = kv_cache_bytes(model.num_layers, model.num_kv_heads, model.window, model.d_head, 8, 2)
    assert sizes[model.window - 1:] == [full] * (40 - model.window + 1)
    assert sizes[0] == full // model.window
    assert cache.k.shape == (model.num_layers, 2, model.num_kv_heads, model.window, model.d_head)


@torch.no_grad()
def test_the_last_token_reaches_exactly_layers_times_w_minus_1_back():
    # the explorer's reach: L layers of window W carry a token at most L(W - 1) positions
    torch.manual_seed(0)
    model = WindowedTransformer(20, 16, 2, num_layers=2, window=4).double().eval()
    idx = torch.randint(0, 20, (1, 20))
    last = model(idx)[0, -1]
    reach = 2 * (4 - 1)
    for back, moves in ((reach, True), (reach + 1, False)):
        changed = idx.clone()
        changed[0, -1 - back] = (changed[0, -1 - back] + 1) % 20
        assert moves == (not torch.equal(model(changed)[0, -1], last)), back


def test_a_window_of_the_whole_length_is_tiny_transformer():
    torch.manual_seed(0)
    plain = TinyTransformer(30, 16, 2, 2, max_len=40).eval()
    windowed = WindowedTransformer(30, 16, 2, 2, window=40).eval()
    windowed.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 30, (2, 25))
    torch.testing.assert_close(windowed(idx), plain(idx))


def test_clear_errors():
    model, _ = _model(0)
    idx = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="RingKVCache"):
        model(idx, cache=TinyTransformer(11, 4, 1, 1, 8).new_cache(2))
    with pytest.raises(ValueError, match="does not pad"):
        model(idx, lengths=torch.tensor([5, 3]))
    with pytest.raises(ValueError, match="batch"):
        model(idx, cache=model.new_cache(3))
    with pytest.raises(ValueError, match="window"):
        RingKVCache(1, 1, 1, 0, 4)
