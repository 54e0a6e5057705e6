"""The engine never deadlocks on itself: its own model calls (the summarizer's) run
suppressed, so no plugin rewrites or re-enters them, and a blocking engine call made from the
thread that serves the engine's blocking calls raises a clear error instead of hanging."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.integration import is_suppressed
from ce.core.pipeline import LlmRequest, LlmResponse
from ce.core.schema import Message, ModelInvocation, Role
from ce.core.stores import MemoryStore

INV = ModelInvocation(provider="openai", model="gpt-4o")


def _finishes(work: Callable[[], Any]) -> Any:
    """Run ``work`` in a daemon thread and return its result (or raise its error); fails the
    test instead of hanging the run when ``work`` never returns."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = work()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the call hung (deadlock)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class PluginBackedAdapter:
    """A summarizer whose model is an app model with a plugin installed: like a plugin's
    blocking hook, it calls the engine (``engine.sync``) unless the call is suppressed."""

    def __init__(self) -> None:
        self.engine: ContextEngine | None = None
        self.suppressed: list[bool] = []

    async def generate(self, request: LlmRequest) -> LlmResponse:
        self.suppressed.append(is_suppressed())
        if not is_suppressed() and self.engine is not None:
            self.engine.sync.prepare_call("elsewhere", [Message(role=Role.USER, content="x")])
        return LlmResponse(content="a summary", model="mini", provider="scripted")


def test_the_summarizers_model_calls_run_suppressed_and_never_deadlock() -> None:
    adapter = PluginBackedAdapter()
    config = RuntimeConfig(
        model_hint="gpt-4o",
        summary={"trigger_message_count": 6, "preserve_recent_messages": 2},  # type: ignore[arg-type]
    )
    engine = ContextEngine(MemoryStore(), config=config, llm_adapter=adapter)
    adapter.engine = engine

    def chat() -> str | None:
        for i in range(6):
            engine.sync.prepare_turn("s", f"question {i}")
            reply = Message(role=Role.ASSISTANT, content=f"answer {i}", invocation=INV)
            engine.sync.commit_assistant_message("s", reply)
        summary = engine.sync.get_session("s").session.summary
        return None if summary is None else summary.content

    try:
        assert _finishes(chat) == "a summary"
        assert adapter.suppressed and all(adapter.suppressed)
    finally:
        engine.sync.close()


def test_blocking_calls_nest_inline_without_a_thread_of_their_own() -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))

    async def nested() -> Any:
        return engine.sync.prepare_turn("other", "hi")

    result = _finishes(lambda: engine.sync.run(nested()))
    assert result.assembled_input.parts[-1].content == "hi"
    assert not [t for t in threading.enumerate() if t.name.startswith("ce-engine")]


class SameSessionAdapter:
    """A summarizer that calls back into the engine for the very session being summarized
    (blocking, or awaited): that can never get the session's lock."""

    def __init__(self, blocking: bool) -> None:
        self.engine: ContextEngine | None = None
        self.blocking = blocking

    async def generate(self, request: LlmRequest) -> LlmResponse:
        assert self.engine is not None
        if self.blocking:
            self.engine.sync.get_report("s")  # reads take no lock: fine
            self.engine.sync.update_notebook("s", "from the summarizer")
        else:
            await self.engine.update_notebook("s", "from the summarizer")
        return LlmResponse(content="never", model="mini", provider="scripted")


@pytest.mark.parametrize("blocking", [True, False])
def test_calling_back_into_the_held_session_raises_instead_of_hanging(blocking: bool) -> None:
    adapter = SameSessionAdapter(blocking)
    config = RuntimeConfig(
        model_hint="gpt-4o",
        summary={"trigger_message_count": 4, "preserve_recent_messages": 2},  # type: ignore[arg-type]
    )
    engine = ContextEngine(MemoryStore(), config=config, llm_adapter=adapter)
    adapter.engine = engine

    def chat() -> None:
        for i in range(5):
            engine.sync.prepare_turn("s", f"question {i}")
            reply = Message(role=Role.ASSISTANT, content=f"answer {i}", invocation=INV)
            engine.sync.commit_assistant_message("s", reply)

    async def chat_async() -> None:
        for i in range(5):
            await engine.prepare_turn("s", f"question {i}")
            reply = Message(role=Role.ASSISTANT, content=f"answer {i}", invocation=INV)
            await engine.commit_assistant_message("s", reply)

    failures: list[str] = []
    engine.events.on(
        "Degraded",
        lambda e: (
            failures.append(e.payload["detail"])
            if e.payload["reason"] == "summarize_failed"
            else None
        ),
    )
    _finishes(chat if blocking else lambda: asyncio.run(chat_async()))
    # the summary failed (the turn went on without it) instead of the call hanging
    assert failures and all("would wait on itself" in f for f in failures)
    assert engine.sync.get_session("s").session.summary is None
    assert engine.sync.prepare_turn("s", "later").assembled_input.parts[-1].content == "later"


