"""Checkers for exercises/08_efficient_kernel.ipynb, one module a part of the chapter:

* `tiling`: the online-softmax update that survives a fully masked tile (build), causal tiled
  attention (build), and predicting, explaining and measuring what causal tiling saves;
* `kernels`: the Triton step with a rescale forgotten (debug) and a whole row-softmax kernel
  with its launch (build);
* `puzzles`: three Triton puzzles (a masked 2-D tile, a row reduction, a loop over blocks);
* `backward`: the FlashAttention backward pass in plain torch (build);
* `guard` and `compiling`: how a learner's Triton kernel is run (on guarded buffers, through
  Triton's interpreter) and compiled for sm_90; they judge nothing.

A notebook imports the package (`from course_lib.checks import ch08 as check`) and finds every
check here.
"""

from course_lib.checks._hints import hint
from course_lib.checks.ch08.backward import flash_backward
from course_lib.checks.ch08.kernels import row_softmax, triton_inner_step
from course_lib.checks.ch08.puzzles import add_bias_kernel, row_max_kernel, row_mean_kernel
from course_lib.checks.ch08.tiling import (
    causal_fraction,
    causal_tiled,
    fraction_why,
    measured_causal_fraction,
    online_update,
)

SOLUTION = "solutions/08_efficient_kernel.ipynb"

__all__ = ["online_update", "causal_tiled", "causal_fraction", "fraction_why",
           "measured_causal_fraction",
           "triton_inner_step", "add_bias_kernel", "row_mean_kernel", "row_max_kernel",
           "row_softmax", "flash_backward", "hint"]
