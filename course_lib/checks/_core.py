"""The machinery every chapter's judges share: calling learner code safely, turning its result
into a tensor, comparing against a reference, and reporting in words a learner can act on.
(The `forbid` trap is `_trap`; reading outcomes, `_judging`; named mistakes, `_mistakes`.)"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch


class CheckFailure(AssertionError):
    """A check did not pass. The message is feedback for the learner, not a stack trace."""


def fail(message: str) -> None:
    raise CheckFailure(message)


def passed(message: str) -> None:
    """Print a stable, one-line success message (nbval compares it)."""
    print(f"✔ {message}")


def _shape(x: Any) -> str:
    return str(tuple(x.shape)) if hasattr(x, "shape") else type(x).__name__


def call(fn: Callable, *args, name: str | None = None, **kwargs) -> Any:
    """Call the learner's `fn`, turning anything it raises into feedback."""
    name = name or getattr(fn, "__name__", "your function")
    if fn is None:
        fail(f"`{name}` is None: define the function in the cell above and run that cell first.")
    if not callable(fn):
        fail(f"`{name}` should be a function, but it is a {type(fn).__name__}.")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        hint = text_of(e).strip()
        fail(f"`{name}` (or a function it calls) is not written yet"
             + (f". Hint: {hint}" if hint else "."))
    except CheckFailure:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any learner error becomes feedback
        shapes = ", ".join(_shape(a) for a in args)
        fail(f"`{name}` raised {type(e).__name__}: {text_of(e)}"
             + (f"  (called with {shapes})" if shapes else ""))


def text_of(e: BaseException, limit: int = 20_000) -> str:
    """str(e), even for a learner's exception whose __str__ raises; cut to `limit` characters."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001
        text = f"<{type(e).__name__} that cannot be printed>"
    return text if len(text) <= limit else text[:limit] + " ..."


def to_tensor(value: Any, what: str, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Accept a tensor, NumPy array or number; reject None, strings and other surprises."""
    if value is None:
        fail(f"{what} is None: did you forget to `return` it?")
    if isinstance(value, (tuple, list)) and value and \
            all(isinstance(v, torch.Tensor) for v in value):
        fail(f"{what} is a {type(value).__name__} of {len(value)} tensors; "
             "expected a single tensor.")
    if isinstance(value, torch.Tensor):
        t = value.detach()
    elif isinstance(value, (np.ndarray, np.generic, int, float, list, tuple)):
        try:
            t = torch.as_tensor(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError):
            fail(f"{what} could not be read as numbers (got {type(value).__name__}).")
    else:
        fail(f"{what} should be a tensor, got a {type(value).__name__}.")
    return t.to(dtype) if dtype is not None else t


def matches(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-8, rtol: float = 1e-6,
            equal_nan: bool = False) -> bool:
    """got has want's shape and its values to within atol + rtol·|want| (a judge's `is close`)."""
    return got.shape == want.shape and bool(torch.allclose(got, want, atol=atol, rtol=rtol,
                                                           equal_nan=equal_nan))


def expect_pair(result: Any, name: str, parts: str, n: int = 2) -> Any:
    """The learner's tuple of `n` results (a pair by default), or feedback naming its `parts`."""
    kind = {2: "pair", 3: "triple"}.get(n, f"tuple of {n}")
    if result is None:
        fail(f"{name} returned None: did you forget to `return` the {kind} {parts}?")
    if not (isinstance(result, (tuple, list)) and len(result) == n):
        length = f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""
        fail(f"{name} should return a {kind} {parts}; it returned {type(result).__name__}{length}.")
    return result


def expect_shape(t: torch.Tensor, shape: Iterable[int], what: str, hint: str = "") -> None:
    shape = tuple(shape)
    if tuple(t.shape) != shape:
        fail(f"{what} has shape {tuple(t.shape)}, expected {shape}." + (f" {hint}" if hint else ""))


def expect_finite(t: torch.Tensor, what: str, hint: str = "") -> None:
    if t.is_floating_point() and not torch.isfinite(t).all():
        n_bad = int((~torch.isfinite(t)).sum())
        fail(f"{what} contains {n_bad} NaN/inf value(s)." + (f" {hint}" if hint else ""))


def expect_close(got: Any, want: torch.Tensor, what: str, *, atol: float = 1e-5, rtol: float = 1e-4,
                 hint: str = "") -> torch.Tensor:
    """Compare the learner's result with the reference: type, shape, finiteness, then values."""
    t = to_tensor(got, what, dtype=want.dtype)
    expect_shape(t, want.shape, what)
    want_finite = torch.isfinite(want).all() if want.is_floating_point() else True
    if want_finite:
        expect_finite(t, what, hint)
    if not torch.allclose(t, want, atol=atol, rtol=rtol, equal_nan=True):
        err = (t - want).abs()
        err = err[torch.isfinite(err)] if err.is_floating_point() else err
        worst = float(err.max()) if err.numel() else math.nan
        fail(f"{what}: the result differs from the expected values "
             f"(largest difference {worst:.3g})." + (f" {hint}" if hint else ""))
    return t
