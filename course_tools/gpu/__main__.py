"""`python -m course_tools.gpu ...` is the GPU check (tools/gpu_check.sh)."""

import sys

from course_tools.gpu.check import main

sys.exit(main())
