"""Checkers for exercises/07_order_and_memory.ipynb: is attention under a padding mask blind to
order (predict, then measure), a RoPE that puts its rotated pairs back in the wrong place
(debug), one cached decoding step and the KV cache's size in bytes (build)."""

from __future__ import annotations

import math
from functools import partial

import torch

import course_lib.position as position
from course_lib.attention import scaled_dot_product_attention as _sdpa
from course_lib.checks._cases import generator
from course_lib.checks._core import call, expect_close, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check, value_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each, value
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._values import read_bool, read_number

__all__ = ["padded_is_blind", "blind_why", "padding_gaps", "apply_rope", "cached_attention_step",
           "kv_cache_bytes", "hint"]

SOLUTION = "solutions/07_order_and_memory.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
KERNEL_HALF = ("_cached_run",)


# ---------------------------------------------------------------- exercises 1 and 2

ORDER_SEED, ORDER_SHAPE, PAD_LENGTH = 7, (1, 6, 8), 4
WITHIN_PERM = (2, 0, 3, 1, 4, 5)   # shuffles the 4 real tokens; the 2 padded positions stay
ACROSS_PERM = (3, 0, 5, 1, 4, 2)   # moves tokens between real and padded positions


def order_gaps() -> dict[str, float]:
    """max |attn(x[perm]) - attn(x)[perm]| on the exercise's seeded input, self-attention with
    q = k = v = x, no positions and no causal mask, under a padding mask that hides the last
    two positions: for the shuffle within the real tokens and across them."""
    from course_lib.masks import padding_mask

    x = torch.randn(*ORDER_SHAPE, generator=torch.Generator().manual_seed(ORDER_SEED))
    mask = padding_mask(torch.tensor([PAD_LENGTH]), ORDER_SHAPE[1])
    gaps = {}
    for name, perm in (("within", WITHIN_PERM), ("across", ACROSS_PERM)):
        perm = torch.tensor(perm)
        out, _ = _sdpa(x, x, x, mask=mask)
        shuffled, _ = _sdpa(x[:, perm], x[:, perm], x[:, perm], mask=mask)
        gaps[name] = float((shuffled - out[:, perm]).abs().max())
    return gaps


def _rounding(gap: float) -> str:
    """A rounding-level gap as a bound (its digits differ from CPU to CPU), else the number."""
    return "below 1e-5, rounding only" if gap < 1e-5 else f"{gap:.1e}"


@commit_check(1, read=partial(read_bool, what="padded_is_blind"), grade="padded_blind",
              reveals=("ch07_padding_gaps",))
def padded_is_blind(got: bool) -> str:
    within = order_gaps()["within"]
    return (f"prediction committed ({'blind' if got else 'not blind'}). The run: shuffling the 4 "
            f"real tokens moves the masked outputs by {_rounding(within)} beyond a shuffle, so "
            "the layer is blind to that reordering.")


blind_why = choice_check(1, "blind_why", "abc", module=__name__)


def _direction(got: float, want: float, what: str) -> str:
    return f"{what} is {'larger' if got > want else 'smaller'} than the check's run"


@value_check(2, grade="padding_gaps")
def padding_gaps(cases: list, outcomes: list) -> str:
    from course_lib.checks._values import read_several

    within, across = read_several(value(outcomes[0], "(gap_within, gap_across)"), 2,
                                  "two numbers", "check.padding_gaps(gap_within, gap_across)")
    within = read_number(within, "gap_within", 0, 1e6, "a number (the largest difference)")
    across = read_number(across, "gap_across", 0, 1e6, "a number (the largest difference)")
    gaps = order_gaps()
    if within > 1e-4:
        fail(f"gap_within = {within:.2e}: shuffling only the real tokens should change nothing "
             "beyond the shuffle. Did you keep the same padding mask for both runs (it hides "
             "positions 4 and 5, not particular tokens), and no causal mask?")
    if abs(across - gaps["across"]) <= 1e-4 * max(1.0, gaps["across"]):
        return (f"padding_gaps: {_rounding(within)} within the real tokens, {across:.4f} across "
                "the padding: the mask is tied to positions, so a token moved into a padded "
                "slot vanishes from every query's view.")
    if across <= 1e-4:
        fail(f"gap_across = {across:.1e} says the shuffle across the padding changes nothing: "
             "did you use perm_across, and the padding mask in both runs?")
    fail(f"{_direction(across, gaps['across'], 'gap_across')} on the same input (more than "
         "1e-4 apart). Shuffle the positions (axis 1) of x with perm_across, run the masked "
         "self-attention on x and on the shuffled x, reorder the first output by the same perm, "
         "and take the largest absolute difference.")


