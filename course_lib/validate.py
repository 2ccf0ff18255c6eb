"""Input checks shared by every learner-facing function: validate at the boundary, then trust.

One message style everywhere, so an error reads the same whichever chapter raised it:

    <argument> must be <what it wants>, got <what it got>   n_keys must be a positive integer, got 0
    <argument> has shape <got>, wanted <wanted>    q has shape (5,), wanted (..., n_q, d_k)
    <argument> has <size> but <other> has <size>   q has d_k=64 but k has d_k=32 (...)

Every check raises ValueError. This module imports nothing from the rest of the course, so any
module (masks first of all) can use it: validate <- masks <- attention <- multihead <- models.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["shape_of", "wrong_shape", "check_count", "check_number", "check_scale",
           "check_float_tensor", "check_qkv", "check_mask", "check_attention", "check_kv_heads",
           "check_positions", "check_choice", "check_lengths", "check_token_ids", "default_scale"]


def shape_of(x) -> tuple[int, ...]:
    """x's shape as a plain tuple (what messages print); () for things without one."""
    return tuple(getattr(x, "shape", ()))


def wrong_shape(name: str, x, wanted: str) -> ValueError:
    """The error for an argument of the wrong shape: raise wrong_shape("x", x, "(batch, n, d)")."""
    return ValueError(f"{name} has shape {shape_of(x)}, wanted {wanted}")


def check_count(value, name: str, minimum: int = 1) -> int:
    """An integer >= minimum (a Python or NumPy integer, or a 0-d integer tensor) as an int.

    Bools are refused although Python counts them as integers: `causal_mask(True)` is a mistake.
    """
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point() \
            and not value.is_complex() and value.dtype != torch.bool:
        value = int(value)
    wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be {wanted}, got {value}")
    return int(value)


def check_number(value, name: str, above: float, note: str = "") -> float:
    """A finite real number strictly greater than `above`, as a float (`note` adds a hint)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value <= above:
        raise ValueError(f"{name} must be a finite number > {above:g}{note}, got {value!r}")
    return float(value)


def check_scale(scale) -> None:
    """None (attention then uses 1/√d_k) or a finite number > 0."""
    if scale is not None:
        check_number(scale, "scale", above=0, note=" (or None for 1/√d_k)")


def default_scale(scale, q: torch.Tensor) -> float:
    """The scale attention multiplies q kᵀ by: `scale` itself, or 1/√d_k when it is None."""
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def check_choice(value, name: str, options):
    """One of a few allowed values (a kind, a name), returned as given."""
    if value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return value


def check_float_tensor(x, name: str, wanted: str = "a tensor", min_ndim: int = 0) -> None:
    """x is a floating-point torch.Tensor with at least `min_ndim` dims; `wanted` names its shape.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim < min_ndim:
        raise wrong_shape(name, x, wanted)
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor (float32/float64/...), got dtype "
                         f"{x.dtype} with shape {shape_of(x)}; convert it with {name}.float()")


def check_qkv(q, k, v, causal: bool = False) -> tuple[int, ...]:
    """q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v) with leading dims that broadcast.

    One set of rules for every attention in the course (plain, tiled, the kernel). Returns the
    scores' shape (..., n_q, n_k). causal=True also wants n_q == n_k.
    """
    for name, t, wanted in (("q", q, "(..., n_q, d_k)"), ("k", k, "(..., n_k, d_k)"),
                            ("v", v, "(..., n_k, d_v)")):
        check_float_tensor(t, name, wanted, min_ndim=2)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must share one dtype: q is {q.dtype}, k is {k.dtype}, "
                         f"v is {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k and v must be on one device: q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has d_k={q.shape[-1]} but k has d_k={k.shape[-1]} "
                         f"(q {shape_of(q)}, k {shape_of(k)}; both want (..., n, d_k))")
    if q.shape[-1] == 0:
        raise wrong_shape("q", q, "d_k >= 1 features per query")
    if q.shape[-2] == 0:
        raise wrong_shape("q", q, "at least one query (n_q >= 1)")
    if k.shape[-2] == 0:
        raise wrong_shape("k", k, "at least one key (n_k >= 1): every query needs a key to look at")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has n_k={k.shape[-2]} keys but v has {v.shape[-2]} values "
                         f"(k {shape_of(k)}, v {shape_of(v)}; want one value row per key)")
    try:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch/head) dims of q {shape_of(q)}, k {shape_of(k)} and "
                         f"v {shape_of(v)} do not broadcast together") from None
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal=True needs as many queries as keys, got n_q={q.shape[-2]} "
                         f"(q {shape_of(q)}) and n_k={k.shape[-2]} (k {shape_of(k)})")
    return (*lead, q.shape[-2], k.shape[-2])


