"""Chapter 00's one check (`normalise`, the start-here notebook's demonstration) passes right
answers and turns wrong ones into feedback; tests/test_checks_generic.py runs these lists."""

import numpy as np
import torch
import torch.nn.functional as F
from checker_cases import generic_wrong_answers

from course_lib.checks import ch00 as check

CORRECT = [
    (check.normalise, lambda counts: counts / counts.sum()),
    (check.normalise, lambda counts: torch.as_tensor(counts) / float(np.sum(counts))),
]

GENERIC_WRONG = generic_wrong_answers(check.normalise.hints[0])

# torch's own normalize (an L1 norm) is the one-line answer the check rules out
REFERENCE_CALLS = [
    (check.normalise, lambda counts: F.normalize(torch.as_tensor(counts), p=1, dim=0)),
]
