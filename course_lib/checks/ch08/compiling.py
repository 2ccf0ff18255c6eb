"""Compile a learner's Triton kernel for a GPU before chapter 08's checks launch it.

The checks run kernels through Triton's interpreter (TRITON_INTERPRET=1), which executes a
kernel's body as Python: a NumPy or torch call, or a Python `if` on a block, runs there although
no GPU could ever run it. So every check that takes a learner's kernel first compiles it, with
the signature of the launch the check is about to make, for an H100/H200 (sm_90), which Triton
does without a GPU or a driver (as `course_tools.gpu.compile_audit` does for the course's own
kernels), and fails in words when that compile fails.

Under the interpreter `@triton.jit` gives an InterpretedFunction, and so does every
`@triton.jit` helper of `triton.language` (tl.max, tl.sum, ...): for the compile, `compiled()`
stands real JITFunctions in for them (in triton.language, its classes, and the globals of the
learner's functions) and puts the interpreted ones back after. A result is kept per kernel
object and signature, so re-running a check cell does not compile again.

Kernel side only (called from the checks' `run`): it holds no reference and computes no answer;
what it finds is a message the run fails with (`fail`), never data the judge reads.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import re
import sys
import tempfile
import textwrap
import warnings
import weakref

from course_lib.checks._core import fail

TARGET = ("cuda", 90, 32)         # sm_90 (H100/H200), 32 threads a warp
_RESULTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel -> {key: message}
_JIT: dict = {}                   # id(InterpretedFunction) -> (it, its JITFunction)
FOREIGN = ("numpy", "torch", "scipy", "math", "random", "pandas", "jax", "cupy")
WHY = ("Triton's interpreter, which runs this check, runs a kernel's body as Python, so it ran "
       "here; a GPU runs only what Triton compiles.")


def compile_first(kernel, name: str, args: tuple, kwargs: dict, learner=None) -> str:
    """Compile `kernel` for sm_90 as `kernel[grid](*args, **kwargs)` would launch it. A kernel
    that only a GPU refuses (a call into NumPy or torch, an `if` on a block, ...) fails here,
    before it runs. Any other compile failure is returned, for the check to give after
    launching the kernel in the interpreter all the same (`if pending: fail(pending)`): a
    mistake the interpreter meets too (a step returning a pair, a blank exercise's
    NotImplementedError) is then named as it is there. '' when the kernel compiles.
    `learner`: the functions the learner wrote (default: the kernel; the first keys the
    cache), where a failure's cause is looked for."""
    learner = tuple(learner or (kernel,))
    try:
        key = _key(kernel, args, kwargs)
    except TypeError:
        return ""  # arguments that do not fit the kernel: the launch says so in its own words
    found = _RESULTS.setdefault(learner[0], {})
    if key not in found:
        found[key] = _compile(kernel, name, args, kwargs, learner)
    message, now = found[key]
    if now:
        fail(message)
    return message


def _key(kernel, args, kwargs) -> tuple:
    bound = inspect.signature(kernel.fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple((k, _kind(v)) for k, v in bound.arguments.items())


def _kind(value):
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return ("tensor", str(value.dtype))
    if isinstance(value, (bool, int, float, str, type(None))):
        return value if isinstance(value, (bool, str, type(None))) else (type(value).__name__,
                                                                       _int_width(value))
    return ("object", type(value).__name__)  # a function given as a constexpr, a dtype


def _int_width(value) -> object:
    return value if isinstance(value, float) else ("i32" if -2**31 <= value < 2**31 else "i64")


def _compile(kernel, name, args, kwargs, learner) -> tuple[str, bool]:
    """('', False) when the kernel compiles; else (the feedback, whether to give it before
    launching: a cause only a GPU refuses)."""
    import triton
    from triton.backends.compiler import GPUTarget

    for fn in learner:
        try:
            inspect.getsource(fn.fn)
        except (OSError, TypeError):
            return (f"the check cannot read the source of `{name}`, so it cannot compile it "
                    "for a GPU: define it with @triton.jit in a notebook cell (or a file) and "
                    "run that cell.", True)
    try:
        with compiled(kernel, *learner) as jit:
            source = _source(jit(kernel), args, kwargs, jit)
            with _quiet():
                triton.compile(source, target=GPUTarget(*TARGET))
    except OSError:  # Triton's own tools or cache folder, not the answer: launch uncompiled
        return "", False
    except Exception as e:  # noqa: BLE001 - every other failure is the kernel's, in words
        return _explain(e, name, learner)
    return "", False


def _source(fn, args, kwargs, jit):
    """The ASTSource of this launch: tensors as pointers of their dtype, numbers by their
    type, the parameters annotated tl.constexpr as constants (a function given as one, its
    JITFunction)."""
    import triton
    from triton.runtime.jit import mangle_type

    bound = inspect.signature(fn.fn).bind(*args, **kwargs)
    bound.apply_defaults()
    constexpr = {p.name for p in fn.params if p.is_constexpr}
    signature, constants = {}, {}
    for arg, value in bound.arguments.items():
        if arg in constexpr or value is None:
            signature[arg] = "constexpr"
            constants[arg] = jit(value) if _interpreted(value) else value
        else:
            signature[arg] = mangle_type(value)
    return triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constants)


