"""The explicit seams, ``wrap(llm)`` and ``ContextEngineMemory``, and how a call's session is
resolved (instrument_tags, a memory's own session id, ``engine.session()``, the install
default)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import ChatMemoryBuffer, Memory
from llama_index.core.tools import FunctionTool
from llamaindex_fakes import Reply, ScriptedLLM

import ce.llamaindex
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.llamaindex import ContextEngineMemory


def weather_script(messages: list[dict[str, Any]]) -> Reply:
    if messages[-1]["role"] == "tool":
        return "Sunny.", []
    asked = sum(m["role"] == "user" for m in messages)
    return "", [(f"call_{asked}", "get_weather", {"city": "Paris"})]


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


def _agent(llm: Any, streaming: bool = False) -> FunctionAgent:
    return FunctionAgent(
        tools=[FunctionTool.from_defaults(get_weather)],
        llm=llm,
        system_prompt="SYS",
        streaming=streaming,
    )


@pytest.mark.parametrize("streaming", [False, True])
async def test_wrap_injects_every_call_without_the_global_injection(
    streaming: bool, engine: ContextEngine
) -> None:
    inner = ScriptedLLM(script=weather_script, seen=[])
    wrapped = ce.llamaindex.wrap(inner, engine, session_id="s-wrap")
    await engine.update_notebook("s-wrap", "NOTEBOOK-MARK")
    result = await _agent(wrapped, streaming).run(user_msg="weather?")
    assert str(result.response.content) == "Sunny."
    first, second = inner.seen
    assert "NOTEBOOK-MARK" in str(first[0].content) and "SYS" in str(first[0].content)
    assert [m.role.value for m in second] == ["system", "user", "assistant", "tool"]
    doc = await engine.get_session("s-wrap")
    assert len(doc.session.model_usage) == 2  # the wrapped LLM's events, once
    assert len(await engine.list_turns("s-wrap")) == 2
    assert [t.tool_call_id for t in doc.session.tool_state.tool_calls] == ["call_1"]
    # installed by wrap() for recording only: other LLMs are left alone
    other = ScriptedLLM(script=lambda m: ("plain", []), seen=[])
    mine = [ChatMessage(role="user", content="not wrapped")]
    other.chat(mine)
    assert other.seen == [mine]


async def test_wrap_hands_a_new_list_and_leaves_the_callers(engine: ContextEngine) -> None:
    inner = ScriptedLLM(script=lambda m: ("ok", []), seen=[])
    wrapped = ce.llamaindex.wrap(inner, engine, session_id="s-list")
    mine = [ChatMessage(role="user", content="hello")]
    chunks = [c async for c in await wrapped.astream_chat(mine)]
    assert chunks[-1].message.content == "ok"
    assert [m.content for m in mine] == ["hello"]
    (received,) = inner.seen
    assert received is not mine and received[-1].content == "hello"


async def test_memory_backs_a_chat_engine_sync_and_streaming(engine: ContextEngine) -> None:
    ce.llamaindex.install(engine, session_id="the-default")
    llm = ScriptedLLM(
        script=lambda m: (f"reply {sum(x['role'] == 'user' for x in m)}", []), seen=[]
    )
    memory = ContextEngineMemory.from_defaults(engine, session_id="chat-1")
    chat = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt="SYS")

    def converse() -> list[str]:
        first = chat.chat("first question")
        stream = chat.stream_chat("second question")
        return [str(first), "".join(stream.response_gen)]

    assert await asyncio.to_thread(converse) == ["reply 1", "reply 2"]
    last = llm.seen[-1]
    assert [m.role.value for m in last] == ["system", "user", "assistant", "user"]
    assert [m.content for m in last[1:]] == ["first question", "reply 1", "second question"]
    doc = await engine.get_session("chat-1")  # the memory's session, not the install default
    contents = [m.content for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert contents == ["first question", "reply 1", "second question", "reply 2"]
    assert await engine.list_turns("the-default") == []
    history = await asyncio.to_thread(memory.get_all)
    assert [m.content for m in history] == contents


async def test_sessions_resolve_from_tags_memory_contextvar_and_default(
    engine: ContextEngine,
) -> None:
    ce.llamaindex.install(engine, session_id="the-default")

    asked = iter(range(100))

    async def ask(memory: Any = None) -> None:
        llm = ScriptedLLM(script=weather_script, seen=[])
        await _agent(llm).run(user_msg=f"weather {next(asked)}?", memory=memory)

    with instrument_tags({"ce_session_id": "from-tags"}):
        await ask(ChatMemoryBuffer.from_defaults(chat_store_key="from-buffer"))
    await ask(ChatMemoryBuffer.from_defaults(chat_store_key="from-buffer"))
    await ask(Memory.from_defaults(session_id="from-memory"))
    with engine.session("from-contextvar"):
        await ask(ChatMemoryBuffer.from_defaults())  # the default key names no session
        await ask(Memory.from_defaults())  # nor does the random id Memory generates
    await ask()
    for session_id, runs in [
        ("from-tags", 1),
        ("from-buffer", 1),
        ("from-memory", 1),
        ("from-contextvar", 2),
        ("the-default", 1),
    ]:
        assert len(await engine.list_turns(session_id)) == 2 * runs, session_id


async def test_agent_workflow_and_react_agent_calls_are_injected(engine: ContextEngine) -> None:
    ce.llamaindex.install(engine, session_id="s-agents")
    await engine.update_notebook("s-agents", "NOTEBOOK-MARK")
    llm = ScriptedLLM(script=weather_script, seen=[])
    workflow = AgentWorkflow(
        agents=[
            FunctionAgent(
                name="weather",
                description="Answers weather questions.",
                tools=[FunctionTool.from_defaults(get_weather)],
                llm=llm,
                system_prompt="SYS",
            )
        ]
    )
    result = await workflow.run(user_msg="weather?")
    assert str(result.response.content) == "Sunny."
    assert len(llm.seen) == 2
    assert all("NOTEBOOK-MARK" in str(seen[0].content) for seen in llm.seen)
    react_llm = ScriptedLLM(
        script=lambda m: ("Thought: I can answer without any more tools.\nAnswer: Hello.", []),
        seen=[],
    )
    react = ReActAgent(tools=[FunctionTool.from_defaults(get_weather)], llm=react_llm)
    answer = await react.run(user_msg="say hello")
    assert "Hello." in str(answer.response.content)
    (received,) = react_llm.seen
    assert "NOTEBOOK-MARK" in str(received[0].content)
    assert received[-1].content == "say hello"
    assert len(await engine.list_turns("s-agents")) == 3


async def test_memory_names_the_session_of_an_agent_run_and_async_chat(
    engine: ContextEngine,
) -> None:
    ce.llamaindex.install(engine, session_id="the-default")
    memory = ContextEngineMemory.from_defaults(engine, session_id="agent-memory")
    llm = ScriptedLLM(script=weather_script, seen=[])
    await _agent(llm).run(user_msg="weather?", memory=memory)
    await _agent(llm).run(user_msg="and tomorrow?", memory=memory)
    doc = await engine.get_session("agent-memory")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == ["weather?", "and tomorrow?"]
    assert [t.tool_call_id for t in doc.session.tool_state.tool_calls] == ["call_1", "call_2"]
    # the second run's first call received the first run from the engine's history
    assert [m.role.value for m in llm.seen[2]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    chat_llm = ScriptedLLM(script=lambda m: ("async reply", []), seen=[])
    chat = SimpleChatEngine.from_defaults(llm=chat_llm, memory=memory)
    assert str(await chat.achat("async question")) == "async reply"
    streamed = await chat.astream_chat("streamed question")
    assert "".join([t async for t in streamed.async_response_gen()]) == "async reply"
    doc = await engine.get_session("agent-memory")
    assert [m.content for m in doc.session.messages if m.role is Role.USER][-2:] == [
        "async question",
        "streamed question",
    ]
    assert await engine.list_turns("the-default") == []
