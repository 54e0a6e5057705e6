"""Many worker processes on shared sessions through the full engine, on SQLite and PostgreSQL
(:mod:`ce.core.testing.load`): nothing lost, nothing duplicated, version conflicts met and
retried, and a worker SIGKILLed mid-turn leaves every engine call wholly stored or absent."""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
from pathlib import Path

import pytest

from ce.core.schema import Message, ModelInvocation, Role, ToolCallRequest
from ce.core.stores import SessionChanges, open_store
from ce.core.stores._sqlite_locks import supported as locks_supported
from ce.core.testing.load import (
    STEPS,
    KillPoint,
    LoadConfig,
    check_sessions,
    log_path,
    main,
    read_log,
    run_load,
)

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store shared by the worker processes: an SQLite file, or a schema of its own
    in the test database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/load.db"
    dsn: str = request.getfixturevalue("postgres_dsn")
    return f"{dsn}?ce_schema=load_{secrets.token_hex(4)}"


def test_workers_on_shared_sessions_lose_and_duplicate_nothing(store_url: str) -> None:
    config = LoadConfig(store_url, workers=4, turns=15, sessions=2, timeout=120)
    result = run_load(config)
    check = result.check
    assert check.problems == []
    assert (check.lost, check.duplicated, check.unacknowledged) == (0, 0, 0)
    assert (check.orphan_tool_results, check.unanswered_tool_calls) == (0, 0)
    assert (check.partial_operations, check.pair_failures) == (0, 0)
    assert result.turns == check.turns_acknowledged == check.turns_complete == 60
    assert check.operations_acknowledged == 60 * len(STEPS)
    assert all(w.exit_code == 0 and w.turns_done == 15 for w in result.workers)
    if store_url.startswith("sqlite") and locks_supported():
        # the engine holds the session for every write (the store's per-session lock):
        # no commit is ever refused
        assert result.conflicts == 0
    else:
        # the workers really wrote one session at once: the store refused stale commits,
        # and the engine did each refused call again holding the session
        assert result.conflicts > 0
    assert result.retries == 0  # none reached a worker
    assert 0 < result.turn_ms(50) <= result.turn_ms(95)


# (kill point, step in flight, what the store holds of it, call left without its result)
KILLS = [
    # between two engine calls: the assistant's tool call is stored, its result never comes;
    # the call stays unanswered and out of every assembled input
    (KillPoint(0, 2, "model_call_tool", "acknowledged"), "ingest_result", "none", True),
    # after prepare_turn's commit, before the caller heard of it: the user message and its
    # turn record are both stored
    (KillPoint(1, 2, "prepare_turn", "committed"), "prepare_turn", "all", False),
    # after record_tool_call's commit: the tool call record is stored; the tool message (the
    # next prepare_call records it) is not
    (KillPoint(2, 2, "record_tool_call", "committed"), "record_tool_call", "all", True),
    # after record_model_call's commit: the answer, its llm_output evidence and its usage
    (KillPoint(3, 2, "model_call_answer", "committed"), "model_call_answer", "all", False),
]


def test_workers_killed_mid_turn_leave_each_engine_call_whole_or_absent(store_url: str) -> None:
    kills = tuple(kill for kill, *_ in KILLS)
    config = LoadConfig(store_url, workers=5, turns=5, sessions=1, kills=kills, timeout=120)
    result = run_load(config)
    check = result.check
    assert check.problems == []
    landed = [
        (k.worker, k.turn, k.in_flight, k.in_flight_stored, k.unanswered_call) for k in result.kills
    ]
    assert landed == [
        (kill.worker, 2, in_flight, stored, unanswered)
        for kill, in_flight, stored, unanswered in KILLS
    ]
    assert check.unanswered_tool_calls == 2
    assert (check.lost, check.duplicated, check.unacknowledged, check.partial_operations) == (
        0,
        0,
        0,
        0,
    )
    assert check.orphan_tool_results == check.pair_failures == 0
    *victims, survivor = result.workers
    assert all(w.killed and w.turns_done == 2 for w in victims)
    assert survivor.exit_code == 0 and survivor.turns_done == 5
    assert check.turns_complete == check.turns_acknowledged == 4 * 2 + 5


def test_the_command_line_runs_and_the_checker_fails_on_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "load.db"
    args = ["--store", f"sqlite:///{db}", "--workers", "2", "--turns", "2", "--sessions", "1"]
    extra = ["--model-ms", "1", "--routing", "sticky"]
    assert main([*args, "--log-dir", str(tmp_path), "--json", *extra]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["turns"] == 4 and figures["check"]["ok"] is True
    assert (figures["model_ms"], figures["routing"]) == (1.0, "sticky")
    assert figures["check"]["lost"] == figures["check"]["duplicated"] == 0
    run_id = figures["run_id"]
    session_id = f"{run_id}-s0"
    logs = [read_log(log_path(tmp_path, run_id, w), w)[1] for w in range(2)]
    with sqlite3.connect(db) as conn:  # an acknowledged usage record disappears
        conn.execute("DELETE FROM model_usage WHERE model_usage_id LIKE '%-w1-t1-usage-2'")

    async def damage() -> None:
        store = open_store(f"sqlite:///{db}")
        stray = Message(
            role=Role.ASSISTANT,
            content="",
            tool_calls=[ToolCallRequest(tool_call_id="stray-call", name="lookup")],
            invocation=ModelInvocation(provider="openai", model="gpt-4o"),
            message_id="stray-call-message",
        )
        orphan = Message(role=Role.TOOL, content="?", tool_call_id="nobody", message_id="orphan")
        doc = await store.get_session(session_id)
        assert doc is not None
        again = doc.session.messages[0].model_copy(update={"message_id": "again"})
        await store.commit(session_id, SessionChanges(messages=[stray, orphan, again]))
        await store.close()

    asyncio.run(damage())
    check, _ = asyncio.run(check_sessions(f"sqlite:///{db}", run_id, [session_id], 2, logs))
    assert not check.ok
    assert (check.lost, check.duplicated) == (1, 1)
    assert (check.orphan_tool_results, check.unanswered_tool_calls) == (1, 1)
    assert check.turns_complete == check.turns_acknowledged - 1 == 3


@pytest.mark.parametrize(
    "url",
    ["memory://", "postgresql://postgres@db.example.com/test", "redis://127.0.0.1"],
)
def test_only_shared_local_stores_are_driven(url: str) -> None:
    with pytest.raises(ValueError):
        run_load(LoadConfig(url))


@pytest.mark.parametrize(
    ("field", "value"), [("model_ms", -1.0), ("model_ms", 60_000.0), ("routing", "random")]
)
def test_a_model_time_or_routing_out_of_range_is_refused(
    tmp_path: Path, field: str, value: object
) -> None:
    config = LoadConfig(f"sqlite:///{tmp_path}/load.db", **{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=field):
        run_load(config)
