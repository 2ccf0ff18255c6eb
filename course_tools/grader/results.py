"""Results: one per exercise, one per submission (what every later stage fills in)."""

from __future__ import annotations

from dataclasses import dataclass, field

PASSED = "passed"
CELL_MISSING = "cell missing"
FLAG = "FLAGGED: "


@dataclass
class ExerciseResult:
    id: str
    score: float
    max_score: float
    feedback: str
    flagged: bool = False  # tampering or the course's own reference: 0 points, worth a look
    hint: str = ""  # the `# HINT:` of its answer cells (shown by `course check`)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "score": _num(self.score),
            "max_score": _num(self.max_score),
            "feedback": self.feedback,
            "flagged": self.flagged,
        }


@dataclass
class SubmissionResult:
    submission: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None
    source: str | None = None  # the solutions/ notebook it was matched to
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(e.score for e in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(e.max_score for e in self.exercises)

    def to_json(self) -> dict:
        return {
            "submission": self.submission,
            "score": _num(self.score),
            "max_score": _num(self.max_score),
            "exercises": [e.to_json() for e in self.exercises],
            "error": self.error,
        }


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(float(x), 4)
