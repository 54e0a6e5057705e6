"""Bound tools cost budget: with tools bound to the call (``bind_tools``, or ``create_agent``
binding them), the engine gets their schemas and every turn's ``token_budget`` shrinks by the
tools' tokens, on the global patch path (invoke / ainvoke / stream / astream) and through the
middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.stores import MemoryStore
from ce.langchain import LangChainPlugin

SYSTEM = "You are the weather agent."
USAGE = {"input_tokens": 11, "output_tokens": 5, "total_tokens": 16}


class BindingFake(GenericFakeChatModel):
    """A fake provider whose ``bind_tools`` binds OpenAI-format ``tools`` like real providers;
    every message list and the kwargs it received are kept."""

    seen: list[list[BaseMessage]] = []
    seen_kwargs: list[dict[str, Any]] = []

    def bind_tools(  # type: ignore[override]
        self, tools: Sequence[Any], **kwargs: Any
    ) -> Runnable[Any, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        self.seen_kwargs.append(dict(kw))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kw)


def make_model(*replies: str) -> BindingFake:
    if replies:
        return BindingFake(messages=iter(replies), seen=[], seen_kwargs=[])
    script: list[AIMessage | str] = [
        AIMessage(
            content="",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_w"}],
            usage_metadata=USAGE,
        ),
        AIMessage(content="Paris is sunny.", usage_metadata=USAGE),
    ]
    return BindingFake(messages=iter(script), seen=[], seen_kwargs=[])


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = ContextEngine(
        MemoryStore(),
        clock=SteppingClock(),
        id_generator=SequentialIdGenerator("id"),
        config=RuntimeConfig(model_hint="gpt-4o"),
    )
    yield engine
    await engine.close()


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    yield
    if LangChainPlugin().installed:
        LangChainPlugin().uninstall()


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
    await _call(path, make_model("sunny"), engine, "plain")
    model = make_model("sunny")
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
        make_model(),
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
