"""The library's other routes to an exercise's answer, for the `forbid=` lists of several chapters.

Writing softmax is not answered by `torch.special.softmax` or `log_softmax(...).exp()`, nor
attention by the course's `naive_attention` from chapter 08 or torch's SDPA. In the kernel each
target is trapped (`_core.forbid`); the grader also reads their names in the learner's source
(`course_tools/grader/reach.py`) and, for the course's own functions, stubs them there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import course_lib.attention as attention
import course_lib.flash as flash
import course_lib.lookup as lookup

SOFTMAX = ((attention, "softmax"), (torch, "softmax"), (F, "softmax"), (torch.Tensor, "softmax"),
           (torch, "log_softmax"), (F, "log_softmax"), (torch.Tensor, "log_softmax"),
           (torch.special, "softmax"), (nn.Softmax, "forward"), (nn.LogSoftmax, "forward"))
ATTENTION = ((attention, "scaled_dot_product_attention"), (F, "scaled_dot_product_attention"),
             (F, "multi_head_attention_forward"), (nn.MultiheadAttention, "forward"),
             (flash, "naive_attention"), (flash, "tiled_attention"), (flash, "flash_attention"),
             (lookup, "soft_lookup"))
