"""Test-session set-up shared by every test module.

Triton decides once, when it is first imported, whether its kernels are compiled or run through
its CPU interpreter, and torch's profiler and FLOP counter import it as a side effect. Importing
`course_lib.flash` first sets TRITON_INTERPRET=1 on a machine without a CUDA GPU (and does nothing
on one with a GPU), so the kernel tests work whichever test module a worker happens to run first.
"""

import course_lib.flash  # noqa: F401  (sets TRITON_INTERPRET=1 when there is no CUDA GPU)
