"""Test-session set-up shared by every test module.

Triton decides once, when it is first imported, whether its kernels are compiled or run through
its CPU interpreter, and torch's profiler and FLOP counter import it as a side effect. Importing
`course_lib.flash` first sets TRITON_INTERPRET=1 on a machine without a CUDA GPU (and does nothing
on one with a GPU), so the kernel tests work whichever test module a worker happens to run first.

The test command runs the files on its workers a file at a time (`--dist loadfile`, so a
module's fixtures are made once). The longest files go out first, so that the workers
finish together: xdist would otherwise order files by their number of tests.
"""

import pytest

import course_lib.flash  # noqa: F401  (sets TRITON_INTERPRET=1 when there is no CUDA GPU)

# Files whose one fixture takes minutes, longest first: the shared graded batch (every chapter
# graded), then the lecture notebooks run in a real JupyterLab. A file missing here only
# costs time at the end of a run.
FIRST = ("tests/test_graded_batch.py", "tests/browser/test_explorers_in_lab.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            for scope in reversed(FIRST):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
