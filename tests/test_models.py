"""Tests for course_lib.models: TinyTransformer, its KV cache, batched prompts and the benchmark."""

import pytest
import torch
from torch.testing import assert_close

from course_lib.attention import scaled_dot_product_attention
from course_lib.measure import threads
from course_lib.models import KVCache, TinyTransformer, kv_cache_bytes, pad_prompts
from course_lib.models.bench import cache_memory, cache_speedup
from course_lib.position import apply_rope


@pytest.fixture(autouse=True)
def _one_thread():
    """These tensors are tiny: several intra-op threads only fight over a busy CPU (10x slower)."""
    with threads(1):
        yield


def _model(seed, vocab=37, d_model=32, heads=4, layers=2, max_len=64, dtype=torch.float32):
    torch.manual_seed(seed)
    return TinyTransformer(vocab, d_model, heads, layers, max_len).to(dtype)


# ---------------------------------------------------------------- cache on == cache off

@pytest.mark.parametrize("seed,batch,T,new,heads,layers", [
    (0, 1, 1, 12, 4, 2), (1, 3, 7, 20, 2, 3), (2, 2, 16, 30, 8, 1), (3, 4, 5, 1, 4, 4),
    (4, 1, 40, 24, 4, 2),
])
def test_cache_gives_identical_tokens_and_close_logits(seed, batch, T, new, heads, layers):
    model = _model(seed, heads=heads, layers=layers)
    g = torch.Generator().manual_seed(100 + seed)
    idx = torch.randint(0, model.vocab_size, (batch, T), generator=g)
    fast, fast_logits = model.generate(idx, new, use_cache=True, return_logits=True)
    slow, slow_logits = model.generate(idx, new, use_cache=False, return_logits=True)
    assert fast.shape == (batch, T + new) and fast.dtype == torch.long
    assert torch.equal(fast, slow)
    assert torch.equal(fast[:, :T], idx)
    assert fast_logits.shape == (batch, new, model.vocab_size)
    assert_close(fast_logits, slow_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cache_identity_in_float64(seed):
    model = _model(seed, dtype=torch.float64, d_model=48, heads=6)
    idx = torch.randint(0, model.vocab_size, (2, 6), generator=torch.Generator().manual_seed(seed))
    fast, fast_logits = model.generate(idx, 25, use_cache=True, return_logits=True)
    slow, slow_logits = model.generate(idx, 25, use_cache=False, return_logits=True)
    assert torch.equal(fast, slow)
    assert_close(fast_logits, slow_logits, atol=1e-10, rtol=1e-10)


def test_generated_tokens_are_the_argmax_of_the_full_forward():
    model = _model(5)
    idx = torch.randint(0, model.vocab_size, (2, 4), generator=torch.Generator().manual_seed(0))
    out = model.generate(idx, 6)
    with torch.no_grad():
        logits = model(out[:, :-1])  # (B, T + 5, vocab): one full pass over the result
    assert torch.equal(out[:, 4:], logits[:, 3:].argmax(-1))


def test_one_dimensional_prompt_and_zero_new_tokens():
    model = _model(6)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    out = model.generate(prompt, 7)
    assert out.shape == (12,) and torch.equal(out, model.generate(prompt[None], 7)[0])
    assert torch.equal(model.generate(prompt, 0), prompt)
    tokens, logits = model.generate(prompt, 0, return_logits=True)
    assert logits.shape == (0, model.vocab_size)


def test_generate_restores_training_mode_and_needs_no_grad():
    model = _model(7).train()
    out = model.generate(torch.tensor([[1, 2]]), 3)
    assert model.training and not out.requires_grad


# ---------------------------------------------------------------- prompts of different lengths

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_matches_each_prompt_alone(seed, use_cache):
    model = _model(seed, layers=3)
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 12, (4,), generator=g).tolist()
    prompts = [torch.randint(1, model.vocab_size, (n,), generator=g).tolist() for n in sizes]
    idx, lengths = pad_prompts(prompts)
    T = idx.shape[1]
    out, logits = model.generate(idx, 15, use_cache=use_cache, lengths=lengths, return_logits=True)
    for b, prompt in enumerate(prompts):
        alone, alone_logits = model.generate(torch.tensor(prompt), 15, return_logits=True)
        assert torch.equal(out[b, T - len(prompt):], alone), f"prompt {b} of length {len(prompt)}"
        assert torch.equal(out[b, :T - len(prompt)], torch.zeros(T - len(prompt), dtype=torch.long))
        assert_close(logits[b], alone_logits, atol=1e-4, rtol=1e-4)


def test_positions_count_from_each_prompts_first_token():
    """The cached (rotated) keys of a padded prompt equal those of the prompt run alone.

    With RoPE the scores depend only on offsets, so shifted positions would change the tokens
    only through rounding; the cached keys show the positions directly.
    """
    model = _model(19, layers=2)
    prompts = [[4, 8, 15], [16, 23, 36, 4, 8, 15, 16]]
    idx, lengths = pad_prompts(prompts)
    batch_cache = model.new_cache(2)
    with torch.no_grad():
        model(idx, lengths, cache=batch_cache)
        for b, prompt in enumerate(prompts):
            alone = model.new_cache(1)
            model(torch.tensor([prompt]), cache=alone)
            pad = idx.shape[1] - len(prompt)
            for got, want in ((batch_cache.k, alone.k), (batch_cache.v, alone.v)):
                assert_close(got[:, b, :, pad:7], want[:, 0, :, :len(prompt)], atol=1e-5,
                             rtol=1e-5)


