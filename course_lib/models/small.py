"""Chapters 05-06's small models and toy tasks, under the name the notebooks import them by.

They live in one module per chapter: `course_lib.models.heads` (chapter 05: the bracket task and
its heads model) and `course_lib.models.recall` (chapter 06: the recall task and its models).
"""

from course_lib.models.heads import BracketTask, HeadsModel
from course_lib.models.recall import (
    AttentionRecallModel,
    RecurrentModel,
    accuracy_by_distance,
    recall_batch,
    recall_distances,
)

__all__ = ["BracketTask", "HeadsModel", "recall_batch", "recall_distances", "RecurrentModel",
           "AttentionRecallModel", "accuracy_by_distance"]
