"""Checkers for exercises/07_order_and_memory.ipynb: sinusoidal positions, RoPE, one cached
decoding step, and the KV cache's size in bytes."""

from __future__ import annotations

import math

import torch

import course_lib.position as position
from course_lib.attention import scaled_dot_product_attention as _sdpa
from course_lib.checks._core import call, expect_close, expect_shape, fail, forbid, passed, to_tensor
from course_lib.position import apply_rope as _rope
from course_lib.position import sinusoidal_positions as _sinusoidal


def _same(t: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> bool:
    return t.shape == want.shape and bool(torch.allclose(t, want, atol=atol, rtol=1e-4))


# ---------------------------------------------------------------- exercise 1

def sinusoidal_positions(fn) -> None:
    """Exercise 1: sinusoidal_positions(n, d) -> (n, d): sin on even columns, cos on odd ones."""
    with forbid((position, "sinusoidal_positions"), exercise="sinusoidal_positions"):
        for n, d in [(6, 4), (20, 16), (1, 2), (50, 8)]:
            what = f"sinusoidal_positions({n}, {d})"
            got = call(fn, n, d, name="sinusoidal_positions")
            want = _sinusoidal(n, d).double()
            t = to_tensor(got, what, dtype=torch.float64)
            if n != d and tuple(t.shape) == (d, n):
                fail(f"{what} has shape {(d, n)}; expected (n, d) = {(n, d)}: one ROW per position.")
            expect_shape(t, (n, d), what, "One row per position, one column per dimension.")
            if not torch.isfinite(t).all():
                fail(f"{what} contains NaN/inf: the frequencies are 10000 ** (-2i / d), which stay in (0, 1].")
            if _same(t[:, [c ^ 1 for c in range(d)]], want):
                fail("your sines and cosines are swapped: column 2i holds sin(pos * w_i) and column 2i+1 "
                     "holds cos(pos * w_i) (row 0 should read 0, 1, 0, 1, ...).")
            half = torch.cat([want[:, 0::2], want[:, 1::2]], dim=1)
            if d > 2 and _same(t, half):
                fail("you put all the sines first and all the cosines after them; the table INTERLEAVES "
                     "them: column 2i is sin(pos * w_i), column 2i+1 is cos(pos * w_i). Assign with "
                     "pe[:, 0::2] = ... and pe[:, 1::2] = ...")
            if d > 2 and t.shape == want.shape and torch.allclose(t[:, :2], want[:, :2], atol=1e-5) \
                    and not _same(t, want):
                fail("your first column pair is right but later ones are not: the frequency of pair i is "
                     "10000 ** (-2 * i / d), where 2i is the pair's first COLUMN index (0, 2, 4, ...).")
            expect_close(t, want, what, atol=1e-5, rtol=1e-4,
                         hint="PE[pos, 2i] = sin(pos / 10000 ** (2i / d)), PE[pos, 2i+1] = cos(same angle).")
    passed("sinusoidal_positions: interleaved sin/cos at frequencies 10000^(-2i/d), shape (n, d).")


# ---------------------------------------------------------------- exercise 2

def _rope_half(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The other common layout (GPT-NeoX, Llama in HF): pair i is (x[i], x[i + d/2])."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[..., None] * theta
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return x * cos + rotated * sin


def apply_rope(fn) -> None:
    """Exercise 2: apply_rope(x, positions) rotates pair (x[2i], x[2i+1]) by positions * 10000^(-2i/d)."""
    g = torch.Generator().manual_seed(7)
    cases = [(torch.randn(6, 4, generator=g, dtype=torch.float64), torch.arange(6)),
             (torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64), torch.arange(5)),
             (torch.randn(7, 16, generator=g, dtype=torch.float64), torch.randint(0, 500, (7,), generator=g))]
    with forbid((position, "apply_rope"), exercise="apply_rope"):
        for x, positions in cases:
            what = f"apply_rope(x of shape {tuple(x.shape)}, positions)"
            got = call(fn, x.clone(), positions.clone(), name="apply_rope")
            want = _rope(x, positions)
            t = to_tensor(got, what, dtype=torch.float64)
            expect_shape(t, x.shape, what, "RoPE returns a tensor shaped like x.")
            if not torch.isfinite(t).all():
                fail(f"{what} contains NaN/inf.")
            if _same(t, x):
                fail("your result equals x: nothing was rotated. Use the positions: the angle of pair i "
                     "at position p is p * 10000 ** (-2i / d).")
            if _same(t, _rope(x, -positions)):
                fail("you rotate the wrong way: the new even entry is x_even*cos - x_odd*sin and the new "
                     "odd entry is x_even*sin + x_odd*cos.")
            if _same(t, _rope_half(x, positions)):
                fail("you pair x[i] with x[i + d/2] (the 'rotate half' layout). This course pairs "
                     "NEIGHBOURS: (x[..., 0::2], x[..., 1::2]), and puts the results back interleaved.")
            if not torch.allclose(t.norm(dim=-1), x.norm(dim=-1), atol=1e-6, rtol=1e-6):
                fail("the lengths of your rotated vectors changed; a rotation keeps them. Use the same "
                     "angle for the cos and the sin of a pair, and cos/sin (not the angle itself).")
            expect_close(t, want, what, atol=1e-6, rtol=1e-6,
                         hint="Angles: positions[:, None] * 10000 ** (-arange(0, d, 2) / d), shape (n, d/2).")
    passed("apply_rope: neighbouring pairs rotated by position * 10000^(-2i/d); lengths kept.")


# ---------------------------------------------------------------- exercise 3

def cached_attention_step(fn) -> None:
    """Exercise 3: cached_attention_step(q_new, k_new, v_new, k_cache, v_cache) -> (out, k_cache, v_cache).

    Generating token by token with it must give exactly the rows of full causal attention.
    """
    g = torch.Generator().manual_seed(8)
    for B, H, n, d in [(1, 1, 5, 4), (2, 3, 6, 8)]:
        q, k, v = torch.randn(3, B, H, n, d, generator=g, dtype=torch.float64)
        full, _ = _sdpa(q, k, v, mask=torch.ones(n, n, dtype=torch.bool).tril())  # (B, H, n, d)
        k_cache = torch.zeros(B, H, 0, d, dtype=torch.float64)  # nothing cached yet
        v_cache = torch.zeros(B, H, 0, d, dtype=torch.float64)
        for t in range(n):
            result = call(fn, q[:, :, t:t + 1].clone(), k[:, :, t:t + 1].clone(), v[:, :, t:t + 1].clone(),
                          k_cache, v_cache, name="cached_attention_step")
            if result is None:
                fail("cached_attention_step returned None: return the triple (out, k_cache, v_cache).")
            if not (isinstance(result, tuple) and len(result) == 3):
                size = f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""
                fail(f"cached_attention_step should return a triple (out, k_cache, v_cache); it returned "
                     f"{type(result).__name__}{size}.")
            out, k_cache_new, v_cache_new = result
            step = f"at step {t} (cache of {t} tokens before it)"
            kc = to_tensor(k_cache_new, f"the returned k_cache {step}", dtype=torch.float64)
            vc = to_tensor(v_cache_new, f"the returned v_cache {step}", dtype=torch.float64)
            if t > 0 and tuple(kc.shape) == (B, H, 1, d) and torch.equal(kc, k[:, :, t:t + 1]):
                fail(f"the returned k_cache {step} holds only the new key: concatenate it to the old "
                     "cache instead of replacing the cache.")
            if tuple(kc.shape) == (B, H, t, d):
                fail(f"the returned k_cache {step} still holds {t} keys: append the new key with "
                     "torch.cat([k_cache, k_new], dim=-2) and return the grown cache.")
            expect_shape(kc, (B, H, t + 1, d), f"the returned k_cache {step}",
                         "Keys are stacked along the token axis, dim=-2: (batch, heads, tokens, d).")
            expect_shape(vc, (B, H, t + 1, d), f"the returned v_cache {step}")
            expect_close(kc, k[:, :, :t + 1], f"the returned k_cache {step}", atol=1e-12, rtol=0,
                         hint="Old keys first, the new key last.")
            expect_close(vc, v[:, :, :t + 1], f"the returned v_cache {step}", atol=1e-12, rtol=0,
                         hint="Old values first, the new value last.")
            o = to_tensor(out, f"out {step}", dtype=torch.float64)
            want = full[:, :, t:t + 1]
            expect_shape(o, want.shape, f"out {step}", "One output row for the one new query: (batch, heads, 1, d).")
            if t > 0:
                w = torch.softmax(q[:, :, t:t + 1] @ k[:, :, :t + 1].transpose(-2, -1), dim=-1)
                if _same(o, w @ v[:, :, :t + 1], atol=1e-9):
                    fail(f"out {step} misses the 1/sqrt(d) scaling of the scores.")
                if _same(o, v[:, :, t:t + 1], atol=1e-9):
                    fail(f"out {step} is just the new value: the new query must attend over ALL cached keys.")
            expect_close(o, want, f"out {step}", atol=1e-9, rtol=1e-9,
                         hint="out = softmax(q_new @ k_cache.T / sqrt(d)) @ v_cache, with the caches "
                              "already holding the new key and value; no mask is needed.")
            k_cache, v_cache = k[:, :, :t + 1].clone(), v[:, :, :t + 1].clone()
    passed("cached_attention_step: token by token, the same outputs as full causal attention.")


# ---------------------------------------------------------------- exercise 4

def kv_cache_bytes(fn) -> None:
    """Exercise 4: kv_cache_bytes(num_layers, num_heads, n, d_head, bytes_per_element, batch) -> int."""
    cases = [(3, 4, 256, 32, 4, 1), (12, 12, 1024, 64, 2, 1), (2, 8, 100, 16, 4, 3), (32, 32, 4096, 128, 2, 8)]
    for layers, heads, n, d_head, size, batch in cases:
        args = dict(num_layers=layers, num_heads=heads, n=n, d_head=d_head, bytes_per_element=size, batch=batch)
        what = "kv_cache_bytes(" + ", ".join(f"{k}={v}" for k, v in args.items()) + ")"
        got = call(fn, layers, heads, n, d_head, size, batch, name="kv_cache_bytes")
        want = 2 * layers * batch * heads * n * d_head * size
        t = to_tensor(got, what, dtype=torch.float64)
        if t.numel() != 1:
            fail(f"{what} returned {t.numel()} numbers (shape {tuple(t.shape)}); return one count of bytes.")
        value = float(t.reshape(()))
        if not math.isfinite(value):
            fail(f"{what} returned {value}.")
        if value == want / 2:
            fail(f"{what} = {value:.0f} is half the answer: the cache holds K AND V, two tensors per layer.")
        if value == want / batch and batch > 1:
            fail(f"{what} = {value:.0f} forgets the batch: every sequence keeps its own keys and values.")
        if value == want / size and size > 1:
            fail(f"{what} = {value:.0f} counts elements, not bytes: multiply by bytes_per_element.")
        if value == want / layers and layers > 1:
            fail(f"{what} = {value:.0f} counts one layer: every layer caches its own K and V.")
        if value != want:
            fail(f"{what} = {value:.0f}, expected {want}: 2 x layers x batch x heads x n x d_head x bytes.")
    passed("kv_cache_bytes: 2 x layers x batch x heads x n x d_head x bytes per element.")
