"""The trap behind `forbid`: within a check's run, an answer that calls the course's own
implementation of the exercise (or torch's) fails, however it reaches it.

A `(module, "name")` target is replaced by a function that raises for the block's duration, and
a profile hook on the target's code objects records every call the learner's code makes to it
by any other path (an alias bound before the check, a wrapper, a partial, a subclass, the
reference handed in as the answer). Frames are told apart by where their code lives
(`_file_kind`: the course, an installed library, or the learner). The grader reads the
answer's source too (course_tools/grader/reach.py); this trap is what runs in the kernel.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import sysconfig
import threading
from typing import Any

from course_lib.checks._core import CheckFailure, call


class ReferenceCall(CheckFailure):
    """The learner's answer ran the course's own reference implementation (see `forbid`).

    `reference` names what it ran (`course_lib.lookup.soft_lookup`), or `sys.setprofile` when the
    answer switched off the call tracking; the grader flags the exercise with it."""

    def __init__(self, message: str = "", reference: str = ""):
        super().__init__(message)
        self.reference = reference


def _library_dirs() -> tuple[str, ...]:
    """Where installed code lives (stdlib, site-packages): neither learner nor course code."""
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            dirs.add(os.path.realpath(sysconfig.get_paths()[key]))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        dirs.add(os.path.realpath(os.path.join(prefix, "lib")))
    return tuple(sorted(d.rstrip(os.sep) + os.sep for d in dirs))


_COURSE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # course_lib/
_LIBRARY_DIRS = _library_dirs()
_file_kinds: dict[str, str] = {}


def _file_kind(filename: str) -> str:
    """'course' (course_lib), 'library' (stdlib, site-packages, frozen) or 'learner' (the rest)."""
    kind = _file_kinds.get(filename)
    if kind is None:
        path = os.path.realpath(filename) if not filename.startswith("<") else filename
        if path.startswith(_COURSE_DIR):
            kind = "course"
        elif filename.startswith("<frozen") or path.startswith(_LIBRARY_DIRS):
            kind = "library"
        else:  # notebook cells (/tmp/ipykernel_*/...), the learner's own modules, exec'd strings
            kind = "learner"
        _file_kinds[filename] = kind
    return kind


def _unwrap(obj: Any, depth: int = 0) -> list[Any]:
    """The function objects a callable runs: itself, wrapped/partial targets, bound methods,
    and for a class every function defined on it (and on its course_lib bases)."""
    if depth > 4 or obj is None:
        return []
    found: list[Any] = []
    if isinstance(obj, functools.partial):
        return _unwrap(obj.func, depth + 1)
    if isinstance(obj, (staticmethod, classmethod)):
        return _unwrap(obj.__func__, depth + 1)
    if isinstance(obj, property):
        return [f for part in (obj.fget, obj.fset) for f in _unwrap(part, depth + 1)]
    if inspect.ismethod(obj):
        return _unwrap(obj.__func__, depth + 1)
    if isinstance(obj, type):
        for klass in obj.__mro__:
            file = getattr(inspect.getmodule(klass), "__file__", None) or "<?>"
            if klass is object or _file_kind(file) != "course":
                continue
            for member in vars(klass).values():
                found.extend(_unwrap(member, depth + 1))
        return found
    found.append(obj)
    if getattr(obj, "__wrapped__", None) is not None:
        found.extend(_unwrap(obj.__wrapped__, depth + 1))
    return found


def _code_key(code: Any) -> tuple:
    # Survives importlib.reload (a new code object compiled from the same place).
    return (code.co_filename, code.co_firstlineno, code.co_name)


def _target_name(owner: Any, attr: str) -> str:
    """`course_lib.lookup.soft_lookup`; for a class, `...multihead.MultiHeadAttention.forward`."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}.{attr}"
    return f"{getattr(owner, '__name__', owner)}.{attr}"


