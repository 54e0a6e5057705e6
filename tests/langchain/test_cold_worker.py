"""A worker that has not served a conversation yet (a new process, a scaled-out worker)
answers a chat with history from the session's newest records: the model receives what a
worker holding the whole session sends it, and the session ends the same."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import BaseMessage
from scripted import Scripted, history_chain

import ce.langchain
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import Role
from ce.core.stores import SQLiteStore, Store
from ce.core.testing.engines import note_reads, whole_copy

# RunnableWithMessageHistory and InMemoryChatMessageHistory are deprecated (still shipped)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CONFIG = RuntimeConfig(
    model_hint="gpt-4o", budget=BudgetConfig(max_input_tokens=1200, reserved_reply_tokens=200)
)
USER = {"configurable": {"session_id": "user-1"}}


def _engine(store: Store) -> ContextEngine:
    return ContextEngine(
        store, config=CONFIG, clock=SteppingClock(), id_generator=SequentialIdGenerator("c")
    )


def _said(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    return [(m.type, str(m.content)) for m in messages]


async def _stored(engine: ContextEngine) -> list[tuple[Role, str]]:
    doc = await engine.get_session("user-1")
    return [(m.role, m.content) for m in doc.session.messages]


@pytest.mark.parametrize("blocking", [False, True], ids=["ainvoke", "invoke"])
async def test_a_cold_worker_sends_what_a_worker_with_the_whole_session_sends(
    tmp_path: Path, blocking: bool
) -> None:
    log: list[str] = []

    def answer(messages: list[BaseMessage]) -> str:
        log.append("model")
        return f"Noted, {len(messages)} messages."

    model = Scripted(script=answer)
    histories: dict[str, InMemoryChatMessageHistory] = {}
    chain = history_chain(model, histories)
    served = _engine(SQLiteStore(tmp_path / "chat.db"))
    ce.langchain.install(served)
    for i in range(150):  # far more than one model call can keep
        await chain.ainvoke({"question": f"Question {i}: remember the number {i * 7}."}, USER)
    ce.langchain.uninstall()
    whole_store = await whole_copy(served, "user-1")  # every read of it is the whole session
    cold_store = SQLiteStore(tmp_path / "chat.db")  # a new process on the shared store
    note_reads(cold_store, log.append)
    seen, stored = [], []
    for store in (whole_store, cold_store):
        engine = _engine(store)
        again = history_chain(model, copy.deepcopy(histories))  # the app's shared history
        ce.langchain.install(engine)
        log.clear()
        question = {"question": "Which number did I ask you to remember first?"}
        if blocking:  # the blocking path runs the engine inline, on the caller's thread
            await asyncio.to_thread(again.invoke, question, USER)
        else:
            await again.ainvoke(question, USER)
        await engine.flush()
        ce.langchain.uninstall()
        seen.append(_said(model.seen[-1]))
        stored.append(await _stored(engine))
        await engine.close()
    await cold_store.close()

    assert seen[1] == seen[0]
    assert stored[1] == stored[0]
    assert len(seen[1]) < 100  # the budget kept the newest part of 300+ messages
    # the cold worker's model input came from the newest records (read again, twice as many,
    # while the budget could keep more); the whole session was read only afterwards, to
    # record the reply
    before = log[: log.index("model")]
    assert before and set(before) == {"read_tail"}, log


async def test_a_cold_worker_runs_an_agent_turn_with_tools_as_a_warm_one_does(
    tmp_path: Path,
) -> None:
    """A LangGraph agent whose history lives in its checkpointer (messages with ids, tool
    calls and results): the cold worker's first call of the turn is prepared from the newest
    records (the new question's id looked up by key), the rest of the turn as usual."""
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    calls = [0]

    def act(messages: list[BaseMessage]) -> AIMessage | str:
        if isinstance(messages[-1], ToolMessage):
            return f"The record says {messages[-1].content}."
        calls[0] += 1
        return AIMessage(
            content="",
            tool_calls=[{"name": "lookup", "args": {"n": calls[0]}, "id": f"call_{calls[0]}"}],
        )

    @tool
    def lookup(n: int) -> str:
        """Look a record up."""
        return f"record {n} is {n * 7}"

    model = Scripted(script=act)
    saver = InMemorySaver()
    thread = {"configurable": {"thread_id": "user-1"}}
    served = _engine(SQLiteStore(tmp_path / "agent.db"))
    ce.langchain.install(served)
    agent = create_agent(
        model, tools=[lookup], system_prompt="You look records up.", checkpointer=saver
    )
    for i in range(60):
        await agent.ainvoke({"messages": [("user", f"Look up record {i}, please.")]}, thread)
    ce.langchain.uninstall()
    whole_store = await whole_copy(served, "user-1")
    cold_store = SQLiteStore(tmp_path / "agent.db")
    seen, stored, partial = [], [], []
    for store in (whole_store, cold_store):
        engine = _engine(store)
        again = create_agent(
            model,
            tools=[lookup],
            system_prompt="You look records up.",
            checkpointer=copy.deepcopy(saver),
        )
        ce.langchain.install(engine)
        calls[0] = 1000
        before = len(model.seen)
        noted: list[bool] = []
        engine.events.on(
            "Assembled",
            lambda _e, engine=engine, noted=noted: noted.append(engine._entries["user-1"].partial),
        )
        await again.ainvoke({"messages": [("user", "And record 1000?")]}, thread)
        await engine.flush()
        ce.langchain.uninstall()
        seen.append([_said(m) for m in model.seen[before:]])
        stored.append(await _stored(engine))
        partial.append(noted)
        await engine.close()
    await cold_store.close()

    assert len(seen[0]) == 2  # the tool call, then the answer
    assert seen[1] == seen[0]
    assert stored[1] == stored[0]
    assert partial[0] == [False, False] and partial[1][0] is True
