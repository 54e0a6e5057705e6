"""``mode="augment"``: the model receives the app's own messages (tool results as the tools
returned them), the engine's context as one more system message after the app's system
prompt; on the global patch, through ``wrap()`` and through the middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
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


@pytest.mark.parametrize("seam", ["install", "wrap", "middleware"])
async def test_augment_keeps_the_apps_messages_and_adds_the_context(
    seam: str, engine: ContextEngine
) -> None:
    model = make_model()
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
