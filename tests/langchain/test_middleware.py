"""``ce.langchain.middleware(engine)`` in ``create_agent(..., middleware=[...])`` without
``install()``: every model call of the tool loop receives the engine's assembled input, the
request is ephemeral (the agent state keeps the app's own messages), and the run is recorded."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import SYSTEM, get_weather, weather_loop
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.langchain import LangChainPlugin


@pytest.mark.parametrize("use_async", [False, True])
async def test_middleware_injects_every_model_call_of_the_tool_loop(
    use_async: bool, engine: ContextEngine
) -> None:
    original = BaseChatModel.__dict__["_convert_input"]
    model = weather_loop()
    agent = create_agent(
        model,
        tools=[get_weather],
        system_prompt=SYSTEM,
        middleware=[ce.langchain.middleware(engine)],
        checkpointer=InMemorySaver(),
    )
    # no install(): the middleware installed the plugin for recording only, nothing patched
    assert LangChainPlugin().installed
    assert BaseChatModel.__dict__["_convert_input"] is original
    await engine.update_notebook("mw", "NOTEBOOK-MARK")
    config: Any = {"configurable": {"thread_id": "mw"}}
    inputs = {"messages": [("user", "weather in Paris?")]}
    result = await agent.ainvoke(inputs, config) if use_async else agent.invoke(inputs, config)
    assert result["messages"][-1].content == "Paris is sunny."

    # every model call of the loop received the engine's input
    first, second = model.seen
    for sent in (first, second):
        assert isinstance(sent[0], SystemMessage)
        assert SYSTEM in str(sent[0].content) and "NOTEBOOK-MARK" in str(sent[0].content)
        assert sum(isinstance(m, SystemMessage) for m in sent) == 1
    assert [m.type for m in first] == ["system", "human"]
    assert [m.type for m in second] == ["system", "human", "ai", "tool"]

    # ephemeral: the agent state keeps the app's own messages, no engine system message
    state = result["messages"]
    assert [m.type for m in state] == ["human", "ai", "tool", "ai"]
    assert state[0].content == "weather in Paris?"
    assert state[2].content == "sunny in Paris"
    assert all("NOTEBOOK-MARK" not in str(m.content) for m in state)
    snapshot = agent.get_state(config).values["messages"]
    assert [m.type for m in snapshot] == ["human", "ai", "tool", "ai"]

    # recorded (through the plugin the middleware installed): turns, usage, the session
    assert len(await engine.list_turns("mw")) == 2
    doc = await engine.get_session("mw")
    roles = [m.role for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert [(u.prompt_tokens, u.completion_tokens) for u in doc.session.model_usage] == [
        (11, 5),
        (11, 5),
    ]


async def test_middleware_with_the_global_patch_injects_once(engine: ContextEngine) -> None:
    ce.langchain.install(engine)
    model = weather_loop()
    agent = create_agent(
        model,
        tools=[get_weather],
        system_prompt=SYSTEM,
        middleware=[ce.langchain.middleware()],
        checkpointer=InMemorySaver(),
    )
    await engine.update_notebook("both", "NOTEBOOK-MARK")
    agent.invoke(
        {"messages": [("user", "weather in Paris?")]}, {"configurable": {"thread_id": "both"}}
    )
    assert all(str(sent[0].content).count("NOTEBOOK-MARK") == 1 for sent in model.seen)
    assert len(await engine.list_turns("both")) == 2
