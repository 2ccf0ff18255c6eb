"""The grader (being split into one module per stage)."""
from course_tools.grader.worker import *  # noqa: F401,F403
from course_tools.grader.worker import main_check, main_grade  # noqa: F401