def check_mask(mask, scores_shape: tuple[int, ...], device, wanted: str | None = None) -> None:
    """None, or a bool (True = may attend) or additive float mask that broadcasts to the scores.

    wanted: the shapes to name when it does not (default: the scores' shape itself).
    """
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a torch.Tensor (bool, or float 0/-inf), got "
                         f"{type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(f"mask must be boolean (True = may attend) or an additive float mask, got "
                         f"dtype {mask.dtype} with shape {shape_of(mask)}; for 0/1 integers use "
                         "mask.bool()")
    scores_shape = tuple(scores_shape)
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise wrong_shape("mask", mask, wanted or f"one that broadcasts to the scores' shape "
                                                  f"{scores_shape} = (..., n_q, n_k)")
    if mask.device != torch.device(device):
        raise ValueError(f"mask is on {mask.device} but the scores are on {device}")
    if mask.is_floating_point() and (torch.isnan(mask).any() or (mask == math.inf).any()):
        raise ValueError("an additive mask may hold 0, finite biases or -inf, but this one holds "
                         "NaN or +inf")


def check_attention(q, k, v, mask=None, scale=None, causal: bool = False) -> tuple[int, ...]:
    """Everything attention(q, k, v, mask, scale) needs checked; returns the scores' shape."""
    scores_shape = check_qkv(q, k, v, causal=causal)
    check_scale(scale)
    check_mask(mask, scores_shape, q.device)
    return scores_shape


def check_kv_heads(num_heads, num_kv_heads, shapes: str = "") -> int:
    """Grouped-query attention's g: a positive integer that divides the h query heads.

    Returns g (num_heads itself when num_kv_heads is None); `shapes` names the tensors involved.
    """
    if num_kv_heads is None:
        return num_heads
    g = check_count(num_kv_heads, "num_kv_heads")
    if num_heads % g:
        raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={g}: the query "
                         f"heads come in g groups of h/g{shapes}")
    return g


def check_positions(positions, batch: int, n: int, name: str = "x") -> None:
    """Token positions for RoPE: a real (usually integer) tensor of shape (n,) or (batch, n)."""
    if not isinstance(positions, torch.Tensor):
        raise ValueError(f"positions must be a torch.Tensor of shape ({n},) or ({batch}, {n}), "
                         f"got {type(positions).__name__}")
    if positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(f"positions must be integers or real numbers, got dtype {positions.dtype}")
    if tuple(positions.shape) not in ((n,), (batch, n)):
        raise wrong_shape("positions", positions, f"({n},) or (batch, n)=({batch}, {n}): one "
                                                  f"position per token of {name}")


def check_lengths(lengths, longest: int, shortest: int = 0, batch: int | None = None,
                  bound: str | None = None) -> torch.Tensor:
    """Sequence lengths, one per sequence: integers in shortest..longest, as a (batch,) tensor.

    `bound` names the upper limit in messages (default f"{longest}"); `batch`, when given, is the
    number of lengths wanted.
    """
    if isinstance(lengths, torch.Tensor):
        if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise ValueError(f"lengths must hold integers, got a tensor of dtype {lengths.dtype}")
        t = lengths.long()
    else:
        try:
            items = list(lengths)
        except TypeError:
            raise ValueError(f"lengths must be a sequence of integers, "
                             f"got {type(lengths).__name__}") from None
        if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in items):
            raise ValueError(f"lengths must be a sequence of integers, got {items!r}")
        t = torch.tensor([int(x) for x in items], dtype=torch.long)
    if batch is not None and tuple(t.shape) != (batch,):
        raise ValueError(f"lengths has shape {shape_of(t)}, expected ({batch},): one length per "
                         "sequence")
    if t.ndim != 1 or t.numel() == 0:
        raise ValueError(f"lengths must be one non-empty list of integers of shape (batch,), "
                         f"got shape {shape_of(t)}")
    if (t < shortest).any() or (t > longest).any():
        raise ValueError(f"every length must lie in {shortest}..{bound or longest}, "
                         f"got lengths {t.tolist()}")
    return t


def check_token_ids(idx, vocab_size: int, name: str = "idx", max_len: int | None = None,
                    ) -> torch.Tensor:
    """A (batch, T) integer tensor of token ids in 0..vocab_size-1 (T <= max_len), as int64."""
    if not isinstance(idx, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of token ids of shape (batch, T), "
                         f"got {type(idx).__name__}")
    if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"{name} must hold integer token ids, got dtype {idx.dtype} "
                         f"with shape {shape_of(idx)}")
    longest = "" if max_len is None else f" <= {max_len}"
    if idx.ndim != 2 or 0 in idx.shape or (max_len is not None and idx.shape[1] > max_len):
        raise ValueError(f"{name} must have shape (batch, T) with batch, T >= 1{longest}, "
                         f"got shape {shape_of(idx)}")
    if int(idx.min()) < 0 or int(idx.max()) >= vocab_size:
        raise ValueError(f"token ids must lie in 0..{vocab_size - 1} (vocab_size={vocab_size}), "
                         f"got ids from {int(idx.min())} to {int(idx.max())}")
    return idx.long()
