"""course_lib.env: what chapter 00 prints about the machine holds no path of it."""

import os
import sys

import torch

from course_lib.env import environment_report


def test_environment_report_names_the_environment_without_a_path():
    report = environment_report()
    assert report["cpu capability"] == torch.backends.cpu.get_cpu_capability()
    assert os.sep not in report["environment"] and sys.prefix not in report["environment"]
    assert all(sys.executable not in value for value in report.values())
