"""Offline LangChain models and tools shared by the ce-langchain tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

SYSTEM = "You are the weather agent."
USAGE = {"input_tokens": 11, "output_tokens": 5, "total_tokens": 16}


class BindingFake(GenericFakeChatModel):
    """A fake provider: ``bind_tools`` binds OpenAI-format ``tools`` like real providers do;
    every message list and the kwargs it received are kept."""

    seen: list[list[BaseMessage]] = []
    seen_kwargs: list[dict[str, Any]] = []

    def bind_tools(  # type: ignore[override]
        self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
    ) -> Runnable[Any, AIMessage]:
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        self.seen_kwargs.append(dict(kw))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kw)


def replying(*replies: AIMessage | str) -> BindingFake:
    """A fake that answers with ``replies`` in turn."""
    return BindingFake(messages=iter(replies), seen=[], seen_kwargs=[])


def weather_loop() -> BindingFake:
    """A fake that calls ``get_weather`` for Paris once, then answers."""
    return replying(
        AIMessage(
            content="",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_w"}],
            usage_metadata=USAGE,
        ),
        AIMessage(content="Paris is sunny.", usage_metadata=USAGE),
    )


@tool
def get_weather(city: str) -> str:
    """The weather in a city, with a long description to make the schema cost tokens."""
    return f"sunny in {city}"