def _interpreted(obj) -> bool:
    return type(obj).__name__ == "InterpretedFunction"


@contextlib.contextmanager
def compiled(*functions):
    """Real JITFunctions in place of interpreted ones, in triton.language (its modules, and its
    classes' methods) and the globals of `functions`, for the duration; yields a function that
    maps an InterpretedFunction to its JITFunction. Everything in triton.language is put back
    as it was after, whatever the compile did (an interpreted helper called by mistake patches
    triton.language for the interpreter and would leave it so)."""
    from triton.runtime.jit import JITFunction

    def jit(fn):
        if not _interpreted(fn):
            return fn
        if id(fn) not in _JIT or _JIT[id(fn)][0] is not fn:
            _JIT[id(fn)] = (fn, JITFunction(fn.fn))
        return _JIT[id(fn)][1]

    modules = [m for n, m in list(sys.modules.items()) if n.startswith("triton.language")]
    classes = list({id(c): c for m in modules for c in vars(m).values()
                    if isinstance(c, type) and c.__module__.startswith("triton.language")}
                   .values())
    before = {id(p): (p, dict(vars(p))) for p in modules + classes}
    learners = list({id(g): g for g in (getattr(f, "fn", f).__globals__ for f in functions
                                        if hasattr(f, "fn"))}.values())
    swapped = []
    try:
        for space in [vars(m) for m in modules] + learners:
            for attr, value in list(space.items()):
                if _interpreted(value):
                    with contextlib.suppress(OSError, TypeError):  # no source: left interpreted
                        space[attr] = jit(value)
                        swapped.append((space, attr, value))
        for cls in classes:
            for attr, value in list(vars(cls).items()):
                inner = _wrapped(value)
                if inner is not None:  # tensor.sum: a member that forwards to tl.sum
                    setattr(cls, attr, jit(inner))
        _unpatch(modules + classes)
        yield jit
    finally:
        for space, attr, value in swapped:
            space[attr] = value
        for place, saved in before.values():
            now = vars(place)
            for attr in [a for a in now if a not in saved]:
                _set(place, attr, None, delete=True)
            for attr, value in saved.items():
                if now.get(attr, _set) is not value:
                    _set(place, attr, value)


def _unpatch(places) -> None:
    """Undo what the interpreter left patched. A launch patches triton.language for itself and
    restores it after, but each interpreted helper it calls (tl.max, tl.sum) patches
    triton.language.core again and never restores it: the compiler would then build with the
    interpreter's builtins. A patched builtin keeps the original as its `member`; the other
    patched names (range, static_assert, multiple_of, ...) are re-exported, unpatched, by
    triton.language."""
    import triton.language as tl

    for place in places:
        for attr, value in list(vars(place).items()):
            if not _patched(value):
                continue
            original = value
            while _patched(original) and "member" in (getattr(original, "__kwdefaults__", None)
                                                      or {}):
                original = original.__kwdefaults__["member"]
            if _patched(original):
                original = next((v for v in (vars(tl).get(attr), vars(tl.core).get(attr))
                                 if v is not None and not _patched(v)), None)
            if original is not None:
                _set(place, attr, original)


def _patched(value) -> bool:
    fn = value.func if hasattr(value, "func") and hasattr(value, "keywords") else value
    fn = value.fget if isinstance(value, property) else fn
    return getattr(fn, "__module__", None) == "triton.runtime.interpreter" and \
        not isinstance(fn, type)


def _wrapped(value):
    """The interpreted function a tensor member forwards to (`_tensor_member_fn`), or None."""
    if _interpreted(value):
        return value
    for cell in getattr(value, "__closure__", None) or ():
        with contextlib.suppress(ValueError):
            if _interpreted(cell.cell_contents):
                return cell.cell_contents
    return None


def _set(place, attr, value, delete=False):
    if isinstance(place, type):
        delattr(place, attr) if delete else setattr(place, attr, value)
    elif delete:
        del vars(place)[attr]
    else:
        vars(place)[attr] = value


@contextlib.contextmanager
def _quiet():
    """Triton's compiler prints MLIR diagnostics on the process's own stdout/stderr (which a
    notebook shows) and warns about its options: neither is the learner's to read."""
    import triton

    cache = triton.knobs.cache
    if not _writable(cache.dir):  # a sandbox without a home: compile into a scratch folder
        cache.dir = tempfile.mkdtemp(prefix="course-triton-")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _writable(folder: str) -> bool:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


# ------------------------------------------------------------------------- the words

