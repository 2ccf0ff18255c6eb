"""Guarded launches for chapter 08's Triton checks: every address a learner's kernel loads from or
stores to is checked, before the access happens, against the elements of the tensors the launch
was given. A store past a row's end is stopped and reported (not left to corrupt memory and kill
the kernel), and so is a load from a strided view's padding or past a buffer's end. A masked load
without `other=` reads NaN in its masked lanes here: on a GPU those lanes are undefined.

Used inside the kernel-side `run` of a check: `with guard() as record: launch(...)`; afterwards
`record` holds at most one out-of-bounds access, as data the judge turns into words.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch


class OutOfBounds(Exception):
    """Raised inside the interpreter when a kernel touches memory it was not given."""

    def __init__(self, access: dict):
        super().__init__(f"out-of-bounds {access['kind']}")
        self.access = access


def _elements(t: torch.Tensor) -> tuple[np.ndarray, int, int]:
    """The byte address of each element of `t` (sorted), and its storage's byte span."""
    size = t.element_size()
    base = t.untyped_storage().data_ptr()
    n = t.untyped_storage().nbytes() // size
    index = torch.as_strided(torch.arange(n, dtype=torch.int64), t.shape, t.stride(),
                             t.storage_offset())
    addresses = np.unique(base + index.reshape(-1).numpy().astype(np.uint64) * np.uint64(size))
    return addresses, base, base + n * size


def _tensors(names, args, kwargs) -> list[tuple[str, torch.Tensor]]:
    found = [(name, a) for name, a in zip(names, args) if isinstance(a, torch.Tensor)]
    return found + [(k, a) for k, a in kwargs.items() if isinstance(a, torch.Tensor)]


def _where(address: int, given: list) -> tuple[str, str, int, int]:
    """(argument name, 'gap' | 'past' | 'before', element offset from the tensor's first
    element, its row stride) for an address outside every tensor: the tensor nearest below
    it, else above."""
    below = [g for g in given if g[2] <= address]
    name, t, start, end, first = (max(below, key=lambda g: g[2]) if below
                                  else min(given, key=lambda g: g[2]))
    size = t.element_size()
    offset = (int(address) - int(first)) // size
    stride = int(t.stride(0)) if t.dim() > 1 else 0
    if address < start:
        return name, "before", offset, stride
    return name, "gap" if address < end else "past", offset, stride


@contextlib.contextmanager
def guard():
    """Check every load and store of the kernels launched inside the block (interpreter only)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    record: dict = {}
    given: list = []  # (name, tensor, storage start, storage end, first element's address)
    allowed = {"addresses": np.zeros(0, dtype=np.uint64)}
    original_init = interpreter.GridExecutor._init_args_hst
    real_load, real_store = builder.create_masked_load, builder.create_masked_store

    def init_args(executor, args_dev, kwargs):
        args_hst, kwargs_hst = original_init(executor, args_dev, kwargs)
        given.clear()
        spans = []
        for name, t in _tensors(executor.arg_names, args_hst, kwargs_hst):
            addresses, start, end = _elements(t)
            given.append((name, t, start, end, t.data_ptr()))
            spans.append(addresses)
        allowed["addresses"] = np.unique(np.concatenate(spans)) if spans else \
            np.zeros(0, dtype=np.uint64)
        record["launches"] = record.get("launches", 0) + 1
        return args_hst, kwargs_hst

    def checked(kind, ptrs, mask):
        pointers = np.asarray(ptrs.data).astype(np.uint64).reshape(-1)
        on = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).reshape(-1)
        bad = on & ~np.isin(pointers, allowed["addresses"])
        if given and bad.any():
            name, where, offset, stride = _where(int(pointers[bad][0]), given)
            access = {"kind": kind, "masked": bool((~on).any()), "arg": name, "where": where,
                      "offset": offset, "stride": stride, "lanes": int(bad.sum()),
                      "program": [int(i) for i in (builder.grid_idx or (0, 0, 0))]}
            record.setdefault("access", access)
            raise OutOfBounds(access)

    def load(ptrs, mask, other, cache_policy, is_volatile):
        checked("load", ptrs, mask)
        if other is None and not np.asarray(mask.data, dtype=bool).all():
            dtype = interpreter._get_np_dtype(ptrs.get_element_ty())
            if np.issubdtype(dtype, np.floating):  # what a GPU leaves there is undefined
                record["undefined_other"] = True
                other = interpreter.TensorHandle(np.full(np.shape(ptrs.data), np.nan, dtype),
                                                 ptrs.get_element_ty())
        return real_load(ptrs, mask, other, cache_policy, is_volatile)

    def store(ptrs, value, mask, cache_policy):
        checked("store", ptrs, mask)
        return real_store(ptrs, value, mask, cache_policy)

    interpreter.GridExecutor._init_args_hst = init_args
    builder.create_masked_load, builder.create_masked_store = load, store
    try:
        yield record
    finally:
        interpreter.GridExecutor._init_args_hst = original_init
        del builder.create_masked_load, builder.create_masked_store


def stopped(error: BaseException) -> dict | None:
    """The out-of-bounds access that stopped a launch, if that is what `error` came from."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OutOfBounds):
            return error.access
        error = error.__cause__ or error.__context__
    return None


