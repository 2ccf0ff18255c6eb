"""course_lib.masks: shapes, alignment with torch's is_causal, padding, and bad input."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib.masks as masks_module
import course_lib.validate as validate_module
from course_lib.masks import as_additive, causal_mask, padding_mask


def test_causal_mask_small_example():
    want = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3), want)
    assert causal_mask(3).dtype == torch.bool


@given(st.integers(1, 9), st.integers(1, 9))
@settings(max_examples=50, deadline=None)
def test_causal_mask_is_top_left_aligned_like_sdpa_is_causal(n_q, n_k):
    m = causal_mask(n_q, n_k)
    assert m.shape == (n_q, n_k)
    i, j = torch.meshgrid(torch.arange(n_q), torch.arange(n_k), indexing="ij")
    assert torch.equal(m, j <= i)
    g = torch.Generator().manual_seed(n_q * 10 + n_k)
    q, k, v = (torch.randn(2, n, 4, generator=g, dtype=torch.float64) for n in (n_q, n_k, n_k))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    b = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.testing.assert_close(a, b)


def test_causal_mask_device_and_default_n_keys():
    m = causal_mask(4, device="cpu")
    assert m.shape == (4, 4) and m.device.type == "cpu"


@given(st.lists(st.integers(0, 8), min_size=1, max_size=6), st.integers(8, 10))
@settings(max_examples=50, deadline=None)
def test_padding_mask_marks_the_first_length_keys(lengths, n_keys):
    m = padding_mask(lengths, n_keys)
    assert m.shape == (len(lengths), 1, n_keys) and m.dtype == torch.bool
    assert m.sum(dim=-1).flatten().tolist() == lengths
    for b, n in enumerate(lengths):
        assert m[b, 0, :n].all() and not m[b, 0, n:].any()


def test_padding_mask_accepts_integer_tensor():
    assert torch.equal(padding_mask(torch.tensor([2, 1]), 3), padding_mask([2, 1], 3))


def test_numpy_and_0d_tensor_integers_are_accepted():
    import numpy as np

    assert torch.equal(causal_mask(np.int64(3), torch.tensor(4)), causal_mask(3, 4))
    assert torch.equal(padding_mask(np.array([2, 1]), np.int32(3)), padding_mask([2, 1], 3))


def test_as_additive_is_zero_or_minus_inf():
    a = as_additive(causal_mask(3), torch.float64)
    assert a.dtype == torch.float64
    assert torch.equal(a == 0, causal_mask(3))
    assert torch.equal(a == float("-inf"), ~causal_mask(3))


@pytest.mark.parametrize("call,match", [
    (lambda: causal_mask(0), "n_queries must be a positive integer, got 0"),
    (lambda: causal_mask(3.0), r"n_queries must be a positive integer, got 3.0"),
    (lambda: causal_mask(True), "n_queries must be a positive integer"),
    (lambda: causal_mask(3, -1), "n_keys must be a positive integer, got -1"),
    (lambda: padding_mask([3, 5], 4),
     r"every length must lie in 0..n_keys=4, got lengths \[3, 5\]"),
    (lambda: padding_mask([-1], 4), "every length must lie in 0..n_keys=4"),
    (lambda: padding_mask([1.5, 2], 4), "lengths must be a sequence of integers"),
    (lambda: padding_mask(torch.tensor([1.0, 2.0]), 4), "lengths must hold integers.*float32"),
    (lambda: padding_mask(torch.tensor([[1, 2]]), 4), r"shape \(batch,\), got shape \(1, 2\)"),
    (lambda: padding_mask([], 4), r"got shape \(0,\)"),
    (lambda: padding_mask(3, 4), "lengths must be a sequence of integers, got int"),
    (lambda: padding_mask([1], 0), "n_keys must be a positive integer, got 0"),
    (lambda: as_additive(torch.ones(2, 2)), "mask must be a boolean tensor"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _course_imports(module) -> list[str]:
    tree = ast.parse(inspect.getsource(module))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return [name for name in imported if "course_lib" in name]


def test_masks_does_not_import_attention():
    """Modules import downward: attention may use masks, never the other way round; masks uses
    only the shared input checks, which import nothing from the course."""
    assert _course_imports(masks_module) == ["course_lib.validate"]
    assert _course_imports(validate_module) == []
