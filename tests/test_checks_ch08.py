"""Chapter 08's checkers pass right answers and turn every kind of wrong answer into feedback."""

import importlib.util
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from checker_cases import generic_wrong_answers

from course_lib.checks import CheckFailure
from course_lib.checks import ch08 as check
from course_lib.checks._predict import forget
from course_lib.checks.ch08 import tiling


def update_ok(m, l, scores):
    m_new = torch.maximum(m, scores.amax(dim=1))
    safe = torch.where(m_new == -math.inf, 0.0, m_new)
    return m_new, l * torch.exp(m - safe) + torch.exp(scores - safe[:, None]).sum(dim=1)


def update_nan_when_masked(m, l, scores):
    """The chapter's plain update: right until a row has seen only -inf."""
    m_new = torch.maximum(m, scores.amax(dim=1))
    return m_new, l * torch.exp(m - m_new) + torch.exp(scores - m_new[:, None]).sum(dim=1)


def update_numpy(m, l, scores):
    m, l, s = m.numpy(), l.numpy(), scores.numpy()
    m_new = np.maximum(m, s.max(axis=1))
    safe = np.where(np.isneginf(m_new), 0.0, m_new)
    return m_new, l * np.exp(m - safe) + np.exp(s - safe[:, None]).sum(axis=1)


def update_unstable(m, l, scores):
    m_new = torch.maximum(m, scores.amax(dim=1))
    return m_new, (l * torch.exp(m) + torch.exp(scores).sum(dim=1)) / torch.exp(m_new)


def causal_ok(q, k, v, block_size):
    return check.causal_tiled.reference(q, k, v, block_size)


def causal_full_grid(q, k, v, block_size):
    n = q.shape[0]
    s = (q @ k.T / math.sqrt(q.shape[1])).masked_fill(~torch.ones(n, n).tril().bool(), -math.inf)
    return torch.softmax(s, dim=-1) @ v


def causal_no_skip(q, k, v, block_size):
    """The right numbers, but every tile above the diagonal is scored too (then thrown away)."""
    n = q.shape[0]
    for i in range(0, n, block_size):
        for j in range(i + block_size, n, block_size):
            q[i:i + block_size] @ k[j:j + block_size].T
    return causal_ok(q, k, v, block_size)


def causal_chunked(q, k, v, block_size):
    """Each query block against its whole causal prefix with one softmax: no key tiles, no
    online softmax, yet the solution's FLOPs and a (block x n) strip of memory."""
    n = q.shape[0]
    out = []
    for i in range(0, n, block_size):
        i1 = min(n, i + block_size)
        s = torch.einsum("qd,kd->qk", q[i:i1], k[:i1]) / math.sqrt(q.shape[1])
        s = s.masked_fill(torch.arange(i1)[None, :] > torch.arange(i, i1)[:, None], -math.inf)
        out.append(torch.softmax(s, dim=-1) @ v[:i1])
    return torch.cat(out)


def backward_ok(q, k, v, o, lse, do, block_size):
    c = q.shape[1] ** -0.5
    d = (do * o).sum(1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.empty_like(k), torch.empty_like(v)
    for j in range(0, k.shape[0], block_size):
        sl = slice(j, j + block_size)
        p = torch.exp(c * q @ k[sl].T - lse[:, None])
        dv[sl] = p.T @ do
        ds = p * (do @ v[sl].T - d)
        dk[sl], dq = c * ds.T @ q, dq + c * ds @ k[sl]
    return dq, dk, dv


def backward_full_grid(q, k, v, o, lse, do, block_size):
    return backward_ok(q, k, v, o, lse, do, k.shape[0])


def backward_autograd(q, k, v, o, lse, do, block_size):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), do)


# Right answers (the reference, then other forms a learner may write); each must pass.
CORRECT = [
    (check.online_update, update_ok),
    (check.causal_tiled, causal_ok),
    (check.flash_backward, backward_ok),
    (check.online_update, update_numpy),
    (check.causal_tiled, lambda q, k, v, b: (causal_ok(q, k, v, b), None)),
    (check.causal_tiled, lambda q, k, v, b: causal_ok(q, k, v, b).numpy()),
    (check.flash_backward, lambda *a: [g.numpy() for g in backward_ok(*a)]),
]

