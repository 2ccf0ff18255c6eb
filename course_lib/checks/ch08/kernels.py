"""Chapter 08's Triton exercises, run through Triton's interpreter so they work on any Linux
machine, GPU or not: the inner step of the attention kernel with its rescale forgotten (debug),
and a whole row-softmax kernel with its launch (build). Re-exported by `course_lib.checks.ch08`.
"""

from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F

import course_lib.flash as flash
from course_lib.checks._cases import generator
from course_lib.checks._core import (
    CheckFailure,
    call,
    expect_close,
    expect_shape,
    fail,
    matches,
    to_tensor,
)
from course_lib.checks._declare import function_check
from course_lib.checks._judging import each
from course_lib.checks._routes import SOFTMAX
from course_lib.checks.ch08.compiling import compile_first
from course_lib.checks.ch08.guard import canary_view, describe, guard, stopped

SOLUTION = "solutions/08_efficient_kernel.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
KERNEL_HALF = ("_flat", "_inner_step_kernel", "_interpreted", "_laid_out", "_launch_failed",
               "_not_written_hint", "_own_launch", "_softmax_run", "_step_run", "_written")

NO_TRITON = "triton-not-installed"
SKIPPED = ("skipped, Triton is not installed here (it ships for Linux only); the other "
           "exercises still count.")


def mistaken(got, mistake, want, *, words: str, atol: float, rtol: float) -> None:
    """(Judges.) Fail with `words` when `got` is what the mistake gives and the right answer
    is not (where a case cannot tell them apart, the comparison that follows judges)."""
    if matches(got, mistake, atol, rtol) and not matches(want, mistake, atol, rtol):
        fail(words)


def _no_triton(outcome) -> bool:
    """True when the learner's kernel had no Triton to run on (fine, if this side has none)."""
    if not (isinstance(outcome, str) and outcome == NO_TRITON):
        return False
    if flash.triton_available():
        fail("the notebook's kernel has no Triton, so this exercise could not run there.")
    return True


def _not_written_hint(error: BaseException) -> str | None:
    chain, seen = [error], set()
    while chain:
        e = chain.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, NotImplementedError):
            return str(e)
        chain += [x for x in (e.__cause__, e.__context__) if x is not None]
    found = re.search(r"NotImplementedError\(\\?['\"](.*?)\\?['\"]\)", repr(error))
    if found:
        return found.group(1)
    return "" if "NotImplementedError" in repr(error) else None


def _interpreted(fn, name: str) -> None:
    """Fail with words unless `fn` is a Triton function this process can interpret."""
    if fn is None:
        fail(f"`{name}` is None: define it in the cell above and run that cell first.")
    kind = type(fn).__name__
    if kind not in ("InterpretedFunction", "JITFunction"):
        fail(f"`{name}` should be a Triton function (decorate it with @triton.jit); "
             f"got a {kind}.")
    if kind == "JITFunction":
        fail(f"`{name}` was compiled for a GPU, but this check runs Triton's interpreter: run "
             "the notebook's set-up cell (prepare_triton(interpret=True)) before defining it.")


def _launch_failed(e: Exception, name: str, what: str):
    hint_text = _not_written_hint(e)
    if hint_text is not None:
        fail(f"`{name}` (or a function it calls) is not written yet"
             + (f". Hint: {hint_text}" if hint_text else "."))
    message = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
    fail(f"running the kernel with your `{name}` raised {type(e).__name__}: {message}. {what}")


# ------------------------------------------------------------- the inner step (debug)

def _inner_step_kernel():
    """The exercise kernel (course_lib/flash/exercise_kernel.py), defined for the interpreter."""
    import importlib

    flash.prepare_triton(interpret=True, quiet=True)
    return importlib.import_module("course_lib.flash.exercise_kernel").one_block_attention


def _step_cases(seed: int, hidden: bool) -> list:
    g = generator(5, seed)
    sizes = [(32, 64, 16, 1.0), (64, 128, 32, 1.0), (32, 64, 16, 60.0)]  # the last: huge logits
    sizes += [(48, 32, 16, 1.0), (16, 16, 16, 30.0)] if hidden else []
    return [{"q": torch.randn(n_q, d, generator=g) * spread, "k": torch.randn(n_k, d, generator=g),
             "v": torch.randn(n_k, d, generator=g), "spread": spread}
            for n_q, n_k, d, spread in sizes]