_REASONS = (
    (r"Boolean value of Tensor with more than one value is ambiguous|error encountered during "
     r"parsing",
     "a Python `if` or `while` on a block: a block of lanes has no single truth value. Choose "
     "per lane with tl.where(condition, a, b), or reduce the block to one number first "
     "(tl.max, tl.sum)", True),
    (r"_semantic. argument must be provided outside",
     "a block indexed or iterated like a Python list (x[i]): a block is not a list. Reduce it "
     "with tl.sum / tl.max, or work on every lane at once", True),
    (r"arange's arguments must be of type tl.constexpr",
     "tl.arange with a bound known only at run time: its bounds must be tl.constexpr (a BLOCK "
     "parameter); mask the lanes past n_cols instead", True),
    (r"NameError\('(\w+) is not defined'\)",
     "Python's built-in `{0}`, which does not exist inside a kernel: use the tl.* operation "
     "(tl.sum, tl.max, ...)", True),
    (r"unsupported AST node type: Raise",
     "a Python `raise`: a kernel cannot raise (tl.device_assert checks a condition on a GPU)",
     False),  # a blank exercise: the interpreter's NotImplementedError names it better
    (r"is not string",
     "Python's print: inside a kernel use tl.device_print(\"x\", x) (or tl.static_print)", True),
)


def _explain(error: BaseException, name: str, learner: tuple) -> tuple[str, bool]:
    foreign = _foreign_call(error, learner)
    if foreign is not None:
        called, line, instead = foreign
        return (f"your `{name}` calls {called} inside @triton.jit (`{line}`): a GPU kernel can "
                "only use tl.* operations on blocks, so Triton cannot compile it for a GPU. "
                f"{WHY} {instead}", True)
    inner = _innermost(error)
    text = str(getattr(inner, "error_message", None) or inner).strip()
    where = _line(inner)
    for pattern, words, immediate in _REASONS:
        found = re.search(pattern, text)
        if found:
            reason, now = words.format(*found.groups()), immediate
            break
    else:
        last = text.splitlines()[-1] if text else type(inner).__name__
        reason, now = f"Triton's compiler says: {last[:300]}", False
    return (f"Triton cannot compile `{name}` for a GPU{f' (at `{where}`)' if where else ''}: "
            f"{reason}. {WHY}", now)


def _innermost(error: BaseException) -> BaseException:
    """The deepest CompilationError in the chain (a call into a helper nests them)."""
    from triton.compiler.errors import CompilationError

    found, seen = error, set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, CompilationError):
            found = error
        error = error.__cause__ or error.__context__
    return found


def _line(error) -> str:
    node, src = getattr(error, "node", None), getattr(error, "src", None)
    if src is None or not hasattr(node, "lineno"):
        return ""
    lines = src.split("\n")
    return lines[node.lineno - 1].strip()[:120] if 0 < node.lineno <= len(lines) else ""


def _foreign_call(error: BaseException, learner: tuple):
    """(what is called, the line, what to use instead) when the compile refused a reference to
    NumPy, torch, math, ... in the learner's kernels: the object the error names, or the one
    on the line it points at."""
    import triton.language as tl

    text, line = str(error), _line(_innermost(error))
    refused = re.search(r"Unsupported function referenced: <(?:function|built-in method|ufunc) "
                        r"'?(\w+)", text)
    for fn in learner:
        py = getattr(fn, "fn", fn)
        try:
            source = textwrap.dedent(inspect.getsource(py))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute | ast.Name)]
        for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
            lineno = node.lineno
            obj, named = _resolve(node, py.__globals__)
            if named is None:
                continue
            here = lines[lineno - 1].strip()
            if _shown(obj) in text or (line and here[:120] == line) or \
                    (refused and named.rsplit(".", 1)[-1] == refused.group(1)):
                attr = named.rsplit(".", 1)[-1]
                instead = (f"Use tl.{attr}." if hasattr(tl, attr) and attr != "softmax" else
                           "Write it from tl.* operations (tl.exp, tl.max, tl.sum, tl.where, ...).")
                return named, here[:120], instead
    return None


def _shown(obj) -> str:
    try:
        return repr(obj)
    except Exception:  # noqa: BLE001 - an object whose repr fails names nothing
        return "\0"


def _resolve(node, namespace):
    """The object an `a.b.c` expression names in `namespace`, and its dotted name from its
    module (numpy.exp for np.exp) when that module is NumPy, torch, math, ...; else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in namespace:
        return None, None
    root = obj = namespace[node.id]
    for part in reversed(parts):
        obj = getattr(obj, part, None)
        if obj is None:
            return None, None
    if inspect.ismodule(obj):
        return None, None
    if inspect.ismodule(root) and root.__name__.split(".")[0] in FOREIGN:
        return obj, ".".join([root.__name__, *reversed(parts)])
    module = getattr(obj, "__module__", None) or ""
    if not parts and module.split(".")[0] in FOREIGN:  # from numpy import exp
        return obj, f"{module}.{node.id}"
    return None, None
