"""What travels between the grader and the learner's kernel, as data that executes nothing.

Cases go out with `encode` (NumPy arrays become {"__ndarray__": tensor}, since
`torch.load(weights_only=True)` refuses ndarrays) and come back in with `decode`; the learner's
outputs become data with `to_data`; the grader reads the kernel's files with `load_outcomes` /
`load_data`, which refuse pickle payloads, over-large files and anything not shaped like
outcomes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

# Limits on what the kernel may hand back (checked when converting and again when loading).
MAX_OUTCOME_BYTES = 64 * 2**20   # the outcome file
MAX_NUMEL = 2**24                # tensor elements over all outcomes of one probe
MAX_DEPTH = 12                   # nesting of tuples/lists/dicts
MAX_ITEMS = 100_000              # container entries over all outcomes
MAX_TEXT = 20_000                # characters of one string (error messages are cut to it)
MAX_PICKLE_BYTES = 2 * 2**20     # the outcome file's pickle (its structure; tensor data aside)
MAX_RECORDS = 4096               # entries of the outcome file's zip (one per tensor storage)

_ARRAY = "__ndarray__"           # how a NumPy array in a case travels: {"__ndarray__": tensor}


class _Unreadable(Exception):
    """The learner's output holds something that is not data."""


def to_data(x: Any, budget: dict | None = None, depth: int = 0) -> Any:
    """The learner's output as data only: plain CPU tensors (NumPy arrays become tensors),
    numbers, str, bool, None, and tuples/lists/dicts of those. Raises _Unreadable otherwise."""
    budget = {"numel": MAX_NUMEL, "items": MAX_ITEMS} if budget is None else budget
    if depth > MAX_DEPTH:
        raise _Unreadable(f"data nested more than {MAX_DEPTH} levels deep")
    if x is None or type(x) in (bool, int, float, complex):
        return x
    if type(x) is str:
        if len(x) > MAX_TEXT:
            raise _Unreadable(f"a string of {len(x)} characters")
        return x
    if isinstance(x, torch.Tensor):
        return _tensor(x, budget)
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biufc":
            raise _Unreadable(f"a NumPy array of {x.dtype}")
        return _tensor(torch.from_numpy(_contiguous(x)), budget)
    if isinstance(x, np.generic):
        return to_data(x.item(), budget, depth + 1) if x.dtype.kind in "biufc" else _bad(x)
    for base in (bool, int, float, complex, str):  # subclasses: IntEnum, numpy-free float types
        if isinstance(x, base):
            return to_data(base(x), budget, depth + 1)
    if isinstance(x, (tuple, list)):
        _spend(budget, "items", len(x), "more than {} entries")
        items = [to_data(v, budget, depth + 1) for v in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        _spend(budget, "items", len(x), "more than {} entries")
        out = {}
        for k, v in x.items():
            if type(k) not in (str, int):
                raise _Unreadable(f"a dict with a {type(k).__name__} key")
            out[k] = to_data(v, budget, depth + 1)
        return out
    return _bad(x)


def _contiguous(x: np.ndarray) -> np.ndarray:
    """A C-contiguous copy or view of the same shape (np.ascontiguousarray makes a 0-d array
    shape (1,), which would mark a right 0-d answer wrong)."""
    return np.require(x, requirements="C")


def _bad(x: Any):
    raise _Unreadable(f"a {type(x).__name__}")


def _spend(budget: dict, what: str, n: int, message: str) -> None:
    budget[what] -= n
    if budget[what] < 0:
        limit = MAX_NUMEL if what == "numel" else MAX_ITEMS
        raise _Unreadable(message.format(limit))


def _tensor(x: torch.Tensor, budget: dict) -> torch.Tensor:
    if x.is_nested or x.device.type == "meta":
        raise _Unreadable("a nested tensor" if x.is_nested else "a tensor without data (meta)")
    if x.is_quantized:
        x = x.dequantize()
    if x.layout != torch.strided:
        x = x.to_dense()
    _spend(budget, "numel", x.numel(), "tensors of more than {} elements in all")
    t = x.detach().to("cpu")
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)  # nn.Parameter, a learner's subclass
    return t.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)


def encode(cases: Any) -> Any:
    """Cases as data `torch.load(weights_only=True)` accepts: NumPy arrays become
    {"__ndarray__": tensor}, NumPy scalars Python numbers; everything is a fresh copy."""
    if isinstance(cases, np.ndarray):
        return {_ARRAY: torch.from_numpy(_contiguous(cases)).clone()}
    if isinstance(cases, np.generic):
        return cases.item()
    if isinstance(cases, torch.Tensor):
        return cases.detach().cpu().clone()
    if isinstance(cases, (tuple, list)):
        items = [encode(v) for v in cases]
        return items if isinstance(cases, list) else tuple(items)
    if isinstance(cases, dict):
        return {k: encode(v) for k, v in cases.items()}
    if cases is None or isinstance(cases, (bool, int, float, complex, str)):
        return cases
    raise ValueError(f"a case may hold only data (tensors, arrays, numbers, str, containers), "
                     f"not a {type(cases).__name__}")