class _Forbid:
    """The context manager behind `forbid`; see its docstring."""

    def __init__(self, targets: tuple[tuple[Any, str], ...], exercise: str):
        self.targets = targets
        self.exercise = exercise
        self.hits: list[str] = []
        self.originals: list[tuple[Any, str, Any]] = []
        self.codes: dict[Any, str] = {}      # code object -> reference name
        self.keys: dict[tuple, str] = {}     # (file, line, name) -> reference name
        self.builtins: dict[int, str] = {}   # id(builtin function) -> reference name
        self.keep_alive: list[Any] = []
        for module, attr in targets:
            name = _target_name(module, attr)
            for fn in _unwrap(getattr(module, attr)):
                code = getattr(fn, "__code__", None)
                if code is not None:
                    self.codes[code] = name
                    self.keys[_code_key(code)] = name
                elif callable(fn):
                    self.builtins[id(fn)] = name
                    self.keep_alive.append(fn)

    def _message(self, name: str) -> str:
        whose = "the course's own " if name.startswith("course_lib") else ""
        return (f"{self.exercise}: your answer calls {whose}`{name}`, which this exercise rules "
                "out. Write it yourself from the operations the chapter used; that is the "
                "exercise.")

    def _make_trap(self, name: str):
        def trap(*args, **kwargs):
            self.hits.append(name)
            raise ReferenceCall(self._message(name), reference=name)
        return trap

    def _from_learner(self, frame: Any) -> bool:
        """Did the learner's code make this call? Walk from the caller up to the checker that
        opened the block: a learner frame, or `call()` running the learner's function, says yes;
        only course/library frames (the checker computing its own reference) say no."""
        call_code = call.__code__
        while frame is not None:
            if frame is self.owner:
                return False
            code = frame.f_code
            if code is call_code or _file_kind(code.co_filename) == "learner":
                return True
            frame = frame.f_back
        return True  # not below the checker at all (another thread): not the checker's own call

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        # Never raise here: Python would switch the hook off, which __exit__ reads as tampering.
        try:
            if event == "call":
                code = frame.f_code
                name = self.codes.get(code) or self.keys.get(_code_key(code))
                if name is not None and self._from_learner(frame.f_back):
                    self.hits.append(name)
            elif event == "c_call" and id(arg) in self.builtins and self._from_learner(frame):
                self.hits.append(self.builtins[id(arg)])
        except Exception:  # noqa: BLE001
            pass
        if self.previous_profile is not None:
            with contextlib.suppress(Exception):
                self.previous_profile(frame, event, arg)

    def _arguments_are_reference(self) -> None:
        """The checker's own arguments (the learner's answer) must not BE the reference."""
        code = self.owner.f_code
        n_args = code.co_argcount + code.co_kwonlyargcount
        for var in code.co_varnames[:n_args]:
            value = self.owner.f_locals.get(var)
            values = value if isinstance(value, (tuple, list)) else (value,)  # *learner_objs
            for fn in (f for v in values if v is not None and callable(v) for f in _unwrap(v)):
                c = getattr(fn, "__code__", None)
                name = (self.codes.get(c) or self.keys.get(_code_key(c))) if c is not None \
                    else self.builtins.get(id(fn))
                if name is not None:
                    self.hits.append(name)

    def __enter__(self):
        self.owner = sys._getframe(1)
        self._arguments_are_reference()
        for module, attr in self.targets:
            self.originals.append((module, attr, getattr(module, attr)))
            setattr(module, attr, self._make_trap(_target_name(module, attr)))
        self.previous_profile = sys.getprofile()
        self.previous_thread_profile = threading.getprofile()
        self.hook = self._profile  # one bound-method object, so __exit__ can recognise it
        sys.setprofile(self.hook)
        threading.setprofile(self.hook)
        return self

    def __exit__(self, exc_type, exc, tb):
        tampered = sys.getprofile() is not self.hook
        sys.setprofile(self.previous_profile)
        threading.setprofile(self.previous_thread_profile)
        for module, attr, original in reversed(self.originals):
            setattr(module, attr, original)
        self.owner = None  # no reference cycle through the frame
        if exc_type is not None and not issubclass(exc_type, Exception):
            return False  # KeyboardInterrupt, SystemExit: let them through untouched
        if self.hits:
            raise ReferenceCall(self._message(self.hits[0]), reference=self.hits[0]) from exc
        if tampered:
            raise ReferenceCall(f"{self.exercise}: your answer switched off the checker's call "
                                "tracking (sys.setprofile); answers must not touch the checker.",
                                reference="sys.setprofile") from exc
        return False


def forbid(*targets: tuple[Any, str], exercise: str) -> _Forbid:
    """Within the block, an answer that runs any `(module, "name")` target fails the check.

    An exercise that asks the learner to write, say, softmax must not be answered by calling the
    course's own softmax; the grader wraps the check in this so such an answer earns no points.
    It raises `ReferenceCall` (a `CheckFailure`) on leaving the block when the learner's code ran
    the reference in any form: through the module attribute, an alias imported before the check
    (`from course_lib.lookup import soft_lookup as mine`), a wrapper, a `functools.partial`, a
    subclass, or the reference passed as the answer itself. Catching the error inside the answer
    does not help: the call is recorded by a profile hook on the reference's code object. The
    checker's own calls to the reference inside the block (through an alias, or via other
    course_lib code) do not count; calls through the module attribute fail, as they always did.
    Compute the expected values outside the block (or call the reference directly, never through
    `call()`, which is how the learner's code is recognised).
    """
    return _Forbid(targets, exercise)