# Wrong answers every checker of this chapter must survive, with the words the feedback
# must contain (tests/test_checks_generic.py runs each checker on each).
GENERIC_WRONG = [
    *generic_wrong_answers(check.online_update.hints[0]),
]


# Answers that hand the work to the course's (or torch's) own implementation: each earns
# "which this exercise rules out" feedback, not a pass.
REFERENCE_CALLS = [
    (check.causal_tiled, lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v,
                                                                           is_causal=True)),
    (check.flash_backward, backward_autograd),
]


@pytest.mark.parametrize("wrong, words", [
    (update_nan_when_masked, "ALL -inf"),
    (update_unstable, "overflows|ALL -inf"),
    (lambda m, l, s: (s.amax(dim=1), l + torch.exp(s - s.amax(dim=1, keepdim=True)).sum(1)),
     "m_new|without rescaling"),  # both mistakes at once: the first case met names one
    (lambda m, l, s: (torch.maximum(m, s.amax(0)[:m.shape[0]]), l), "m_new"),
    (lambda m, l, s: update_ok(m, l, s)[0], "should return a pair"),
    (lambda m, l, s: (update_ok(m, l, s)[0], torch.full_like(l, math.nan)), "NaN"),
    (lambda m, l, s: (update_ok(m, l, s)[0], update_ok(m, l, s)[1][None]), "shape"),
])
def test_wrong_online_update(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.online_update(wrong)


@pytest.mark.parametrize("wrong, words", [
    (causal_full_grid, "score grid"),
    (causal_no_skip, "computes the tiles above the diagonal"),
    (causal_chunked, r"\(128 x 16\) @ \(16 x 512\).*chunking, not tiling"),
    (lambda q, k, v, b: causal_ok(q * math.sqrt(q.shape[1]), k, v, b), "differs"),
    (lambda q, k, v, b: causal_ok(q, k, v, b)[:, :1], "shape"),
])
def test_wrong_causal_tiled(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.causal_tiled(wrong)


@pytest.mark.parametrize("wrong, words", [
    (backward_full_grid, "never|grid"),
    (lambda *a: backward_ok(*a)[:2], "triple"),
    (lambda *a: (backward_ok(*a)[0], backward_ok(*a)[2], backward_ok(*a)[1]), "shape|dv"),
])
def test_wrong_flash_backward(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.flash_backward(wrong)


def test_causal_fraction_prediction_and_measurement(capsys):
    assert tiling.measured_fraction() == 36 / 64
    assert tiling.measured_fraction(64) == 136 / 256
    forget()
    check.causal_fraction(0.5)  # the grid's half: committed, then the count is shown
    assert "Recorded" in capsys.readouterr().out
    check.causal_fraction(0.56)  # the first commit counts
    assert "you predicted 0.500" in capsys.readouterr().out
    check.fraction_why("c")
    check.measured_causal_fraction(torch.tensor(136 / 256))
    assert capsys.readouterr().out.count("✔") == 2
    forget()


@pytest.mark.parametrize("checker, got, words", [
    (check.fraction_why, "a", "keys of their own block"),
    (check.fraction_why, "b", "counts what ran"),
    (check.causal_fraction, 1.5, "outside"),
    (check.causal_fraction, None, "None"),
    (check.causal_fraction, "half", "should be a fraction"),
    (check.measured_causal_fraction, 256 / 136, "upside down"),
    (check.measured_causal_fraction, 0.7, "larger than the check's count"),
    (check.measured_causal_fraction, 0.51, "smaller than the check's count"),
    (check.measured_causal_fraction, float("nan"), "finite"),
])
def test_causal_fraction_wrong_values_are_explained(checker, got, words):
    forget()
    with pytest.raises(CheckFailure, match=words) as info:
        checker(got)
    assert "0.531" not in str(info.value)  # the experiment's count is never printed


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no Triton")

# Learner-style Triton code: the right kernels, then each mistake as the edit that makes it from
# the right one (`_variants`). The notebook's given step is step_ok with the planted bug.
RIGHT = {
    "step_ok": '''(acc, l_i, m_i, qk, v):
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp(qk - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return acc, l_i, m_new''',
    "softmax_ok": '''(X, Y, x_stride, y_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * x_stride + cols, mask=cols < n_cols, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * y_stride + cols, e / tl.sum(e, 0), mask=cols < n_cols)''',
    "bias_ok": '''(X, B, Z, n_rows, n_cols, sx, sz, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=inside)
    b = tl.load(B + cols, mask=cols < n_cols)
    tl.store(Z + rows[:, None] * sz + cols[None, :], x + b[None, :], mask=inside)''',
    "mean_ok": '''(X, OUT, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=0.0)
    tl.store(OUT + row, tl.sum(x, 0) / n_cols)''',
    "max_ok": '''(X, OUT, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = -float("inf")
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
        m = tl.maximum(m, tl.max(x, 0))
    tl.store(OUT + row, m)''',
    "max_first_block": '''(X, OUT, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    tl.store(OUT + row, tl.max(x, 0))''',
}
_MASKED_LOAD = ', mask=cols < n_cols, other=-float("inf")'
WRONG = {  # name: (the right kernel, [(what it says there, what the mistake says)])
    "step_given": ("step_ok", [("acc * alpha[:, None] + ", "acc + ")]),
    "step_no_rescale": ("step_ok", [("l_i * alpha", "l_i"), ("acc * alpha[:, None]", "acc")]),
    "step_unstable": ("step_ok", [("qk - m_new[:, None]", "qk"), ("l_i * alpha", "l_i"),
                                  ("acc * alpha[:, None]", "acc")]),
    "step_blank": ("step_ok", [("    m_new = tl", '    raise NotImplementedError("rescale by '
                                                  'alpha")\n    m_new = tl')]),
    "step_pair": ("step_ok", [("return acc, l_i, m_new", "return acc, l_i")]),
    "softmax_pad_zero": ("softmax_ok", [('other=-float("inf")', "other=0.0")]),
    "softmax_unstable": ("softmax_ok", [("x - tl.max(x, 0)", "x")]),
    "softmax_unmasked_store": ("softmax_ok", [(", e / tl.sum(e, 0), mask=cols < n_cols",
                                               ", e / tl.sum(e, 0)")]),
    "softmax_unmasked_load": ("softmax_ok", [(_MASKED_LOAD, "")]),
    "softmax_no_other": ("softmax_ok", [(', other=-float("inf")', "")]),
    "bias_cols_only": ("bias_ok", [("(rows[:, None] < n_rows) & (cols[None, :] < n_cols)",
                                    "cols[None, :] < n_cols")]),
    "bias_contiguous": ("bias_ok", [("* sx", "* n_cols"), ("* sz", "* n_cols")]),
    "mean_by_block": ("mean_ok", [("/ n_cols", "/ BLOCK")]),
    "mean_no_other": ("mean_ok", [(", other=0.0", "")]),
    "max_zero": ("max_ok", [('m = -float("inf")', "m = 0.0"),
                            ('other=-float("inf")', "other=0.0")]),
    "max_unmasked": ("max_ok", [(_MASKED_LOAD, "")]),
}
# What a GPU refuses and the interpreter runs: NumPy or torch in the body, Python on a block.
NOT_COMPILABLE = {
    "step_ok": [("numpy", "p = tl.exp(", "p = np.exp("),
                ("torch", "alpha = tl.exp(", "alpha = torch.exp("),
                ("if", "    p = tl.exp", "    if qk > 0:\n        qk = qk - 1.0\n    p = tl.exp")],
    "softmax_ok": [("numpy", "e = tl.exp(", "e = np.exp("),
                   ("torch", "tl.max(x, 0)", "torch.max(x)"),
                   ("if", "    e = tl.exp", "    if x > 0:\n        x = x - 1.0\n    e = tl.exp"),
                   ("index", "e / tl.sum(e, 0)", "e / sum([e[i] for i in range(BLOCK)])")],
    "bias_ok": [("numpy", "x + b[None, :]", "np.add(x, b[None, :])"),
                ("torch", "x + b[None, :]", "torch.add(x, b[None, :])"),
                ("if", "    b = tl.load", "    if x > 0:\n        x = x + 0.0\n    b = tl.load")],
    "mean_ok": [("numpy", "tl.sum(x, 0)", "np.sum(x)"), ("torch", "tl.sum(x, 0)", "torch.sum(x)"),
                ("if", "    tl.store", "    if x > 0:\n        x = x + 0.0\n    tl.store")],
    "max_ok": [("numpy", "tl.maximum(m, tl.max(x, 0))", "np.maximum(m, tl.max(x, 0))"),
               ("torch", "tl.maximum(m, tl.max(x, 0))", "torch.maximum(m, tl.max(x, 0))"),
               ("if", "        m = tl.maximum", "        if x > m:\n            x = x + 0.0\n"
                                                "        m = tl.maximum")],
}
CANNOT_COMPILE = {"numpy": r"calls numpy\.\w+ inside @triton\.jit .*only use tl\.\* operations",
                  "torch": r"calls torch\.\w+ inside @triton\.jit .*only use tl\.\* operations",
                  "if": r"cannot compile .* for a GPU \(at `if .*Python `if` or `while` on a block",
                  "index": r"cannot compile .* for a GPU .*(built-in `sum`|Python list)"}


def _variants() -> str:
    """The source of every kernel: the right ones, the mistakes, the ones a GPU refuses."""
    def kernel(name, base, edits):
        body = RIGHT[base]
        for old, new in edits:
            assert old in body, (name, old)
            body = body.replace(old, new)
        return f"@triton.jit\ndef {name}{body}\n\n"
    source = "".join(kernel(name, name, []) for name in RIGHT)
    source += "".join(kernel(name, base, edits) for name, (base, edits) in WRONG.items())
    return source + "".join(kernel(f"{base}_{kind}", base, [(old, new)])
                            for base, edits in NOT_COMPILABLE.items() for kind, old, new in edits)


LAUNCHERS = '''
def launcher(kernel, strides="own", grid=None, outside=False):
    """row_softmax launching `kernel`; strides "own" (each tensor's), "n_cols" (as if
    contiguous) or "x" (x's for both); `outside`: the work done in torch, the launch a dummy."""
    def row_softmax(x):
        y = torch.empty_like(x)
        x_stride, y_stride = {"own": (x.stride(0), y.stride(0)), "n_cols": (x.shape[1],) * 2,
                              "x": (x.stride(0),) * 2}[strides]
        kernel[grid or (x.shape[0],)](x, y, x_stride, y_stride, x.shape[1],
                                      BLOCK=triton.next_power_of_2(x.shape[1]))
        if outside:  # a cheat: the launch for show, the answer from torch
            e = torch.exp(x - x.amax(1, keepdim=True))
            return e / e.sum(1, keepdim=True)
        return y
    return row_softmax


@triton.jit
def copy_kernel(X, Y, x_stride, y_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(Y + row * y_stride + cols, tl.load(X + row * x_stride + cols, mask=cols < n_cols),
             mask=cols < n_cols)


def copying_launcher(x):
    """A cheat: softmax in torch, then a kernel that only copies it into the output."""
    e = torch.exp(x - x.amax(1, keepdim=True))
    p, y = (e / e.sum(1, keepdim=True)).contiguous(), torch.empty_like(x)
    copy_kernel[(x.shape[0],)](p, y, p.stride(0), y.stride(0), x.shape[1],
                               BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
'''


def _learner_module(tmp_path_factory, source: str):
    """`source` as a module of its own file: the check compiles a kernel from its source, which
    Python keeps only for code read from a file (or a notebook cell)."""
    name = f"ch08_learner_{next(_COUNT)}"
    path = tmp_path_factory.mktemp("kernels") / f"{name}.py"
    path.write_text("import numpy as np\nimport torch\nimport triton\n"
                    "import triton.language as tl\n" + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_COUNT = itertools.count()


@pytest.fixture(scope="module")
def tl_steps(tmp_path_factory):
    """Learner-style Triton code, defined the way the exercise notebook defines it, by name:
    steps (`ok`, `given`, ...), kernels, and (kernel, row_softmax) pairs for `softmax_*`."""
    import course_lib.flash as flash

    flash.prepare_triton(interpret=True, quiet=True)
    if not flash.interpreter_ready():
        pytest.skip("triton was imported compiled (GPU) earlier in this process; the exercise "
                    "check needs it imported in interpreter mode")
    module = _learner_module(tmp_path_factory, _variants() + LAUNCHERS)
    found = {}
    for name, obj in vars(module).items():
        if name.startswith("softmax_"):
            found[name] = (obj, module.launcher(obj))
        elif name.startswith("step_"):
            found[name.removeprefix("step_")] = obj
        elif type(obj).__name__ == "InterpretedFunction":
            found[name] = obj
    kernel = module.softmax_ok
    found["softmax_contiguous_only"] = (kernel, module.launcher(kernel, strides="n_cols"))
    found["softmax_one_stride"] = (kernel, module.launcher(kernel, strides="x"))
    found["softmax_two_programs_a_row"] = (kernel, module.launcher(kernel, grid=lambda m: (1, 2)))
    found["softmax_outside"] = (kernel, module.launcher(kernel, outside=True))
    found["softmax_copying"] = (module.copy_kernel, module.copying_launcher)
    return found


@needs_triton
def test_triton_step_right_answer_passes(tl_steps, capsys):
    check.triton_inner_step(tl_steps["ok"])
    assert capsys.readouterr().out.startswith("✔")


@needs_triton
@pytest.mark.parametrize("name, words", [
    ("no_rescale", "still the planted bug|differs"),
    ("given", "still the planted bug"),
    ("unstable", "inf/NaN"),
    ("blank", r"not written yet. Hint: rescale by alpha"),
    ("pair", "raised"),
])
def test_triton_step_wrong_answers(tl_steps, name, words):
    with pytest.raises(CheckFailure, match=words):
        check.triton_inner_step(tl_steps[name])


@needs_triton
@pytest.mark.parametrize("wrong, words", [(None, "is None"),
                                          (update_ok, "decorate it with @triton.jit")])
def test_triton_step_not_a_kernel_function(wrong, words):
    with pytest.raises(CheckFailure, match=words):
        check.triton_inner_step(wrong)


def test_triton_step_skips_cleanly_without_triton(monkeypatch, capsys):
    import course_lib.flash

    monkeypatch.setattr(course_lib.flash, "triton_available", lambda: False)
    check.triton_inner_step(None)
    assert "skipped" in capsys.readouterr().out


@needs_triton
def test_row_softmax_right_answer_passes(tl_steps, capsys):
    check.row_softmax(*tl_steps["softmax_ok"])
    assert capsys.readouterr().out.startswith("✔")


@needs_triton
def test_row_softmax_wrong_answers(tl_steps):
    kernel, _ = tl_steps["softmax_ok"]
    for answer, words in [
        (tl_steps["softmax_pad_zero"], "loaded as 0"),
        (tl_steps["softmax_unstable"], "subtract each row's max"),
        (tl_steps["softmax_unmasked_store"], "your store wrote past the row's end: mask the store"),
        (tl_steps["softmax_unmasked_load"], "your load read past the row's end: mask the load"),
        (tl_steps["softmax_no_other"], "no `other=`"),
        (tl_steps["softmax_contiguous_only"], "strided view"),
        (tl_steps["softmax_one_stride"], "own stride"),
        ((kernel, lambda x: torch.exp(x) / torch.exp(x).sum(1, keepdim=True)), "never launched"),
        ((kernel, lambda x: torch.softmax(x, -1)), "which this exercise rules out"),
        ((None, None), "is None"),
        ((update_ok, update_ok), "decorate it with @triton.jit"),
    ]:
        with pytest.raises(CheckFailure, match=words):
            check.row_softmax(*answer)


def test_row_softmax_skips_cleanly_without_triton(monkeypatch, capsys):
    import course_lib.flash

    monkeypatch.setattr(course_lib.flash, "triton_available", lambda: False)
    check.row_softmax(None, None)
    assert "skipped" in capsys.readouterr().out


@needs_triton
def test_triton_puzzles_right_answers_pass(tl_steps, capsys):
    check.add_bias_kernel(tl_steps["bias_ok"])
    check.row_mean_kernel(tl_steps["mean_ok"])
    check.row_max_kernel(tl_steps["max_ok"])
    assert capsys.readouterr().out.count("✔") == 3


@needs_triton
@pytest.mark.parametrize("checker, name, words", [
    ("add_bias_kernel", "bias_cols_only", "past the last row of `X`.*mask the rows"),
    ("add_bias_kernel", "bias_contiguous", "tile lies inside the tensor.*stride"),
    ("row_mean_kernel", "mean_by_block", "you divided by BLOCK"),
    ("row_mean_kernel", "mean_no_other", "no `other=`"),
    ("row_max_kernel", "max_first_block", "first 8 columns only"),
    ("row_max_kernel", "max_zero", "all negative"),
    ("row_max_kernel", "max_unmasked", "your load read past the row's end"),
])
def test_triton_puzzles_wrong_answers(tl_steps, checker, name, words):
    with pytest.raises(CheckFailure, match=words):
        getattr(check, checker)(tl_steps[name])


# ------------------------------------------------ compiled for a GPU first (issue 23)

CHECK_OF = {"step_ok": "triton_inner_step", "softmax_ok": "row_softmax",
            "bias_ok": "add_bias_kernel", "mean_ok": "row_mean_kernel", "max_ok": "row_max_kernel"}


def _answer(tl_steps, base: str, kind: str):
    name = f"{base}_{kind}"
    return tl_steps[name] if base == "softmax_ok" else \
        (tl_steps[name.removeprefix("step_")] if base == "step_ok" else tl_steps[name],)


@needs_triton
@pytest.mark.parametrize("base, kind", [(base, kind) for base, edits in NOT_COMPILABLE.items()
                                        for kind, _, _ in edits])
def test_a_kernel_a_gpu_cannot_compile_fails_in_words(tl_steps, base, kind):
    """NumPy or torch in the body, or Python on a block, runs in the interpreter; the check
    compiles the kernel for sm_90 first and names the cause."""
    with pytest.raises(CheckFailure, match=CANNOT_COMPILE[kind]) as info:
        getattr(check, CHECK_OF[base])(*_answer(tl_steps, base, kind))
    assert "Triton's interpreter, which runs this check" in str(info.value)
    assert "Traceback" not in str(info.value)


@needs_triton
def test_the_compile_names_numpy_and_the_line(tl_steps):
    with pytest.raises(CheckFailure) as info:
        check.row_softmax(*tl_steps["softmax_ok_numpy"])
    text = str(info.value)
    assert text.startswith("your `softmax_kernel` calls numpy.exp inside @triton.jit "
                           "(`e = np.exp(x - tl.max(x, 0))`)"), text
    assert "Use tl.exp." in text


@needs_triton
def test_the_interpreters_own_words_come_first(tl_steps):
    """A mistake the interpreter meets too keeps its words: a blank step's NotImplementedError
    (a `raise` does not compile either), a step returning a pair."""
    with pytest.raises(CheckFailure, match="not written yet. Hint: rescale by alpha"):
        check.triton_inner_step(tl_steps["blank"])
    with pytest.raises(CheckFailure, match="not enough values to unpack.*must return the triple"):
        check.triton_inner_step(tl_steps["pair"])


@needs_triton
def test_a_kernel_is_compiled_once(tl_steps, monkeypatch, capsys):
    from course_lib.checks.ch08 import compiling as _ch08_compile

    compiles = []
    real = _ch08_compile._compile
    monkeypatch.setattr(_ch08_compile, "_compile", lambda *a: compiles.append(a) or real(*a))
    check.row_mean_kernel(tl_steps["mean_ok"])
    first = len(compiles)
    check.row_mean_kernel(tl_steps["mean_ok"])
    assert len(compiles) == first  # same kernel object, same signatures: the cache answers
    assert capsys.readouterr().out.count("✔") == 2


@needs_triton
def test_a_kernel_without_source_is_refused(tl_steps):
    """exec'd code keeps no source, so it cannot be compiled: refused in words, never run."""
    import triton
    import triton.language as tl

    namespace = {"triton": triton, "tl": tl}
    exec(compile("@triton.jit\ndef mean_ok" + RIGHT["mean_ok"], "<hidden>", "exec"), namespace)
    with pytest.raises(CheckFailure, match="cannot read the source of `row_mean_kernel`"):
        check.row_mean_kernel(namespace["mean_ok"])


@needs_triton
@pytest.mark.parametrize("name, words", [
    ("softmax_outside", "returns a tensor that softmax_kernel was not given"),
    ("softmax_copying", "differs"),
    ("softmax_two_programs_a_row", "one program per row"),
])
def test_row_softmax_is_judged_on_the_checks_own_launch(tl_steps, name, words):
    """The check launches the kernel again, one program per row, on its own input (new values)
    and a fresh output: work done outside the kernel, or a kernel that copies it, fails."""
    with pytest.raises(CheckFailure, match=words):
        check.row_softmax(*tl_steps[name])