def decode(cases: Any) -> Any:
    """The inverse of `encode` (in the kernel): {"__ndarray__": tensor} becomes a NumPy array."""
    if isinstance(cases, dict):
        if set(cases) == {_ARRAY} and isinstance(cases[_ARRAY], torch.Tensor):
            return cases[_ARRAY].numpy().copy()
        return {k: decode(v) for k, v in cases.items()}
    if isinstance(cases, (tuple, list)):
        items = [decode(v) for v in cases]
        return items if isinstance(cases, list) else tuple(items)
    return cases


class OutcomeError(ValueError):
    """An outcome file the grader refuses: too large, not data, or not shaped like outcomes."""


def load_data(path: str | os.PathLike, *, max_bytes: int = MAX_OUTCOME_BYTES) -> Any:
    """Read a file the kernel wrote, refusing anything but plain data (no pickle payloads)."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise OutcomeError(f"no result file at {path}: {e}") from None
    if size > max_bytes:
        raise OutcomeError(f"the result file has {size} bytes, more than the limit of {max_bytes}")
    _refuse_expanding(path, max_bytes)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - UnpicklingError, a truncated zip, anything
        raise OutcomeError(f"the result file is not plain data ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None


def _refuse_expanding(path: str | os.PathLike, max_bytes: int) -> None:
    """Refuse, before torch reads it, a file that would take more memory than its size: torch
    allocates what a zip entry declares, so a 1 MB deflated entry may declare 1 GiB. The probe
    writes every entry stored (torch.save never compresses), so a compressed entry, a total
    declared size over the limit, an over-large pickle or too many entries is a forgery."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise OutcomeError(f"the result file is not plain data (not a torch zip file: "
                           f"{type(e).__name__})") from None
    if len(entries) > MAX_RECORDS:
        raise OutcomeError(f"the result file has {len(entries)} entries, more than {MAX_RECORDS}")
    declared = 0
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.file_size != entry.compress_size:
            raise OutcomeError(f"the result file has a compressed entry ({entry.filename[:80]!r} "
                               f"declares {entry.file_size} bytes); torch.save writes none")
        if entry.filename.endswith("data.pkl") and entry.file_size > MAX_PICKLE_BYTES:
            raise OutcomeError(f"the result file's structure takes {entry.file_size} bytes, "
                               f"more than {MAX_PICKLE_BYTES}")
        declared += entry.file_size
    if declared > max_bytes:
        raise OutcomeError(f"the result file declares {declared} bytes, more than {max_bytes}")


def load_outcomes(path: str | os.PathLike, *, max_bytes: int = MAX_OUTCOME_BYTES,
                  n_cases: int | None = None) -> list[dict]:
    """The outcomes the probe saved, validated: a list of {"ok": data} or {"error": str}
    (+ "reference_call": str), tensors plain, finite in size and nesting. Raises OutcomeError."""
    outcomes = load_data(path, max_bytes=max_bytes)
    if not isinstance(outcomes, list):
        raise OutcomeError(f"the result file holds a {type(outcomes).__name__}, not a list")
    if n_cases is not None and len(outcomes) != n_cases:
        raise OutcomeError(f"the result file has {len(outcomes)} results for {n_cases} cases")
    budget = {"numel": MAX_NUMEL, "items": MAX_ITEMS}
    for o in outcomes:
        if not isinstance(o, dict) or not o or not set(o) <= {"ok", "error", "reference_call"} \
                or ("ok" in o) == ("error" in o):
            raise OutcomeError("a result is not {'ok': ...} or {'error': ...}")
        for key in ("error", "reference_call"):
            if key in o and (type(o[key]) is not str or len(o[key]) > MAX_TEXT + 10):
                raise OutcomeError(f"a result's {key!r} is not a short string")
        if "ok" in o:
            _validate(o["ok"], budget, 0)
    return outcomes


def _validate(x: Any, budget: dict, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise OutcomeError(f"a result is nested more than {MAX_DEPTH} levels deep")
    if x is None or type(x) in (bool, int, float, complex):
        return
    if type(x) is str:
        if len(x) > MAX_TEXT:
            raise OutcomeError("a result holds an over-long string")
        return
    if type(x) is torch.Tensor:
        budget["numel"] -= x.numel()
        if budget["numel"] < 0:
            raise OutcomeError(f"the results hold more than {MAX_NUMEL} tensor elements")
        if x.layout != torch.strided or x.requires_grad or x.device.type != "cpu":
            raise OutcomeError("a result holds a tensor that is not a plain CPU tensor")
        needed = x.numel() * x.element_size()
        if x.numel() and (not x.is_contiguous() or x.untyped_storage().nbytes() < needed):
            raise OutcomeError("a result holds a tensor whose shape does not match its data")
        return
    if type(x) in (tuple, list, dict):
        budget["items"] -= len(x)
        if budget["items"] < 0:
            raise OutcomeError(f"the results hold more than {MAX_ITEMS} entries")
        if type(x) is dict:
            if not all(type(k) in (str, int) for k in x):
                raise OutcomeError("a result holds a dict whose keys are not str or int")
            x = x.values()
        for v in x:
            _validate(v, budget, depth + 1)
        return
    raise OutcomeError(f"a result holds a {type(x).__name__}")
