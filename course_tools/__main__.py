"""`python -m course_tools ...` is the `course` command."""

import sys

from course_tools.cli import main

sys.exit(main())
