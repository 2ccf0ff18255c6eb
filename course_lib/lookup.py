"""Chapter 01: the dictionary, hard and soft.

A Python `dict` returns the value stored under exactly the key you ask for, and nothing for a
key that is merely close. The soft lookup scores the query against every key, turns the scores
into weights with a softmax, and returns the weighted blend of all values:

    weights = softmax(keys @ query / temperature)        value = weights @ values

That blend is attention with a single query (chapter 02 adds many queries and learned maps).
Both functions take NumPy arrays; they also accept torch tensors, so chapter 01 can show
autograd flowing through the soft lookup and not through the hard one.
"""

from __future__ import annotations

import numpy as np

try:  # torch is a dependency of the course, but lookup itself only needs NumPy
    import torch
except ImportError:  # pragma: no cover
    torch = None


class LookupMiss(KeyError):
    """The hard lookup found no key exactly equal to the query (a dict's KeyError)."""

    def __str__(self) -> str:  # KeyError quotes its message; print it plainly instead
        return str(self.args[0]) if self.args else ""


def _is_torch(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _check(query, keys, values):
    """Validate shapes at the boundary: query (d,), keys (n, d), values (n, ...)."""
    arrays = {"query": query, "keys": keys, "values": values}
    use_torch = any(_is_torch(a) for a in arrays.values())
    for name, a in arrays.items():
        if not (_is_torch(a) or isinstance(a, np.ndarray)):
            raise TypeError(f"{name} must be a numpy array (or torch tensor), "
                            f"got {type(a).__name__}")
        if use_torch and not _is_torch(a):
            raise TypeError(f"{name} is a numpy array but another argument is a torch tensor: "
                            "pass one kind")
    if query.ndim != 1:
        raise ValueError(f"query must be one vector of shape (d,), got shape {tuple(query.shape)}")
    if keys.ndim != 2:
        raise ValueError(f"keys must have shape (n, d), got shape {tuple(keys.shape)}")
    if keys.shape[1] != query.shape[0]:
        raise ValueError(
            f"query has d={query.shape[0]} but keys have d={keys.shape[1]} "
            f"(query {tuple(query.shape)}, keys {tuple(keys.shape)})"
        )
    if values.ndim < 1 or values.shape[0] != keys.shape[0]:
        raise ValueError(
            f"values must have one row per key: keys {tuple(keys.shape)} has n={keys.shape[0]}, "
            f"values has shape {tuple(values.shape)}"
        )
    if keys.shape[0] == 0:
        raise ValueError("keys is empty: there is nothing to look up")
    return use_torch


def hard_lookup(query, keys, values):
    """Return the value whose key equals `query` exactly, like `d[query]` on a dict.

    query: (d,)   keys: (n, d)   values: (n, ...)  ->  values[j] for the j with keys[j] == query.
    Raises LookupMiss (a KeyError) when no key matches, naming the nearest key and its distance.
    """
    use_torch = _check(query, keys, values)
    if use_torch:
        hits = torch.nonzero((keys == query).all(dim=1)).flatten().tolist()
        distances = torch.linalg.vector_norm(keys.detach() - query.detach(), dim=1)
    else:
        hits = np.flatnonzero((keys == query).all(axis=1)).tolist()
        distances = np.linalg.norm(keys - query, axis=1)
    if not hits:
        j = int(distances.argmin())
        raise LookupMiss(
            f"no key equals the query; the nearest is key {j} at distance {float(distances[j]):.4g}"
        )
    return values[hits[0]]


def soft_lookup(query, keys, values, temperature: float = 1.0):
    """Blend every value by how well its key matches the query.

    query: (d,)   keys: (n, d)   values: (n, ...)   ->   (value, weights)
    weights = softmax(keys @ query / temperature), shape (n,), non-negative and summing to 1;
    value = sum_j weights[j] * values[j]. A small temperature approaches the hard argmax lookup,
    a large one the plain average of all values.
    """
    use_torch = _check(query, keys, values)
    if not (isinstance(temperature, (int, float)) and np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    scores = keys @ query / temperature  # (n,)
    if use_torch:
        weights = torch.softmax(scores, dim=0)  # (n,)
        value = torch.tensordot(weights, values.to(weights.dtype), dims=1)
    else:
        scores = scores - scores.max()  # subtracting the max changes nothing but avoids overflow
        exp = np.exp(scores)
        weights = exp / exp.sum()  # (n,)
        value = np.tensordot(weights, values, axes=1)
    return value, weights