def test_a_blocking_call_on_the_loop_whose_task_holds_the_session_raises() -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    seen: list[BaseException] = []

    def on_persisted(event: Any) -> None:  # runs on the loop, inside the holder's call
        try:
            engine.sync.update_notebook("s", "from a handler")
        except RuntimeError as exc:
            seen.append(exc)

    engine.events.on("Persisted", on_persisted)
    _finishes(lambda: asyncio.run(engine.prepare_turn("s", "hi")))
    assert seen and "would wait on itself" in str(seen[0])


def test_blocking_calls_from_many_threads_at_once(tmp_path: Any) -> None:
    """Inline calls run on the callers' threads: many threads on shared and separate
    sessions, with a session cache small enough to evict, lose and duplicate nothing."""
    from concurrent.futures import ThreadPoolExecutor

    from ce.core.stores import SQLiteStore

    engine = ContextEngine(
        SQLiteStore(str(tmp_path / "s.db")),
        config=RuntimeConfig(model_hint="gpt-4o"),
        max_cached_sessions=3,
    )

    def worker(n: int) -> None:
        for turn in range(10):
            session = f"s{(n + turn) % 6}"
            engine.sync.prepare_turn(session, f"w{n} t{turn}")
            reply = Message(role=Role.ASSISTANT, content=f"a{n}-{turn}", invocation=INV)
            engine.sync.commit_assistant_message(session, reply)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(worker, range(8)))
    texts = [
        m.content
        for sid in engine.sync.list_sessions()
        for m in engine.sync.get_session(sid).session.messages
        if m.role is Role.USER
    ]
    assert sorted(texts) == sorted(f"w{n} t{t}" for n in range(8) for t in range(10))


async def test_async_calls_take_turns_and_give_the_loop_back_between_phases(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an event loop, one engine call at a time does its CPU work (the loop's turn), and
    it lets the loop run other work between its phases: many sessions at once never pile
    their work into one stretch the loop cannot interrupt. A session's own work still
    waits for the store (SQLite here) outside the turn."""
    from ce.core.engine import _prepare, _writes
    from ce.core.stores import SQLiteStore

    engine = ContextEngine(SQLiteStore(tmp_path / "ce.db"), config=RuntimeConfig())
    inside = 0  # calls between matching what is new and the end of their selection
    most = 0
    ticks: list[int] = []
    tick = 0
    record, select = _writes.HistoryWriter._record_pending, _prepare.select_and_assemble

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        ticks.append(tick)
        record(self, *args, **kwargs)

    async def selecting(*args: Any, **kwargs: Any) -> Any:
        nonlocal inside
        try:
            return await select(*args, **kwargs)
        finally:
            inside -= 1

    monkeypatch.setattr(_prepare, "select_and_assemble", selecting)
    monkeypatch.setattr(_writes.HistoryWriter, "_record_pending", recording)
    done = False

    async def ticker() -> None:
        nonlocal tick
        while not done:
            tick += 1
            await asyncio.sleep(0)

    async def session(n: int) -> None:
        history = [Message(role=Role.SYSTEM, content="Be brief.")]
        for i in range(3):
            history.append(Message(role=Role.USER, content=f"question {i} of {n}"))
            await engine.prepare_call(f"s{n}", history)
            history.append(Message(role=Role.ASSISTANT, content=f"answer {i}", invocation=INV))

    runner = asyncio.ensure_future(ticker())
    await asyncio.gather(*(session(n) for n in range(8)))
    done = True
    await runner
    assert most == 1  # never two calls in their CPU work at once
    assert len(ticks) == 24
    # the loop's other work ran between consecutive calls' phases: the ticker advanced
    assert all(later > earlier for earlier, later in itertools.pairwise(ticks))
    await engine.close()
