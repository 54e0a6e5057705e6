"""Model usage summed per task: ``usage_by_task`` over usage records and the engine's
``get_usage_by_task`` (what ``ce report`` prints beside a turn's report)."""

from __future__ import annotations

import pytest

from ce.core.errors import SessionNotFoundError
from ce.core.schema import ModelUsage
from ce.core.state import TaskUsage, usage_by_task
from ce.core.testing import deterministic_engine


def _usage(usage_id: str, task_id: str | None, prompt: int, completion: int) -> ModelUsage:
    return ModelUsage(
        model_usage_id=usage_id,
        provider="openai",
        model="gpt-4o-mini",
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        task_id=task_id,
    )


def test_usage_is_summed_per_task_in_first_seen_order() -> None:
    records = [
        _usage("u1", "k:write", 5, 1),
        _usage("u2", "k:research", 30, 3),
        _usage("u3", None, 100, 100),
        _usage("u4", "k:write", 7, 2),
    ]
    totals = usage_by_task(records)
    assert list(totals) == ["k:write", "k:research"]
    assert totals["k:write"] == TaskUsage(
        calls=2, prompt_tokens=12, completion_tokens=3, total_tokens=15
    )
    assert totals["k:research"] == TaskUsage(1, 30, 3, 33)


async def test_the_engine_sums_a_sessions_usage_per_task_deferred_records_included() -> None:
    engine = deterministic_engine()
    try:
        await engine.record_model_call("s", _usage("u1", "k:research", 30, 3))
        await engine.record_model_call("s", _usage("u2", None, 9, 9))

        async def later() -> None:
            await engine.record_model_call("s", _usage("u3", "k:research", 40, 4))

        engine.defer("s", later)  # a plugin's write-behind record
        totals = await engine.get_usage_by_task("s")
        assert totals == {"k:research": TaskUsage(2, 70, 7, 77)}
        assert await engine.get_usage_by_task("s") == totals  # reading changes nothing
        with pytest.raises(SessionNotFoundError):
            await engine.get_usage_by_task("nobody")
    finally:
        await engine.close()


def test_the_blocking_twin() -> None:
    engine = deterministic_engine()
    try:
        engine.sync.record_model_call("s", _usage("u1", "k:a", 1, 1))
        assert engine.sync.get_usage_by_task("s") == {"k:a": TaskUsage(1, 1, 1, 2)}
    finally:
        engine.sync.run(engine.close())
