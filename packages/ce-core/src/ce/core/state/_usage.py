"""Model usage summed per task (``ModelUsage.task_id``): what each task of a crew or a plan
cost."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ce.core.schema import ModelUsage

__all__ = ["TaskUsage", "usage_by_task"]


@dataclass
class TaskUsage:
    """The model calls of one task and their tokens."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


def usage_by_task(records: Iterable[ModelUsage]) -> dict[str, TaskUsage]:
    """The usage records that name a task, summed per task id (in the order each task first
    appears); records without a task are left out."""
    totals: dict[str, TaskUsage] = {}
    for record in records:
        if record.task_id:
            row = totals.setdefault(record.task_id, TaskUsage())
            row.calls += 1
            row.prompt_tokens += record.prompt_tokens
            row.completion_tokens += record.completion_tokens
            row.total_tokens += record.total_tokens
    return totals
