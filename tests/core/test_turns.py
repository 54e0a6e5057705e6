"""The event loop's turn (``ce.core._drive``): engine calls on one loop take it one at a time;
a call coming back from a wait goes before calls that have not started, records written in
the background go last, and a call keeps its turn for the records it runs first."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ce.core._drive import _BACKGROUND, _RESUMING, _STARTING, _Turn, engine_turn, idle_turn
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.integration import (
    ModelCall,
    Plugin,
    Recorder,
    message_from_openai,
    prepare_openai,
    record_sync,
)
from ce.core.schema import Message, ModelUsage, Role
from ce.core.stores import SQLiteStore


async def test_the_turn_goes_to_a_resuming_flow_then_starting_ones_then_the_background() -> None:
    turn = _Turn()
    await turn.acquire()
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        await turn.acquire(priority)
        order.append(name)
        turn.release()

    tasks = [
        asyncio.create_task(wait("background", _BACKGROUND)),
        asyncio.create_task(wait("first call", _STARTING)),
        asyncio.create_task(wait("second call", _STARTING)),
        asyncio.create_task(wait("back from a wait", _RESUMING)),
    ]
    await asyncio.sleep(0)  # all four wait
    turn.release()
    await asyncio.gather(*tasks)
    assert order == ["back from a wait", "first call", "second call", "background"]
    await turn.acquire()  # free again: taken at once
    turn.release()


async def test_a_waiter_cancelled_as_it_is_handed_the_turn_passes_it_on() -> None:
    turn = _Turn()
    await turn.acquire()
    cancelled = asyncio.create_task(turn.acquire())
    after = asyncio.create_task(turn.acquire())
    await asyncio.sleep(0)
    turn.release()  # handed to ``cancelled`` ...
    cancelled.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.wait_for(after, 1)  # the turn went on to the next waiter
    turn.release()


async def test_idle_turn_waits_for_the_calls_in_line() -> None:
    turn_order: list[str] = []

    async def call(name: str) -> None:
        async with engine_turn():
            turn_order.append(f"{name} starts")
            await asyncio.sleep(0)
            turn_order.append(f"{name} ends")

    async def background() -> None:
        await idle_turn()
        turn_order.append("background")

    calls = [asyncio.create_task(call("a")), asyncio.create_task(call("b"))]
    for _ in range(3):  # a holds the turn, b waits for it
        await asyncio.sleep(0)
    await asyncio.gather(background(), *calls)
    assert turn_order == ["a starts", "a ends", "b starts", "b ends", "background"]


async def test_a_call_is_not_overtaken_by_later_sessions_records(tmp_path: Path) -> None:
    """Each session has a record queued (write-behind) when its next call comes; the calls
    come together. Every call runs its own session's record first; a record's commit gives
    the loop's turn up while it waits, and the call comes back to it before the records of
    the sessions that called after it: the first session's input is ready before the last
    session's record has even started (not once every session's record is written)."""
    engine = ContextEngine(
        store=SQLiteStore(str(tmp_path / "s.db")), config=RuntimeConfig(model_hint="gpt-4o")
    )
    events: list[tuple[str, int]] = []
    sessions = 6
    for i in range(sessions):
        await engine.prepare_turn(f"s{i}", Message(role=Role.USER, content=f"question {i}"))

    def record(i: int):  # type: ignore[no-untyped-def]
        async def work() -> None:
            events.append(("record", i))
            usage = ModelUsage(model_usage_id=f"u{i}", provider="openai", model="gpt-4o")
            reply = Message(role=Role.ASSISTANT, content=f"answer {i}")
            await engine.record_model_call(f"s{i}", usage, reply=reply)

        return work

    async def next_call(i: int) -> None:
        engine.defer(f"s{i}", record(i))
        pending = [
            Message(role=Role.USER, content=f"question {i}"),
            Message(role=Role.ASSISTANT, content=f"answer {i}"),
            Message(role=Role.USER, content=f"next {i}"),
        ]
        result = await engine.prepare_call(f"s{i}", pending)
        events.append(("prepared", i))
        sent = [p.content for p in result.assembled_input.parts]
        assert f"answer {i}" in sent[-2] and sent[-1].startswith(f"next {i}")

    await asyncio.gather(*(next_call(i) for i in range(sessions)))
    await engine.close()
    assert sorted(i for kind, i in events if kind == "prepared") == list(range(sessions))
    assert events.index(("prepared", 0)) < events.index(("record", sessions - 1)), events


async def test_a_hook_record_in_the_background_does_not_commit_the_next_calls_input(
    tmp_path: Path,
) -> None:
    """A framework hook on the loop hands over the model call's record (write-behind) while
    another session's call holds the loop's turn, and the app's next call comes at once: that
    call goes first and writes the record itself; its own input waits for the next model
    call's record (one commit per model call). The record's background task, run afterwards,
    finds nothing left to write and commits nothing."""
    engine = ContextEngine(
        store=SQLiteStore(str(tmp_path / "s.db")), config=RuntimeConfig(model_hint="gpt-4o")
    )
    plugin = _Hooks().install(engine)
    commits: list[object] = []
    engine.events.on("Persisted", commits.append)
    first = [{"role": "user", "content": "first question"}]
    assert await prepare_openai(plugin, "s", first) is not None
    assert len(commits) == 0  # the input waits for the model call's record
    answer = {"role": "assistant", "content": "one"}

    async def work(recorder: Recorder) -> object:
        call = ModelCall(call_id="m1", provider="openai", model="gpt-4o", output_text="one")
        return await recorder.record_model_call(call, reply=message_from_openai(answer))

    release = asyncio.Event()

    async def other_session() -> None:
        async with engine_turn():
            await release.wait()

    holder = asyncio.create_task(other_session())
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # it holds the turn
    record_sync(plugin, "s", "model call", work)  # a hook on the loop: queued
    second = [*first, answer, {"role": "user", "content": "second question"}]
    call = asyncio.create_task(prepare_openai(plugin, "s", second))
    for _ in range(3):
        await asyncio.sleep(0)  # the call and the record's task wait for the turn
    release.set()
    assert await call is not None  # it wrote the record first
    await holder
    for _ in range(5):  # the record's background task runs now
        await asyncio.sleep(0)
    assert len(commits) == 1  # the record's commit only: the second input still waits
    plugin.uninstall()
    await engine.close()  # commits the input still waiting
    doc = await ContextEngine(
        store=SQLiteStore(str(tmp_path / "s.db")), config=RuntimeConfig(model_hint="gpt-4o")
    ).get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == ["first question", "one", "second question"]


class _Hooks(Plugin):
    name = "hooks"

    def _install(self, **options: object) -> None:
        return None
