"""Framework data never disables the engine and fail-open never means unredacted (issue 10): a
reused tool-call id, a broken store, a failing conversion; and 20 concurrent users in one
process (async and threads) never see each other's canary."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from scripted import (
    OUTER_SYSTEM,
    Scripted,
    call,
    failures,
    history_chain,
    replies,
    texts,
)

import ce.langchain
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.events import Event
from ce.core.schema import Role
from ce.core.stores import MemoryStore, SQLiteStore
from ce.core.testing import deterministic_engine

# RunnableWithMessageHistory and InMemoryChatMessageHistory are deprecated (still shipped)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# -- 4. a reused tool-call id does not switch the engine off ----------------------------------


async def test_a_reused_tool_call_id_keeps_the_session_working() -> None:
    budget = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    events: list[Event] = []
    engine.events.on("Degraded", events.append)

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    outer = replies(
        call("get_weather", {"city": "Paris"}, "call_0"),
        "Paris is sunny.",
        call("get_weather", {"city": "Oslo"}, "call_0"),  # the same id again, next turn
        "Oslo is sunny.",
        "Noted.",
    )
    agent = create_agent(
        outer, tools=[get_weather], system_prompt=OUTER_SYSTEM, checkpointer=InMemorySaver()
    )
    plugin = ce.langchain.install(engine)
    before = failures(plugin)  # the counter lives as long as the plugin object
    config = {"configurable": {"thread_id": "reuse"}}
    try:
        for text in ("Weather in Paris?", "Weather in Oslo?", "Mail me at jo@example.com"):
            await agent.ainvoke({"messages": [("user", text)]}, config)
        assert failures(plugin) == before
        reasons = [e.payload.get("reason") for e in events]
        assert "integration_failed" not in reasons and "redaction_failed" not in reasons
        assert len(outer.seen) == 5
        last = outer.seen[-1]
        assert "jo@example.com" not in texts(last) and "[REDACTED:email]" in texts(last)
        assert str(last[0].content).startswith(OUTER_SYSTEM)
        turns = await engine.list_turns("reuse")
        assert len(turns) == 5  # every call assembled by the engine
        limit = budget.max_input_tokens - budget.reserved_reply_tokens
        assert all(t.report is not None and t.report.token_used <= limit for t in turns)
    finally:
        await engine.close()


# -- 5. fail-open is redacted -----------------------------------------------------------------


class BrokenStore(MemoryStore):
    """A store whose reads fail."""

    async def get_session(self, session_id: str) -> Any:
        raise OSError("the store is down")

    async def read_since(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("the store is down")

    async def get_version(self, session_id: str) -> int:
        raise OSError("the store is down")


@pytest.mark.parametrize("path", ["sync", "async", "middleware"])
async def test_fail_open_is_redacted(path: str) -> None:
    engine = ContextEngine(BrokenStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    before = failures(ce.langchain.LangChainPlugin())["integration_failed"]
    model = replies("ok")
    question = [("system", "Be brief."), ("user", "Mail me at jo@example.com please")]
    try:
        if path == "middleware":
            agent = create_agent(model, tools=[], middleware=[ce.langchain.middleware(engine)])
            await agent.ainvoke({"messages": question[1:]})
        else:
            ce.langchain.install(engine)
            if path == "sync":
                await asyncio.to_thread(model.invoke, question)
            else:
                await model.ainvoke(question)
        (seen,) = model.seen
        assert "jo@example.com" not in texts(seen)
        assert "Mail me at [REDACTED:email] please" in texts(seen)
        assert failures(ce.langchain.LangChainPlugin())["integration_failed"] > before
    finally:
        await engine.close()


async def test_a_conversion_failure_is_redacted_too(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ce.langchain import _inject

    def broken(messages: Any) -> Any:
        raise ValueError("cannot convert")

    monkeypatch.setattr(_inject, "to_openai", broken)
    plugin = ce.langchain.install(engine)
    before = failures(plugin)["integration_failed"]
    model = replies("ok", "ok")
    await asyncio.to_thread(model.invoke, [("user", "Mail me at jo@example.com")])
    await model.ainvoke([("user", "Mail me at jo@example.com")])
    assert failures(plugin)["integration_failed"] == before + 2
    assert [texts(seen) for seen in model.seen] == ["Mail me at [REDACTED:email]"] * 2


# -- 6. concurrent users in one process -------------------------------------------------------

USERS = 20


def canary(user: int) -> str:
    return f"CANARY{user:02d}X"


def owners(seen: Sequence[BaseMessage]) -> set[int]:
    text = texts(seen)
    return {user for user in range(USERS) if canary(user) in text}


def check_isolated(model: Scripted, turns: int) -> None:
    assert len(model.seen) == USERS * turns
    counts = [0] * USERS
    for seen in model.seen:
        found = owners(seen)
        assert len(found) == 1, found  # its own canary only
        counts[found.pop()] += 1
    assert counts == [turns] * USERS


def concurrent_agent(checkpointer: bool = True) -> tuple[Any, Scripted]:
    model = Scripted(script=lambda messages: f"noted ({len(messages)})")
    agent = create_agent(
        model,
        tools=[],
        system_prompt=OUTER_SYSTEM,
        checkpointer=InMemorySaver() if checkpointer else None,
    )
    return agent, model


async def test_concurrent_users_async(engine: ContextEngine) -> None:
    agent, model = concurrent_agent()
    chain_model = Scripted(script=lambda messages: "noted")
    chain = history_chain(chain_model, {})
    ce.langchain.install(engine)

    async def user(n: int, question: str) -> None:
        await agent.ainvoke(
            {"messages": [("user", question)]}, {"configurable": {"thread_id": f"user-{n}"}}
        )
        await chain.ainvoke({"question": question}, {"configurable": {"session_id": f"u{n}"}})

    await asyncio.gather(*(user(n, f"My word is {canary(n)}.") for n in range(USERS)))
    await asyncio.gather(*(user(n, f"User {n}: what is my word?") for n in range(USERS)))
    # the second question carries no canary: only the user's own history can put one there
    check_isolated(model, 2)
    check_isolated(chain_model, 2)


async def test_concurrent_users_with_a_sync_tool_on_sqlite(tmp_path: Path) -> None:
    """An async agent whose tool is a plain function: LangGraph runs the tool, and the model's
    sync path, in the loop's default executor, and the tool's end is recorded from that
    thread (it waits while the loop's engine calls hold the session). The engine's own store
    waits (an SQLite lock another call holds) must not queue behind those threads in the
    same executor: with two threads in it and 20 users, every user's turns complete."""
    engine = ContextEngine(
        SQLiteStore(tmp_path / "ce.db"), config=RuntimeConfig(model_hint="gpt-4o")
    )

    @tool
    def lookup(q: str) -> str:
        """Look a record up."""
        return f"record for {q}"

    def act(messages: list[BaseMessage]) -> AIMessage | str:
        if isinstance(messages[-1], ToolMessage):
            return f"The record says {messages[-1].content}."
        return call("lookup", {"q": "x"}, "call_0")  # the same id in every session

    model = Scripted(script=act)
    agent = create_agent(
        model, tools=[lookup], system_prompt=OUTER_SYSTEM, checkpointer=InMemorySaver()
    )
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
    ce.langchain.install(engine)

    async def user(n: int) -> None:
        for turn in range(2):
            await agent.ainvoke(
                {"messages": [("user", f"{canary(n)} question {turn}")]},
                {"configurable": {"thread_id": f"user-{n}"}},
            )

    await asyncio.wait_for(asyncio.gather(*(user(n) for n in range(USERS))), 120)
    await engine.flush()
    assert len(model.seen) == USERS * 2 * 2  # the tool call, then the answer, per turn
    for seen in model.seen:
        assert len(owners(seen)) == 1  # its own canary only
    for n in range(USERS):
        doc = await engine.get_session(f"user-{n}")
        assert doc is not None
        roles = [m.role for m in doc.session.messages]
        assert roles.count(Role.USER) == 2 and roles.count(Role.TOOL) == 2
    await engine.close()


async def test_concurrent_users_threads(engine: ContextEngine) -> None:
    agent, model = concurrent_agent()
    chain_model = Scripted(script=lambda messages: "noted")
    chain = history_chain(chain_model, {})
    ce.langchain.install(engine)

    def user(n: int, question: str) -> None:
        agent.invoke(
            {"messages": [("user", question)]}, {"configurable": {"thread_id": f"user-{n}"}}
        )
        chain.invoke({"question": question}, {"configurable": {"session_id": f"u{n}"}})

    def run_all(question: str) -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda n: user(n, question.format(n=n, c=canary(n))), range(USERS)))

    await asyncio.to_thread(run_all, "My word is {c}.")
    await asyncio.to_thread(run_all, "User {n}: what is my word?")
    check_isolated(model, 2)
    check_isolated(chain_model, 2)
    stored = set(await engine.store.list_sessions())
    assert stored == {f"user-{n}" for n in range(USERS)} | {f"u{n}" for n in range(USERS)}


async def test_concurrent_runs_without_identity_stay_apart(engine: ContextEngine) -> None:
    agent, model = concurrent_agent(checkpointer=False)
    ce.langchain.install(engine)
    await asyncio.gather(
        *(agent.ainvoke({"messages": [("user", f"My word is {canary(n)}.")]}) for n in range(USERS))
    )
    check_isolated(model, 1)
    sessions = await engine.list_sessions()  # after the deferred records
    assert len(sessions) == USERS and all(s.startswith("run:") for s in sessions)
