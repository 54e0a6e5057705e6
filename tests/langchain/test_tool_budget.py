"""Bound tools cost budget: with tools bound to the call (``bind_tools``, or ``create_agent``
binding them), the engine gets their schemas and every turn's ``token_budget`` shrinks by the
tools' tokens, on the global patch path (invoke / ainvoke / stream / astream) and through the
middleware."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import SYSTEM, get_weather, replying, weather_loop
from langchain.agents import create_agent
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.engine import ContextEngine


def _cost(engine: ContextEngine) -> int:
    cost = engine.estimator.estimate_tools([convert_to_openai_tool(get_weather)], "gpt-4o")
    assert cost > 0
    return cost


async def _budgets(engine: ContextEngine, session_id: str) -> list[int]:
    turns = await engine.list_turns(session_id)
    assert turns and all(t.report is not None for t in turns)
    return [t.report.token_budget for t in turns if t.report is not None]


async def _call(path: str, model: Runnable[Any, Any], engine: ContextEngine, sid: str) -> None:
    messages = [("user", "weather in Paris?")]
    with engine.session(sid):
        if path == "invoke":
            model.invoke(messages)
        elif path == "ainvoke":
            await model.ainvoke(messages)
        elif path == "stream":
            list(model.stream(messages))
        else:
            [c async for c in model.astream(messages)]


@pytest.mark.parametrize("path", ["invoke", "ainvoke", "stream", "astream"])
async def test_global_patch_counts_bound_tools_against_the_budget(
    path: str, engine: ContextEngine
) -> None:
    ce.langchain.install(engine)
    await _call(path, replying("sunny"), engine, "plain")
    model = replying("sunny")
    await _call(path, model.bind_tools([get_weather]), engine, "tools")
    assert model.seen_kwargs[0]["tools"][0]["function"]["name"] == "get_weather"
    (plain,) = await _budgets(engine, "plain")
    (with_tools,) = await _budgets(engine, "tools")
    assert plain == engine.config.budget.context_tokens
    assert with_tools == plain - _cost(engine)


@pytest.mark.parametrize("use_middleware", [False, True])
async def test_create_agent_tools_are_counted_on_every_call(
    use_middleware: bool, engine: ContextEngine
) -> None:
    middleware = []
    if use_middleware:
        middleware = [ce.langchain.middleware(engine)]
    else:
        ce.langchain.install(engine)
    agent = create_agent(
        weather_loop(),
        tools=[get_weather],
        system_prompt=SYSTEM,
        middleware=middleware,
        checkpointer=InMemorySaver(),
    )
    await agent.ainvoke(
        {"messages": [("user", "weather in Paris?")]}, {"configurable": {"thread_id": "agent"}}
    )
    expected = engine.config.budget.context_tokens - _cost(engine)
    assert await _budgets(engine, "agent") == [expected, expected]
