"""Checkers for exercises/04_masking.ipynb: causal and padding masks, the additive form, and a
masked softmax that gives exact zeros and no NaN."""

from __future__ import annotations

import torch

import course_lib.attention as attention
import course_lib.masks as masks
from course_lib.attention import softmax as _softmax
from course_lib.checks._core import call, expect_close, expect_shape, fail, forbid, passed, to_tensor


def _bool_result(value, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The learner's mask as a bool tensor of `shape`, with feedback on float 0/1 answers."""
    if isinstance(value, torch.Tensor) and value.dtype != torch.bool:
        fail(f"{what} has dtype {value.dtype}; return a boolean tensor (True = may attend). "
             "Comparisons like j <= i give one, or call .bool() at the end.")
    t = to_tensor(value, what)
    expect_shape(t, shape, what)
    return t.bool()


def causal_mask(fn) -> None:
    """Exercise 1: causal_mask(n) -> bool (n, n), True where key j <= query i."""
    with forbid((masks, "causal_mask"), exercise="causal_mask"):
        for n in (4, 7, 1):
            got = _bool_result(call(fn, n, name="causal_mask"), f"causal_mask({n})", (n, n))
            i = torch.arange(n)
            want = i[None, :] <= i[:, None]  # (n, n): key index <= query index
            if n > 1 and torch.equal(got, want.T):
                fail("your mask is upper-triangular: it lets query i see keys j >= i, the future. "
                     "True should sit on and BELOW the diagonal (key j <= query i).")
            if torch.equal(got, ~want):
                fail("your mask is True where attention is forbidden. The convention is True = may "
                     "attend: query i may see keys 0..i.")
            if torch.equal(got, want & ~torch.eye(n, dtype=torch.bool)):
                fail("your mask forbids the diagonal: a token may attend to itself (key j = i is allowed).")
            if not torch.equal(got, want):
                fail(f"causal_mask({n}) is not lower-triangular with the diagonal: expected\n{want.int()}\n"
                     f"got\n{got.int()}")
    passed("causal_mask: True on and below the diagonal; no query sees a later key.")


def padding_mask(fn) -> None:
    """Exercise 2: padding_mask(lengths, n_keys) -> bool (batch, 1, n_keys), True on real tokens."""
    cases = [([3, 1], 4), ([5], 5), ([2, 4, 0], 6)]
    with forbid((masks, "padding_mask"), exercise="padding_mask"):
        for lengths, n_keys in cases:
            what = f"padding_mask({lengths}, {n_keys})"
            value = call(fn, list(lengths), n_keys, name="padding_mask")
            want = torch.arange(n_keys)[None, None, :] < torch.tensor(lengths)[:, None, None]
            if isinstance(value, torch.Tensor) and tuple(value.shape) == (len(lengths), n_keys):
                fail(f"{what} has shape {tuple(value.shape)}; expected (batch, 1, n_keys) = "
                     f"{tuple(want.shape)}: add the middle axis (mask[:, None, :]) so it broadcasts over queries.")
            got = _bool_result(value, what, tuple(want.shape))
            if torch.equal(got, ~want):
                fail("your mask is True on the padding. True = may attend: the first lengths[b] keys of "
                     "sequence b are True, the padding after them False.")
            if not torch.equal(got, want):
                fail(f"{what} marks the wrong keys: expected\n{want.int()}\ngot\n{got.int()}")
    passed("padding_mask: the first lengths[b] keys of sequence b, shape (batch, 1, n_keys).")


def to_additive(fn) -> None:
    """Exercise 3: to_additive(mask) -> float tensor, 0.0 where True and -inf where False."""
    g = torch.Generator().manual_seed(5)
    cases = [torch.ones(3, 3, dtype=torch.bool).tril(), torch.rand(2, 4, 5, generator=g) > 0.4]
    for mask in cases:
        got = call(fn, mask.clone(), name="to_additive")
        if isinstance(got, torch.Tensor) and not got.is_floating_point():
            fail(f"to_additive returned dtype {got.dtype}; the additive mask is a float tensor "
                 "(it is added to float scores).")
        t = to_tensor(got, "to_additive(mask)", dtype=torch.float64)
        want = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
        expect_shape(t, want.shape, "to_additive(mask)")
        if torch.isnan(t).any():
            fail("to_additive contains NaN: 0 * -inf is NaN, so build it with masked_fill or torch.where, "
                 "not by multiplying the mask by -inf.")
        if torch.equal(t == 0, ~mask):
            fail("your additive mask is 0 where the boolean mask is False. True (may attend) -> 0, "
                 "False (blocked) -> -inf.")
        if torch.equal(t == 0, mask) and not torch.isinf(t[~mask]).all():
            fail(f"blocked entries hold {float(t[~mask].max()):.3g}, not -inf. Use float('-inf'): "
                 "exp(-inf) is exactly 0, and a large finite number leaves a fully masked row uniform.")
        expect_close(t, want, "to_additive(mask)", atol=0, rtol=0,
                     hint="torch.zeros(mask.shape).masked_fill(~mask, float('-inf')).")
    passed("to_additive: 0 where attention is allowed, -inf where it is blocked.")


def masked_softmax(fn) -> None:
    """Exercise 4: masked_softmax(scores, mask) -> weights: 0 on masked keys, all-zero fully masked rows."""
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    random_mask = torch.rand(2, 4, 5, generator=g) > 0.4
    random_mask[0, 1] = False  # one query with every key masked
    random_mask[1, 2] = True
    cases = [
        (torch.randn(4, 4, generator=g, dtype=torch.float64), torch.ones(4, 4, dtype=torch.bool).tril()),
        (scores, random_mask),
        (torch.tensor([[1e4, -1e4, 5.0]], dtype=torch.float64), torch.tensor([[False, True, True]])),
    ]
    with forbid((attention, "softmax"), (attention, "scaled_dot_product_attention"), exercise="masked_softmax"):
        for s, mask in cases:
            got = call(fn, s.clone(), mask.clone(), name="masked_softmax")
            want = _softmax(s.masked_fill(~mask, float("-inf")))
            t = to_tensor(got, "masked_softmax(scores, mask)", dtype=torch.float64)
            expect_shape(t, want.shape, "masked_softmax(scores, mask)")
            dead = ~mask.any(dim=-1)  # (…,) rows with no key allowed
            if not torch.isfinite(t).all():
                where = "in a fully masked row" if (~torch.isfinite(t))[dead].any() else "in the weights"
                fail(f"masked_softmax gives NaN/inf {where}. When every key of a row is masked, the max is "
                     "-inf and exp(-inf - (-inf)) = exp(NaN): return zeros for such rows (torch.where on "
                     "mask.any(dim=-1)).")
            if dead.any() and (t[dead] != 0).any():
                fail("a row whose keys are all masked should get all-zero weights (it has nothing to attend "
                     "to), not a uniform or other distribution.")
            if (t[~mask.expand_as(t)] != 0).any():
                fail("some masked keys get non-zero weight: set their scores to -inf BEFORE the softmax, "
                     "so exp gives exactly 0.")
            expect_close(t, want, "masked_softmax(scores, mask)", atol=1e-9, rtol=1e-7,
                         hint="fill masked scores with -inf, subtract the row max, exp, divide by the row sum.")
    passed("masked_softmax: exact zeros on masked keys, zero rows instead of NaN.")