# ---------------------------------------------------------------- exercise 3

def _rope_half(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The other common layout (GPT-NeoX, Llama in HF): pair i is (x[i], x[i + d/2])."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[..., None] * theta
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return x * cos + rotated * sin


def _rope_cases(seed: int, hidden: bool) -> list:
    g = generator(2, seed)
    cases = [(torch.randn(6, 4, generator=g, dtype=torch.float64), torch.arange(6)),
             (torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64), torch.arange(5)),
             (torch.randn(7, 16, generator=g, dtype=torch.float64),
              torch.randint(0, 500, (7,), generator=g))]
    if hidden:  # far positions: the relative-position property must hold there too
        cases += [(torch.randn(4, 8, generator=g, dtype=torch.float64),
                   torch.tensor([3, 7, 103, 107])),
                  (torch.randn(1, 2, generator=g, dtype=torch.float64), torch.tensor([0]))]
    return [{"x": x, "positions": p} for x, p in cases]


def _rope_pairs(x: torch.Tensor, positions: torch.Tensor, halves: bool = False) -> torch.Tensor:
    """RoPE written out (the course's own apply_rope is what the exercise rules out): pair i,
    (x[2i], x[2i + 1]), rotated by position * 10000^(-2i/d) and put back in its own two columns,
    or (halves=True, the planted bug) all new even entries first, then all new odd ones."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[..., None] * theta
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    pairs = (even * cos - odd * sin, even * sin + odd * cos)
    return torch.cat(pairs, dim=-1) if halves else torch.stack(pairs, dim=-1).flatten(-2)


@function_check(3, args=("x", "positions"), grade="rope", cases=_rope_cases,
                forbid=((position, "apply_rope"),), reference=_rope_pairs, mistakes=(
    Mistake("your result equals x: nothing was rotated. Use the positions: the angle of pair i "
            "at position p is p * 10000 ** (-2i / d).",
            lambda x, positions: x, atol=1e-5, rtol=1e-4),
    Mistake("you rotate the wrong way: the new even entry is x_even*cos - x_odd*sin and the new "
            "odd entry is x_even*sin + x_odd*cos.",
            lambda x, positions: _rope_pairs(x, -positions), atol=1e-5, rtol=1e-4),
    Mistake("you pair x[i] with x[i + d/2] (the 'rotate half' layout). This course pairs "
            "NEIGHBOURS, entries 2i and 2i+1, and puts the results back interleaved.",
            _rope_half, atol=1e-5, rtol=1e-4),
    Mistake("still the planted bug: every pair is rotated correctly, but the results come back "
            "as two halves (all new even entries, then all new odd ones) instead of each pair "
            "in its own two columns. Dot products survive the shuffle, so the relative-position "
            "test cannot see it; position 0 (angle 0) must give x back.",
            partial(_rope_pairs, halves=True), atol=1e-5, rtol=1e-4),
))
def apply_rope(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        x = case["x"]
        what = f"apply_rope(x of shape {tuple(x.shape)}, positions)"
        t = to_tensor(got, what, dtype=torch.float64)
        expect_shape(t, x.shape, what, "RoPE returns a tensor shaped like x.")
        if not torch.isfinite(t).all():
            fail(f"{what} contains NaN/inf.")
        named_mistake(case, t)
        if not torch.allclose(t.norm(dim=-1), x.norm(dim=-1), atol=1e-6, rtol=1e-6):
            fail("the lengths of your rotated vectors changed; a rotation keeps them. Use the same "
                 "angle for the cos and the sin of a pair, and cos/sin (not the angle itself).")
        expect_close(t, expected(case), what, atol=1e-6, rtol=1e-6,
                     hint="The angle of pair i at position p is p * 10000 ** (-2i / d).")
    return "apply_rope: neighbouring pairs rotated by position * 10000^(-2i/d); lengths kept."


# ---------------------------------------------------------------- exercise 4

def _cached_cases(seed: int, hidden: bool) -> list:
    g = generator(3, seed)
    sizes = [(1, 1, 5, 4), (2, 3, 6, 8)] + ([(1, 2, 9, 2)] if hidden else [])
    cases = []
    for B, H, n, d in sizes:
        q, k, v = torch.randn(3, B, H, n, d, generator=g, dtype=torch.float64)
        cases += [{"q": q, "k": k, "v": v, "t": t} for t in range(n)]  # one case per new token
    return cases


def _cached_run(fn, case):
    q, k, v, t = case["q"], case["k"], case["v"], case["t"]
    return call(fn, q[:, :, t:t + 1].clone(), k[:, :, t:t + 1].clone(), v[:, :, t:t + 1].clone(),
                k[:, :, :t].clone(), v[:, :, :t].clone(), name="cached_attention_step")


def _cached_ok(q_new, k_new, v_new, k_cache, v_cache, scale: bool = True):
    """One decoding step: the new key and value appended, the new query attending over all."""
    k_cache, v_cache = torch.cat([k_cache, k_new], dim=-2), torch.cat([v_cache, v_new], dim=-2)
    scores = q_new @ k_cache.transpose(-2, -1)
    w = torch.softmax(scores / math.sqrt(q_new.shape[-1]) if scale else scores, dim=-1)
    return w @ v_cache, k_cache, v_cache


def _at_step(case: dict, got=None) -> dict:
    return {"step": f"at step {case['t']} (cache of {case['t']} tokens before it)"}


@function_check(4, run=_cached_run, grade="cached_step", cases=_cached_cases,
                reference=_cached_ok, mistakes=(
    Mistake("the returned k_cache {step} holds only the new key: add it to the old cache instead "
            "of replacing the cache.",
            lambda q_new, k_new, v_new, k_cache, v_cache: (
                _cached_ok(q_new, k_new, v_new, k_cache, v_cache)[0], k_new, v_new),
            atol=0, rtol=0, on=lambda result: result[1], detail=_at_step),
    # the two below compare the whole triple: they show only once the caches are right
    Mistake("out {step} misses the 1/sqrt(d) scaling of the scores.",
            partial(_cached_ok, scale=False), atol=1e-9, rtol=1e-4, detail=_at_step),
    Mistake("out {step} is just the new value: the new query must attend over ALL cached keys.",
            lambda q_new, k_new, v_new, k_cache, v_cache: (
                v_new, *_cached_ok(q_new, k_new, v_new, k_cache, v_cache)[1:]),
            atol=1e-9, rtol=1e-4, detail=_at_step),
))
def cached_attention_step(cases: list, outcomes: list) -> str:
    for case, result in each(cases, outcomes):
        q, k, v, t = case["q"], case["k"], case["v"], case["t"]
        B, H, n, d = q.shape
        if result is None:
            fail("cached_attention_step returned None: return the triple (out, k_cache, v_cache).")
        if not (isinstance(result, tuple) and len(result) == 3):
            size = f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""
            fail(f"cached_attention_step should return a triple (out, k_cache, v_cache); it "
                 f"returned {type(result).__name__}{size}.")
        out, k_cache_new, v_cache_new = result
        step = _at_step(case)["step"]
        kc = to_tensor(k_cache_new, f"the returned k_cache {step}", dtype=torch.float64)
        vc = to_tensor(v_cache_new, f"the returned v_cache {step}", dtype=torch.float64)
        named_mistake(case, (out, kc, vc))
        if tuple(kc.shape) == (B, H, t, d):
            fail(f"the returned k_cache {step} still holds {t} keys: append the new key along the "
                 "token axis and return the grown cache.")
        expect_shape(kc, (B, H, t + 1, d), f"the returned k_cache {step}",
                     "Keys are stacked along the token axis, dim=-2: (batch, heads, tokens, d).")
        expect_shape(vc, (B, H, t + 1, d), f"the returned v_cache {step}")
        expect_close(kc, k[:, :, :t + 1], f"the returned k_cache {step}", atol=1e-12, rtol=0,
                     hint="Old keys first, the new key last.")
        expect_close(vc, v[:, :, :t + 1], f"the returned v_cache {step}", atol=1e-12, rtol=0,
                     hint="Old values first, the new value last.")
        o = to_tensor(out, f"out {step}", dtype=torch.float64)
        full, _ = _sdpa(q, k, v, mask=torch.ones(n, n, dtype=torch.bool).tril())
        want = full[:, :, t:t + 1]
        expect_shape(o, want.shape, f"out {step}",
                     "One output row for the one new query: (batch, heads, 1, d).")
        expect_close(o, want, f"out {step}", atol=1e-9, rtol=1e-9,
                     hint="The new query attends over every cached key, the new one included; no "
                          "mask is needed.")
    return "cached_attention_step: token by token, the same outputs as full causal attention."


# ---------------------------------------------------------------- exercise 5

_BYTES_ARGS = ("num_layers", "num_heads", "n", "d_head", "bytes_per_element", "batch")


def _bytes_cases(seed: int, hidden: bool) -> list:
    sizes = [(3, 4, 256, 32, 4, 1), (12, 12, 1024, 64, 2, 1), (2, 8, 100, 16, 4, 3),
             (32, 32, 4096, 128, 2, 8)]
    sizes += [(1, 1, 1, 1, 1, 1), (80, 64, 32768, 128, 2, 4)] if hidden else []
    return [dict(zip(_BYTES_ARGS, size)) for size in sizes]


def _cache_bytes(num_layers, num_heads, n, d_head, bytes_per_element, batch, tensors=2):
    """Bytes of `tensors` cached tensors (K and V: 2) per layer."""
    return tensors * num_layers * batch * num_heads * n * d_head * bytes_per_element


def _bytes_call(case: dict) -> str:
    return "kv_cache_bytes(" + ", ".join(f"{k}={v}" for k, v in case.items()) + ")"


def _bytes_words(case: dict, got: float) -> dict:
    return {"what": _bytes_call(case), "value": got}


@function_check(5, args=_BYTES_ARGS, grade="cache_bytes", cases=_bytes_cases,
                reference=_cache_bytes, mistakes=(
    Mistake("{what} = {value:.0f} is half the answer: the cache holds K AND V, two tensors per "
            "layer.", partial(_cache_bytes, tensors=1), atol=0, rtol=0, detail=_bytes_words),
    Mistake("{what} = {value:.0f} forgets the batch: every sequence keeps its own keys and "
            "values.", lambda layers, heads, n, d, size, batch: _cache_bytes(
                layers, heads, n, d, size, 1), atol=0, rtol=0, detail=_bytes_words),
    Mistake("{what} = {value:.0f} counts elements, not bytes: multiply by bytes_per_element.",
            lambda layers, heads, n, d, size, batch: _cache_bytes(layers, heads, n, d, 1, batch),
            atol=0, rtol=0, detail=_bytes_words),
    Mistake("{what} = {value:.0f} counts one layer: every layer caches its own K and V.",
            lambda layers, heads, n, d, size, batch: _cache_bytes(1, heads, n, d, size, batch),
            atol=0, rtol=0, detail=_bytes_words),
))
def kv_cache_bytes(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        what = _bytes_call(case)
        want = expected(case)
        t = to_tensor(got, what, dtype=torch.float64)
        if t.numel() != 1:
            fail(f"{what} returned {t.numel()} numbers (shape {tuple(t.shape)}); return one count "
                 "of bytes.")
        value = float(t.reshape(()))
        if not math.isfinite(value):
            fail(f"{what} returned {value}.")
        named_mistake(case, value)
        if value != want:
            fail(f"{what} = {value:.0f}, expected {want}: 2 x layers x batch x heads x n x d_head "
                 "x bytes.")
    return "kv_cache_bytes: 2 x layers x batch x heads x n x d_head x bytes per element."
