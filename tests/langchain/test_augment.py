"""``mode="augment"``: the model receives the app's own messages (tool results as the tools
returned them), the engine's context as one more system message after the app's system
prompt; on the global patch, through ``wrap()`` and through the middleware."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import SYSTEM, get_weather, weather_loop
from langchain.agents import create_agent
from langchain_core.messages import SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.engine import ContextEngine
from ce.langchain import LangChainPlugin


@pytest.mark.parametrize("seam", ["install", "wrap", "middleware"])
async def test_augment_keeps_the_apps_messages_and_adds_the_context(
    seam: str, engine: ContextEngine
) -> None:
    model = weather_loop()
    agent_model: Any = model
    middleware = []
    if seam == "install":
        ce.langchain.install(engine, mode="augment")
    elif seam == "wrap":
        agent_model = ce.langchain.wrap(model, engine, mode="augment")
    else:
        middleware = [ce.langchain.middleware(engine, mode="augment")]
    assert LangChainPlugin().mode == "augment"
    agent = create_agent(
        agent_model,
        tools=[get_weather],
        system_prompt=SYSTEM,
        middleware=middleware,
        checkpointer=InMemorySaver(),
    )
    await engine.update_notebook("aug", "NOTEBOOK-MARK")
    result = await agent.ainvoke(
        {"messages": [("user", "weather in Paris?")]}, {"configurable": {"thread_id": "aug"}}
    )
    assert result["messages"][-1].content == "Paris is sunny."
    first, second = model.seen
    if seam == "middleware":  # a ModelRequest holds one system message: prompt + context
        assert [m.type for m in first] == ["system", "human"]
        assert str(first[0].content).startswith(SYSTEM + "\n\n")
        assert "NOTEBOOK-MARK" in str(first[0].content)
    else:
        assert [m.type for m in first] == ["system", "system", "human"]
        assert first[0].content == SYSTEM
        assert isinstance(first[1], SystemMessage)
        assert "NOTEBOOK-MARK" in str(first[1].content) and SYSTEM not in str(first[1].content)
    assert first[-1].content == "weather in Paris?"
    # the post-tool call: the app's own history, the tool result exactly as returned
    assert [m.type for m in second][-3:] == ["human", "ai", "tool"]
    assert second[-1].content == "sunny in Paris"
    assert "NOTEBOOK-MARK" in "".join(str(m.content) for m in second if m.type == "system")
    assert len(await engine.list_turns("aug")) == 2
