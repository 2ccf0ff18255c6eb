"""Chapter 07: telling attention where each token is.

Attention compares every query with every key on equal terms, so on its own it cannot tell
"dog bites man" from "man bites dog". Two ways to give it order:

* sinusoidal positions (Vaswani et al., 2017): ADD a fixed vector to each token's embedding,
  column pair i being (sin, cos) of  position * base^(-2i/d);
* rotary embeddings, RoPE (Su et al., 2021): ROTATE each pair (x[2i], x[2i+1]) of a query or key
  by the angle  position * base^(-2i/d).  A rotation keeps lengths, and the dot product of a query
  rotated to m with a key rotated to n depends on m and n only through m - n.

Both use the same frequencies, so column pair i of `sinusoidal_positions` holds exactly the sine
and cosine of the angles `apply_rope` rotates pair i by.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from course_lib.validate import check_count, check_float_tensor, check_number


def frequencies(d: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The angular frequency of each column pair: base^(-2i/d) for i = 0 .. ceil(d/2) - 1.

    Pair 0 turns by 1 radian per position (fast); the last pair turns almost not at all (slow).
    """
    return _frequencies(check_count(d, "d"), check_number(base, "base", above=1), dtype).clone()


@lru_cache(maxsize=64)
def _frequencies(d: int, base: float, dtype: torch.dtype) -> torch.Tensor:
    # cached: a model calls apply_rope twice per layer per step with the same d and base
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d  # (ceil(d/2),)
    return (base ** -exponents).to(dtype)


def sinusoidal_positions(n: int, d: int) -> torch.Tensor:
    """The fixed position table of "Attention Is All You Need": (n, d), float32.

        PE[pos, 2i]   = sin(pos * 10000^(-2i/d))
        PE[pos, 2i+1] = cos(pos * 10000^(-2i/d))

    Row `pos` is added to the embedding of the token at position `pos`. An odd d keeps the last
    sine column. Every entry lies in [-1, 1]; row 0 is (0, 1, 0, 1, ...).
    """
    n = check_count(n, "n", minimum=0)
    d = check_count(d, "d")
    pos = torch.arange(n, dtype=torch.float64)[:, None]  # (n, 1)
    angles = pos * frequencies(d, dtype=torch.float64)[None, :]  # (n, ceil(d/2))
    table = torch.empty(n, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d // 2])
    return table.to(torch.float32)


def _check_positions(positions, x: torch.Tensor) -> torch.Tensor:
    """positions: None, or numbers of shape (n,) or (..., n) that broadcast against x.shape[:-1]."""
    n = x.shape[-2]
    if positions is None:
        return torch.arange(n, device=x.device)
    if not isinstance(positions, torch.Tensor):
        try:
            positions = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"positions must be a tensor of numbers, "
                             f"got {type(positions).__name__}") from None
    if positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(f"positions must be integers or real numbers, got dtype {positions.dtype}")
    want = tuple(x.shape[:-1])
    if positions.ndim == 0 or positions.ndim > len(want) or positions.shape[-1] != n:
        raise ValueError(f"positions has shape {tuple(positions.shape)} but x has shape "
                         f"{tuple(x.shape)}: wanted ({n},) or a shape that broadcasts to {want}")
    padded = (1,) * (len(want) - positions.ndim) + tuple(positions.shape)
    if any(p not in (1, w) for p, w in zip(padded, want)):
        raise ValueError(f"positions has shape {tuple(positions.shape)}, which does not broadcast "
                         f"to x.shape[:-1] = {want} (x has shape {tuple(x.shape)})")
    return positions.to(x.device)


def apply_rope(x: torch.Tensor, positions=None, base: float = 10000.0) -> torch.Tensor:
    """Rotate each pair (x[..., 2i], x[..., 2i+1]) by the angle  position * base^(-2i/d).

    x: (..., n, d) with d even (queries or keys, e.g. (batch, heads, n, d_head)).
    positions: None for 0, 1, ..., n-1; or a tensor (n,) or (..., n) broadcasting to x.shape[:-1],
    e.g. (batch, 1, n) when each sequence of a batch starts at a different offset.
    Returns a tensor like x. In complex numbers, pair i is z = x[2i] + j x[2i+1] and becomes
    z * exp(j * position * theta_i); lengths do not change, and
    rope(q, m) . rope(k, n) = Re(sum_i q_i conj(k_i) exp(j (m - n) theta_i)) depends on m - n only.
    """
    check_float_tensor(x, "x", "(..., n, d)", min_ndim=2)
    d = x.shape[-1]
    if d == 0 or d % 2:
        raise ValueError(f"x has d={d} (shape {tuple(x.shape)}), but RoPE rotates pairs of "
                         "columns: d must be even and > 0")
    base = check_number(base, "base", above=1)
    positions = _check_positions(positions, x)

    # Angles in float64 for float64 input, float32 otherwise (half precision loses the angle).
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    theta = _frequencies(d, base, work).to(x.device)  # (d/2,)
    angles = positions.to(work)[..., None] * theta  # (..., n, d/2)
    cos, sin = torch.cos(angles), torch.sin(angles)

    x_even, x_odd = x[..., 0::2].to(work), x[..., 1::2].to(work)  # (..., n, d/2) each
    rotated_even = x_even * cos - x_odd * sin
    rotated_odd = x_even * sin + x_odd * cos
    out = torch.stack([rotated_even, rotated_odd], dim=-1)  # (..., n, d/2, 2)
    return out.flatten(-2).to(x.dtype)  # (..., n, d): pairs back in their interleaved places
