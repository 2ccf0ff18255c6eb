"""The grader, one module per stage (in the spirit of nbgrader's converters):

read -> match -> assemble -> run (run.py in the grader, worker.py in its subprocess, launcher.py
in the kernel's process; preflight.py: the course's first cell) -> score -> report; scan.py and
reach.py read the learner's source on the grader's side (for_nbgrader.py does that for
nbgrader's autograde); limits.py holds the limits run.py and the worker share; `pipeline.py`
chains the stages. `course grade` and `course check` call `pipeline`.
"""

from course_tools.grader.assemble import Plan, RunCell, assemble
from course_tools.grader.match import match_source
from course_tools.grader.pipeline import default_jobs, grade, grade_one, main_check, main_grade
from course_tools.grader.preflight import GradingEnvironmentError
from course_tools.grader.read import (
                                      Source,
                                      default_check_dir,
                                      default_solutions_dir,
                                      file_digest,
                                      load_sources,
)
from course_tools.grader.report import format_csv, format_json, format_table
from course_tools.grader.results import CELL_MISSING, FLAG, PASSED, ExerciseResult, SubmissionResult
from course_tools.grader.score import score

__all__ = ["CELL_MISSING", "FLAG", "PASSED", "ExerciseResult", "GradingEnvironmentError", "Plan",
           "RunCell", "Source",
           "SubmissionResult", "assemble", "default_check_dir", "default_jobs",
           "default_solutions_dir", "file_digest", "format_csv", "format_json", "format_table",
           "grade", "grade_one", "load_sources", "main_check", "main_grade", "match_source",
           "score"]
