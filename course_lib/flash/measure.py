"""Chapter 08 imports its measurements from here; they live in `course_lib.measure`."""

from course_lib.measure import best_time, peak_bytes

__all__ = ["peak_bytes", "best_time"]
