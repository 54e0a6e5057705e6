"""A call's system messages are its instruction: all of them, joined in order.

Frameworks put their own prompt first and pass the app's system messages after it (LangChain's
``create_agent(system_prompt=...)`` invoked with a ``SystemMessage`` among the messages; a
LlamaIndex LLM's ``system_prompt`` before a chat engine's context prompt; a note the app adds
mid-conversation): without the engine the model is told every one of them, so the engine's
one instruction holds them all, not only the last.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import ce.core.engine._core as engine_core
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.schema import Message, PrepareResult, Role
from ce.core.stores import SQLiteStore
from ce.core.testing import deterministic_engine

PROMPT = "You are a helpful assistant. Answer in French."
NOTE = "The user is Bob, premium tier."


def system(text: str) -> Message:
    return Message(role=Role.SYSTEM, content=text)


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def assistant(text: str) -> Message:
    return Message(role=Role.ASSISTANT, content=text)


def instruction(result: PrepareResult) -> str:
    [first, *rest] = result.assembled_input.parts
    assert first.role is Role.SYSTEM
    assert all(p.role is not Role.SYSTEM for p in rest)
    return first.content


async def test_an_agents_prompt_and_the_apps_system_message_are_both_the_instruction() -> None:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    result = await engine.prepare_call("s", [system(PROMPT), system(NOTE), user("hi")])
    assert instruction(result) == f"{PROMPT}\n\n{NOTE}"
    doc = await engine.get_session("s")
    assert [(m.role, m.content) for m in doc.session.messages] == [
        (Role.SYSTEM, f"{PROMPT}\n\n{NOTE}"),
        (Role.USER, "hi"),
    ]


async def test_a_system_message_in_the_middle_joins_the_instruction_and_a_repeat_is_once() -> None:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    passed = [
        system(PROMPT),
        user("Q1?"),
        assistant("R1."),
        system(NOTE),
        system(PROMPT),
        user("Q2?"),
    ]
    result = await engine.prepare_call("s", passed)
    assert instruction(result) == f"{PROMPT}\n\n{NOTE}"
    assert [p.content for p in result.assembled_input.parts[1:]] == ["Q1?", "R1.", "Q2?"]


async def test_the_history_continued_keeps_the_joined_instruction_and_stores_it_once() -> None:
    """The framework passes the same message objects again with a new turn (only the new
    messages are matched): the instruction is still all of them, and the session gains
    no new system message."""
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    history = [system(PROMPT), system(NOTE), user("Q1?")]
    await engine.prepare_call("s", history)
    await engine.commit_assistant_message("s", assistant("R1."))
    history += [assistant("R1."), user("Q2?")]
    again = await engine.prepare_call("s", history)
    assert instruction(again) == f"{PROMPT}\n\n{NOTE}"
    doc = await engine.get_session("s")
    systems = [m.content for m in doc.session.messages if m.role is Role.SYSTEM]
    assert systems == [f"{PROMPT}\n\n{NOTE}"]
    # another agent's own prompt alone is its instruction; the joined one comes back after
    other = await engine.prepare_call("s", [system("You book trips."), user("book")])
    assert instruction(other) == "You book trips."
    history += [assistant("R2."), user("Q3?")]
    await engine.commit_assistant_message("s", assistant("Booked."))
    back = await engine.prepare_call("s", history)
    assert instruction(back) == f"{PROMPT}\n\n{NOTE}"


def test_a_cold_worker_on_the_newest_records_gives_the_same_instruction(tmp_path: Path) -> None:
    """A process that reads only the session's newest records (the system messages the
    framework passes lie before them) joins the same instruction and stores none again."""

    async def run() -> None:
        path = tmp_path / "s.db"
        budget = BudgetConfig(max_input_tokens=180, reserved_reply_tokens=60)
        config = RuntimeConfig(model_hint="gpt-4o", budget=budget)
        history = [system(PROMPT), system(NOTE)]
        writer = ContextEngine(SQLiteStore(path), config=config)
        for i in range(40):
            history.append(user(f"question {i}?"))
            await writer.prepare_call("s", history)
            await writer.commit_assistant_message("s", assistant(f"answer {i}."))
            history.append(assistant(f"answer {i}."))
        await writer.close()
        await writer.store.close()
        saved = engine_core.TAIL_MESSAGES, engine_core.TAIL_EVIDENCES
        engine_core.TAIL_MESSAGES, engine_core.TAIL_EVIDENCES = 4, 4
        store = SQLiteStore(path)
        cold = ContextEngine(
            store, config=config, clock=SteppingClock(), id_generator=SequentialIdGenerator("c")
        )
        try:
            result = await cold.prepare_call("s", [*history, user("and now?")])
            assert cold._entries["s"].partial  # it read the newest records only
            assert instruction(result) == f"{PROMPT}\n\n{NOTE}"
            doc = await cold.get_session("s")
            systems = [m.content for m in doc.session.messages if m.role is Role.SYSTEM]
            assert systems == [f"{PROMPT}\n\n{NOTE}"]
        finally:
            engine_core.TAIL_MESSAGES, engine_core.TAIL_EVIDENCES = saved
            await cold.close()
            await store.close()

    asyncio.run(run())