def canary_view(x: torch.Tensor, row_stride: int) -> torch.Tensor:
    """`x` as a strided view of a wider buffer whose padding (and an extra row after it) holds
    NaN: a kernel that reads the padding gets NaN, one that steps by n_cols reads the wrong row."""
    rows, cols = x.shape
    buffer = torch.full((rows + 1, row_stride), float("nan"), dtype=x.dtype)
    view = buffer[:rows, :cols]
    view.copy_(x)
    return view


def describe(access: dict, n_cols: int, n_rows: int | None = None,
             tile: tuple[int, int] | None = None) -> str:
    """Feedback for an out-of-bounds access. `n_rows=None`: a kernel of one program per row
    (program r owns row r); else a 2-D kernel whose programs own `tile`-shaped tiles of an
    (n_rows, n_cols) tensor."""
    kind = access["kind"]
    verb = "store wrote" if kind == "store" else "load read"
    program = access["program"]
    who = f"program {program[0]}" if program[1:] == [0, 0] else f"program {tuple(program)}"
    arg, offset, stride = access["arg"], access["offset"], access["stride"]
    if access["where"] == "before":
        return (f"your {verb} before the start of `{arg}` ({who}): a row's offsets start at its "
                "first element, row * stride + tl.arange(0, BLOCK).")
    row, col = divmod(offset, stride) if stride else (None, offset)
    if n_rows is None and stride:
        row, col = program[0], offset - program[0] * stride
    inside = tile is not None and (program[0] + 1) * tile[0] <= n_rows and \
        (program[1] + 1) * tile[1] <= n_cols
    if inside or (col < 0 and access["masked"]):  # the tile needs no mask: the address is wrong
        place = "whose tile lies inside the tensor" if inside else "between the rows"
        return (f"your {verb} outside `{arg}` ({who}, {place}): the rows of a strided tensor "
                "lie tensor.stride(0) elements apart, not n_cols; step by the stride you are "
                "given, and each tensor has its own.")
    if n_rows is not None and row is not None and row >= n_rows:
        return (f"your {verb} past the last row of `{arg}` ({who} reached row {row} of "
                f"{n_rows}): mask the rows as well as the columns (rows < n_rows).")
    fix = ("mask the store" if kind == "store" else
           "mask the load, and choose `other` so that masked lanes cannot change the result")
    if col >= n_cols and not access["masked"]:
        return (f"your {verb} past the row's end: {fix} (mask = offsets < n_cols). ({who} "
                f"touched {access['lanes']} lane(s) beyond the {n_cols} columns of `{arg}`.)")
    if not access["masked"]:
        return (f"your {verb} outside `{arg}` ({who}, {access['lanes']} lane(s)): {fix} so "
                "that lanes outside the tensor do nothing.")
    return (f"your {verb} outside `{arg}` even with a mask ({who}): check the offsets and the "
            "stride you step by: rows lie tensor.stride(0) elements apart (not n_cols), and "
            "each tensor, input and output, has its own stride.")
