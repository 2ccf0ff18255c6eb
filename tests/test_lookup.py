"""course_lib.lookup: the hard and soft dictionary of chapter 01."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from course_lib.lookup import LookupMiss, hard_lookup, soft_lookup


def problem(seed, n=5, d=3, value_shape=()):
    rng = np.random.default_rng(seed)
    return rng.normal(size=d), rng.normal(size=(n, d)), rng.normal(size=(n, *value_shape))


def test_hard_lookup_returns_the_exact_match():
    _, keys, values = problem(0)
    for j in range(len(keys)):
        assert hard_lookup(keys[j].copy(), keys, values) == values[j]


def test_hard_lookup_miss_names_the_nearest_key():
    _, keys, values = problem(1)
    with pytest.raises(KeyError, match="nearest is key 2"):
        hard_lookup(keys[2] + 1e-3, keys, values)
    assert issubclass(LookupMiss, KeyError)


@pytest.mark.parametrize("value_shape", [(), (4,)])
@pytest.mark.parametrize("temperature", [0.1, 1.0, 7.5])
def test_soft_lookup_matches_torch_softmax(value_shape, temperature):
    query, keys, values = problem(2, n=6, d=4, value_shape=value_shape)
    value, weights = soft_lookup(query, keys, values, temperature)
    want_w = torch.softmax(torch.tensor(keys @ query) / temperature, dim=0)
    torch.testing.assert_close(torch.tensor(weights), want_w)
    torch.testing.assert_close(torch.tensor(value),
                               torch.tensordot(want_w, torch.tensor(values), dims=1))


def test_soft_lookup_on_torch_tensors_is_differentiable_and_agrees_with_numpy():
    query, keys, values = problem(3)
    q = torch.tensor(query, requires_grad=True)
    value, weights = soft_lookup(q, torch.tensor(keys), torch.tensor(values), temperature=0.5)
    value.backward()
    np_value, np_weights = soft_lookup(query, keys, values, temperature=0.5)
    np.testing.assert_allclose(weights.detach().numpy(), np_weights, rtol=1e-12)
    assert q.grad is not None and torch.count_nonzero(q.grad) == 3
    # finite differences agree with autograd
    eps = 1e-6
    fd = [(soft_lookup(query + eps * e, keys, values, 0.5)[0]
           - soft_lookup(query - eps * e, keys, values, 0.5)[0]) / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(q.grad.numpy(), fd, rtol=1e-5, atol=1e-8)


def test_hard_lookup_on_tensors_has_no_gradient_path():
    _, keys, values = problem(4)
    q = torch.tensor(keys[1], requires_grad=True)
    out = hard_lookup(q, torch.tensor(keys), torch.tensor(values))
    assert out.item() == values[1] and not out.requires_grad


def test_temperature_limits():
    query, keys, values = problem(5, n=4)
    _, cold = soft_lookup(query, keys, values, temperature=1e-3)
    _, hot = soft_lookup(query, keys, values, temperature=1e4)
    assert cold.argmax() == np.argmax(keys @ query) and cold.max() > 0.999
    np.testing.assert_allclose(hot, np.full(4, 0.25), atol=1e-3)


def test_soft_lookup_is_stable_for_huge_scores():
    keys = np.array([[1e4], [-1e4], [0.0]])
    value, weights = soft_lookup(np.array([1.0]), keys, np.array([1.0, 2.0, 3.0]))
    assert np.isfinite(weights).all() and value == pytest.approx(1.0)


@settings(max_examples=50, deadline=None)
@given(scores=arrays(np.float64, st.integers(1, 12), elements=st.floats(-1e3, 1e3)),
       temperature=st.floats(1e-2, 1e2))
def test_weights_are_a_distribution(scores, temperature):
    keys = scores[:, None]
    _, weights = soft_lookup(np.array([1.0]), keys, np.zeros(len(scores)), temperature)
    assert (weights >= 0).all() and weights.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("fn", [hard_lookup, soft_lookup])
def test_bad_shapes_are_named(fn):
    query, keys, values = problem(6, n=5, d=3)
    with pytest.raises(ValueError, match=r"query has d=2 but keys have d=3"):
        fn(query[:2], keys, values)
    with pytest.raises(ValueError, match=r"values must have one row per key.*n=5.*\(4,\)"):
        fn(query, keys, values[:4])
    with pytest.raises(ValueError, match=r"query must be one vector.*\(1, 3\)"):
        fn(query[None], keys, values)
    with pytest.raises(TypeError, match="keys must be a numpy array"):
        fn(query, keys.tolist(), values)
    with pytest.raises(TypeError, match="one kind"):
        fn(torch.tensor(query), keys, values)


@pytest.mark.parametrize("temperature", [0, -1.0, float("nan"), float("inf")])
def test_bad_temperature(temperature):
    query, keys, values = problem(7)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        soft_lookup(query, keys, values, temperature)