def test_padding_content_does_not_matter():
    model = _model(8)
    idx, lengths = pad_prompts([[5, 6], [1, 2, 3, 4, 5]], pad_id=0)
    other = idx.clone()
    other[0, :3] = torch.tensor([9, 17, 33])  # different pad tokens, same prompts
    assert torch.equal(model.generate(idx, 8, lengths=lengths)[:, 5:],
                       model.generate(other, 8, lengths=lengths)[:, 5:])


def test_lengths_equal_to_width_is_the_same_as_no_lengths():
    model = _model(9)
    idx = torch.randint(0, model.vocab_size, (3, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model.generate(idx, 9, lengths=[6, 6, 6]), model.generate(idx, 9))


def test_pad_prompts():
    idx, lengths = pad_prompts([[7], [1, 2, 3]], pad_id=2)
    assert torch.equal(idx, torch.tensor([[2, 2, 7], [1, 2, 3]]))
    assert torch.equal(lengths, torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="non-empty"):
        pad_prompts([[1], []])
    with pytest.raises(ValueError, match="non-empty"):
        pad_prompts([])


# ---------------------------------------------------------------- the cache itself

def test_cached_keys_are_the_full_pass_keys_rotated_by_rope():
    """K and V in the cache after generation equal what one pass over the whole text computes."""
    model = _model(10, layers=1)
    idx = torch.randint(0, model.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache(2, 20)
    with torch.no_grad():
        model(idx, cache=cache)
        model(torch.tensor([[1], [2]]), cache=cache)
        full = torch.cat([idx, torch.tensor([[1], [2]])], dim=1)  # (2, 6)
        x = model.blocks[0].ln1(model.embed(full))
        attn = model.blocks[0].attn
        k = apply_rope(attn.k_proj(x).view(2, 6, 4, 8).transpose(1, 2))  # (B, heads, 6, d_head)
        v = attn.v_proj(x).view(2, 6, 4, 8).transpose(1, 2)
    assert cache.length == 6
    assert_close(cache.k[0, :, :, :6], k)
    assert_close(cache.v[0, :, :, :6], v)
    assert cache.nbytes() == 2 * 1 * 2 * 4 * 6 * 8 * 4


def test_last_query_alone_gives_the_last_row():
    """Why Q is not cached: the last output row needs only the last query and all keys/values."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 9, 8, generator=g)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    full, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    last, _ = scaled_dot_product_attention(q[..., -1:, :], k, v)
    assert_close(last[..., 0, :], full[..., -1, :])


def test_kv_cache_bytes_formula_matches_allocation():
    cache = KVCache(num_layers=3, batch=2, num_heads=4, capacity=10, d_head=16, dtype=torch.float16)
    assert cache.k.nbytes + cache.v.nbytes == kv_cache_bytes(3, 4, 10, 16, 2, batch=2)
    assert kv_cache_bytes(12, 12, 1024, 64, 2) == 2 * 12 * 12 * 1024 * 64 * 2
    with pytest.raises(ValueError, match="holds at most 10 tokens"):
        cache.append(0, torch.zeros(2, 4, 11, 16), torch.zeros(2, 4, 11, 16))


def test_forward_with_cache_matches_forward_without():
    model = _model(11)
    idx = torch.randint(0, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache(2)
    with torch.no_grad():
        full = model(idx)
        parts = [model(idx[:, :4], cache=cache), model(idx[:, 4:5], cache=cache),
                 model(idx[:, 5:], cache=cache)]
    assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=30, num_heads=4), r"d_model=30 does not split into num_heads=4"),
    (dict(d_model=12, num_heads=4), r"d_head = d_model / num_heads = 3.*must be even"),
    (dict(vocab_size=0), r"vocab_size must be a positive integer, got 0"),
    (dict(max_len=2.5), r"max_len must be a positive integer, got 2.5 \(float\)"),
    (dict(num_layers=True), r"num_layers must be a positive integer, got True \(bool\)"),
])
def test_constructor_bad_input(kwargs, match):
    args = dict(vocab_size=10, d_model=16, num_heads=2, num_layers=1, max_len=8) | kwargs
    with pytest.raises(ValueError, match=match):
        TinyTransformer(**args)


def test_prompt_plus_new_tokens_beyond_max_len():
    model = _model(12, max_len=16)
    with pytest.raises(ValueError,
                       match=r"T=10 tokens \+ max_new_tokens=7 = 17 is longer than max_len=16"):
        model.generate(torch.zeros(1, 10, dtype=torch.long), 7)
    with pytest.raises(ValueError, match=r"T=17 .*max_len=16"):
        model.generate(torch.zeros(1, 17, dtype=torch.long), 0, use_cache=False)
    assert model.generate(torch.zeros(1, 10, dtype=torch.long), 6).shape == (1, 16)  # exactly fits
    with pytest.raises(ValueError, match=r"17 tokens .* longer than max_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("idx,match", [
    (torch.tensor([[1.0, 2.0]]), r"integer token ids, got dtype torch.float32"),
    (torch.tensor([[1, 37]]), r"token ids must lie in 0..36 .*got ids from 1 to 37"),
    (torch.tensor([[-1, 3]]), r"token ids must lie in 0..36"),
    (torch.zeros(1, 2, 3, dtype=torch.long), r"shape \(batch, T\).*got shape \(1, 2, 3\)"),
    (torch.zeros(1, 0, dtype=torch.long), r"batch, T >= 1, got shape \(1, 0\)"),
    ([[1, 2]], r"idx must be a tensor of token ids"),
])
def test_generate_bad_idx(idx, match):
    with pytest.raises(ValueError, match=match):
        _model(13).generate(idx, 2)


@pytest.mark.parametrize("lengths,match", [
    ([3, 0], r"every length must lie in 1..T=4 \(the width of idx\), got lengths \[3, 0\]"),
    ([5, 1], r"every length must lie in 1..T=4"),
    ([2], r"lengths has shape \(1,\), expected \(2,\)"),
    ([1.0, 2.0], r"lengths must be a sequence of integers, got \[1.0, 2.0\]"),
    (torch.tensor([1.0, 2.0]), r"lengths must hold integers, got a tensor of dtype torch.float32"),
    ("ab", r"lengths must be a sequence of integers"),
])
def test_generate_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        _model(14).generate(torch.zeros(2, 4, dtype=torch.long), 2, lengths=lengths)


@pytest.mark.parametrize("new", [-1, 2.0, None])
def test_generate_bad_max_new_tokens(new):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        _model(15).generate(torch.zeros(1, 2, dtype=torch.long), new)


def test_cache_misuse():
    model = _model(16)
    cache = model.new_cache(2, 8)
    with pytest.raises(ValueError, match="idx has batch 1 but the cache was made for batch 2"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    model(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="lengths belongs to the first call"):
        model(torch.zeros(2, 1, dtype=torch.long), lengths=[1, 1], cache=cache)
    with pytest.raises(ValueError, match="batch must be a positive integer, got 0"):
        model.new_cache(0)


# ---------------------------------------------------------------- the benchmark helpers

def test_cache_speedup_rows():
    model = _model(17, max_len=32)
    rows = cache_speedup(model, lengths=(2, 8), repeats=3, progress=False)
    assert [r["n"] for r in rows] == [2, 8]
    for r in rows:
        assert r["same_logits"] is True
        assert r["cached"].repeats == r["full"].repeats == 3
        assert 0 < r["cached"].low <= r["cached"].median <= r["cached"].high
        assert 0 < r["full"].low <= r["full"].median <= r["full"].high
        assert r["speedup"] == pytest.approx(r["full"].median / r["cached"].median)
    assert model.training  # put back as it was
    with pytest.raises(ValueError, match="a step holds 33 tokens, more than the model's max_len"):
        cache_speedup(model, lengths=(32,), progress=False)
    with pytest.raises(ValueError, match="lengths must list context lengths of at least 1"):
        cache_speedup(model, lengths=(), progress=False)
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        cache_speedup(model, lengths=(4,), repeats=0, progress=False)


def test_cache_memory_rows():
    model = _model(18)  # 2 layers, 4 heads, d_head 8, float32
    rows = cache_memory(model, [1, 64], batch=3)
    assert rows[1]["cache_bytes"] == 2 * 2 * 3 * 4 * 64 * 8 * 4
    assert rows[0]["weight_bytes"] == sum(p.numel() * 4 for p in model.parameters())
    assert rows[1]["cache_over_weights"] == pytest.approx(rows[1]["cache_bytes"]
                                                          / rows[1]["weight_bytes"])
    half = cache_memory(model, [64], dtype=torch.float16)[0]
    assert half["cache_bytes"] == 2 * 2 * 4 * 64 * 8 * 2


# ---------------------------------------------------------------- against PyTorch's attention

@pytest.mark.parametrize("seed,heads", [(0, 1), (1, 4), (2, 8)])
def test_attention_layer_matches_torch_sdpa(seed, heads):
    """The layer = q, k, v maps, heads split, RoPE on q and k, causal torch SDPA, output map."""
    torch.manual_seed(seed)
    model = TinyTransformer(vocab_size=11, d_model=32, num_heads=heads, num_layers=1, max_len=16)
    attn = model.blocks[0].attn
    x = torch.randn(2, 7, 32)
    B, n, dh = 2, 7, 32 // heads
    q, k, v = (proj(x) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k, v = (t.view(B, n, heads, dh).transpose(1, 2) for t in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(apply_rope(q), apply_rope(k), v,
                                                            is_causal=True)
    want = attn.out_proj(want.transpose(1, 2).reshape(B, n, 32))
    positions = torch.arange(n).expand(B, n)
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        got, _ = attn(x, mask=mask, positions=positions)
    assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)