def _step_run(fn, case):
    """Launch the exercise kernel with the learner's step (type checks only; no judging)."""
    if not flash.triton_available():
        return NO_TRITON
    _interpreted(fn, "attn_inner_step")
    kernel = _inner_step_kernel()
    if not flash.interpreter_ready():
        fail("Triton was imported before its interpreter was switched on, so this check cannot "
             "run your function: restart the kernel and run the set-up cell "
             "(prepare_triton(interpret=True)) before anything imports triton.")
    q, k, v = case["q"], case["k"], case["v"]
    n_q, d = q.shape
    out = torch.empty(n_q, d)
    args, meta = (q, k, v, out, k.shape[0], d ** -0.5), {"STEP": fn, "BLOCK_M": 16,
                                                          "BLOCK_N": 16, "D": d}
    pending = compile_first(kernel, "attn_inner_step", args, meta, learner=(fn,))
    try:
        with np.errstate(all="ignore"):  # an unstable answer's overflow is reported by the judge
            kernel[(n_q // 16,)](*args, **meta)
    except Exception as e:  # noqa: BLE001 - any learner error becomes feedback
        _launch_failed(e, "attn_inner_step", "It must return the triple (acc, l_i, m_i) with "
                       "the same shapes it got.")
    if pending:
        fail(pending)
    return out


def _forgot_acc_rescale(q, k, v, block: int = 16) -> torch.Tensor:
    """What the kernel returns when the step rescales l_i but not acc (the planted bug)."""
    s = (q.double() @ k.double().T) * q.shape[1] ** -0.5
    m = torch.full((q.shape[0],), -torch.inf, dtype=torch.float64)
    l = torch.zeros(q.shape[0], dtype=torch.float64)
    acc = torch.zeros(q.shape[0], v.shape[1], dtype=torch.float64)
    for j in range(0, k.shape[0], block):
        tile = s[:, j:j + block]
        m_new = torch.maximum(m, tile.amax(1))
        p = torch.exp(tile - m_new[:, None])
        l = l * torch.exp(m - m_new) + p.sum(1)
        acc = acc + p @ v[j:j + block].double()
        m = m_new
    return (acc / l[:, None]).float()


@function_check(5, run=_step_run, cases=_step_cases)
def triton_inner_step(cases: list, outcomes: list) -> str:
    for case, out in each(cases, outcomes):
        if _no_triton(out):
            return f"triton_inner_step: {SKIPPED}"
        q, k, v = case["q"], case["k"], case["v"]
        want = F.scaled_dot_product_attention(q, k, v)
        t = to_tensor(out, "the kernel's output", dtype=torch.float32)
        expect_shape(t, want.shape, "the kernel's output")
        if case["spread"] > 1 and not torch.isfinite(t).all():
            fail("with large scores the kernel's output has inf/NaN: exponentiate each score "
                 "minus the NEW running max, never the raw score.")
        mistaken(t, _forgot_acc_rescale(q, k, v), want, atol=2e-4, rtol=2e-4, words=(
            "still the planted bug: the running sum l_i is rescaled when the max grows, but the "
            "running output acc is not, so earlier key blocks keep weights measured against an "
            "old, smaller max and count too much."))
        expect_close(t, want, "the kernel's output", atol=2e-4, rtol=2e-4,
                     hint="After every key block, l_i · exp(m_i) must be the sum of exp over the "
                          "scores seen so far, and acc the matching weighted sum of values.")
    return ("triton_inner_step: the kernel built on your step matches SDPA, large scores included "
            "(acc and l_i are rescaled together).")


# ------------------------------------------------------------- the row softmax (build)

def _softmax_cases(seed: int, hidden: bool) -> list:
    """Each case: `x` for the learner's row_softmax, and `mine`, the input of the check's own
    launch of the kernel (x's shape and padding, other values: an answer computed outside the
    kernel from x does not fit it)."""
    g = generator(6, seed)
    shapes = [(4, 16, 1.0), (5, 37, 1.0), (3, 100, 1.0), (6, 20, 1e3)]  # the last: huge logits
    shapes += [(1, 1, 1.0), (7, 129, 10.0)] if hidden else []
    cases = [{"x": torch.randn(rows, cols, generator=g) * spread, "stride": None,
              "spread": spread} for rows, cols, spread in shapes]
    masked = torch.randn(3, 24, generator=g)
    masked[:, 18:] = -torch.inf  # padding at the end of each row (-inf scores)
    # strided views: rows of a wider buffer whose padding holds NaN (the prompt's x[:, :n_cols])
    strided = [(torch.randn(4, 20, generator=g), 32), (torch.randn(3, 16, generator=g), 19)]
    cases += [{"x": masked, "stride": None, "spread": 1.0}] + \
        [{"x": x, "stride": stride, "spread": 1.0} for x, stride in strided]
    for case in cases:
        x = case.pop("x")
        mine = torch.randn(x.shape, generator=g) * case.pop("spread")
        case.update(x=x, mine=mine.masked_fill(torch.isinf(x), -torch.inf))
    return cases


def _laid_out(x: torch.Tensor, stride) -> torch.Tensor:
    return x.clone() if stride is None else canary_view(x, stride)


def _softmax_run(kernel, fn, case):
    """Run the learner's row_softmax (each launch compiled for a GPU first), then launch the
    kernel as it did but on the check's own grid, one program per row, and the check's own
    tensors: `mine` where it passed x, fresh NaN where it passed the tensor it returns."""
    if not flash.triton_available():
        return NO_TRITON
    _interpreted(kernel, "softmax_kernel")
    flash.prepare_triton(interpret=True, quiet=True)
    x = _laid_out(case["x"], case["stride"])
    cls, launches, pending = type(kernel), [], []
    original = cls.__getitem__

    def spy(self, grid):  # the launches of the learner's kernel by row_softmax, compiled first
        launch = original(self, grid)
        if self is not kernel:
            return launch

        def compiled_first(*args, **kwargs):
            launches.append((grid, args, kwargs))
            pending.append(compile_first(kernel, "softmax_kernel", args, kwargs))
            return launch(*args, **kwargs)
        return compiled_first

    cls.__getitem__ = spy
    out = None
    try:
        with guard() as record, np.errstate(all="ignore"):
            try:
                out = call(fn, x, name="row_softmax")
            except CheckFailure:
                if not record.get("access"):  # not the guard's stop: the learner's own error
                    raise
    finally:
        cls.__getitem__ = original
    if record.get("access") or not launches or not isinstance(out, torch.Tensor):
        return {"out": out, "launches": len(launches), **record}
    if any(pending):
        fail(next(p for p in pending if p))
    mine, own = _own_launch(kernel, launches[-1], x, out, case)
    return {"out": mine, "own": True, "launches": len(launches),
            **{k: v for k, v in own.items() if k != "launches"}, **record}


def _own_launch(kernel, launch, x, out, case):
    """The kernel launched by the check on (n_rows,) programs and its own copies of the
    tensors row_softmax passed; (what it wrote where row_softmax's result lies, the guard's
    record)."""
    grid, args, kwargs = launch
    rows = x.shape[0]
    try:
        shape = tuple(int(g) for g in (grid if isinstance(grid, tuple | list) else (grid,)))
    except (TypeError, ValueError):
        shape = ()
    if shape + (1,) * (3 - len(shape)) != (rows, 1, 1):
        fail(f"row_softmax launched softmax_kernel on the grid {grid!r}: one program per row is "
             f"grid = (n_rows,), here ({rows},).")
    target = _written(out, [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)])
    if target is None:
        fail("row_softmax returns a tensor that softmax_kernel was not given: the kernel must "
             "store the rows into the tensor row_softmax returns.")
    mine_x = _laid_out(case["mine"], case["stride"])
    fresh: dict = {}

    def mine(t):
        if not isinstance(t, torch.Tensor):
            return t
        ptr = t.untyped_storage().data_ptr()
        if ptr == x.untyped_storage().data_ptr():
            fresh.setdefault(ptr, _flat(mine_x))
        elif ptr == target.untyped_storage().data_ptr():
            fresh.setdefault(ptr, torch.full_like(_flat(t), float("nan")))
        elif t.shape == x.shape and torch.equal(t, x):  # a copy of x (x.contiguous())
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(mine_x)
        else:
            fresh.setdefault(ptr, _flat(t).clone())
        return torch.as_strided(fresh[ptr], t.shape, t.stride(), t.storage_offset())

    args, kwargs = [mine(a) for a in args], {k: mine(v) for k, v in kwargs.items()}
    with guard() as record:
        try:
            with np.errstate(all="ignore"):
                original = type(kernel).__getitem__
                original(kernel, (rows,))(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any learner error becomes feedback
            if stopped(e) is None:
                _launch_failed(e, "softmax_kernel", "")
    return mine(out if out.untyped_storage().data_ptr() in fresh else target).clone(), record


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under `t`, as a 1-d tensor of its dtype."""
    return t.new_empty(0).set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes()
                                                       // t.element_size(),), (1,))


def _written(out: torch.Tensor, given: list):
    """The tensor of the launch that holds row_softmax's result: one sharing its memory, else
    one holding the same values (a copy returned); None when the kernel was given neither."""
    same = [t for t in given if t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()]
    if same:
        return same[0]
    for t in given:
        if t.shape == out.shape and bool(((t == out) | (t.isnan() & out.isnan())).all()):
            return t
    return None


@function_check(9, run=_softmax_run, cases=_softmax_cases,
                forbid=SOFTMAX)
def row_softmax(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        if _no_triton(got):
            return f"row_softmax: {SKIPPED}"
        if not isinstance(got, dict):
            fail("the row_softmax check came back malformed.")
        x = case["mine"] if got.get("own") else case["x"]
        rows, cols = x.shape
        view = (f" (x was a strided view: {cols} columns, rows {case['stride']} elements apart)"
                if case["stride"] else "")
        if got.get("access"):
            fail(describe(got["access"], cols) + view)
        if not got.get("launches"):
            fail("row_softmax never launched softmax_kernel: the work must happen in the kernel "
                 "(kernel[grid](...)), one program per row.")
        want = torch.softmax(x, dim=-1)
        t = to_tensor(got.get("out"), "row_softmax(x)", dtype=torch.float32)
        expect_shape(t, want.shape, "row_softmax(x)", "One row of probabilities per input row.")
        if not torch.isfinite(t).all() and got.get("undefined_other"):
            fail("the masked lanes of your load have no `other=`: on a GPU they hold whatever "
                 "was in memory (this check fills them with NaN). Choose an `other=` that "
                 "exp sends to 0.")
        if not torch.isfinite(t).all() and case["stride"]:
            fail(f"row_softmax gives NaN on a strided view{view}: your kernel read the padding "
                 "between rows. Step from row to row by x.stride(0), not n_cols.")
        if not torch.isfinite(t).all():
            fail(f"row_softmax gives inf/NaN on a ({rows}, {cols}) input with scores up to "
                 f"{float(x[torch.isfinite(x)].abs().max()):.0f}: subtract each row's max "
                 "before exponentiating.")
        block = 1 << max(0, cols - 1).bit_length()
        if block > cols:
            padded = torch.softmax(torch.cat([x, torch.zeros(rows, block - cols)], 1), -1)
            mistaken(t, padded[:, :cols], want, atol=1e-5, rtol=1e-4, words=(
                f"with {cols} columns in a block of {block}, the {block - cols} lanes past the "
                "end are loaded as 0 and join the sum: load them with other=-inf so exp sends "
                "them to 0."))
        if torch.allclose(t.sum(0), torch.ones(cols), atol=1e-4) and rows > 1 and cols > 1:
            fail("your columns sum to 1: the softmax must normalise each ROW.")
        expect_close(t, want, "row_softmax(x)", atol=1e-5, rtol=1e-4,
                     hint=f"(Case: {rows} rows of {cols} columns{view}.) Each program loads "
                          "one row, subtracts its max, exponentiates, divides by the sum and "
                          "stores.")
    return ("row_softmax: one program per row, masked loads and stores, strided views, stable "
            "for huge scores: equal to torch.softmax through Triton's interpreter.")

