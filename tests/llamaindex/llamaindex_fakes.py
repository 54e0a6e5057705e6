"""An offline function-calling LLM for the ce-llamaindex tests: it answers from a script, reports
usage, streams, and keeps every message list it received."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from ce.llamaindex._convert import to_openai

Reply = tuple[str, list[tuple[str, str, dict[str, Any]]]]
"""``(text, [(call id, tool name, arguments)])``"""


class ScriptedLLM(FunctionCallingLLM):
    """Replies with ``script(messages as OpenAI dicts)``; usage is 10 prompt tokens per
    message and 5 completion tokens. ``seen`` holds what every call received."""

    script: Callable[[list[dict[str, Any]]], Reply]
    seen: list[list[ChatMessage]] = []

    @classmethod
    def class_name(cls) -> str:
        return "ScriptedLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_function_calling_model=True, is_chat_model=True, model_name="fake")

    def _reply(self, messages: Sequence[ChatMessage]) -> ChatResponse:
        self.seen.append(list(messages))
        text, calls = self.script(to_openai(messages))
        usage = {"prompt_tokens": 10 * len(messages), "completion_tokens": 5}
        message = ChatMessage(
            role="assistant",
            content=text,
            additional_kwargs={
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": n, "arguments": json.dumps(a)},
                    }
                    for i, n, a in calls
                ]
            }
            if calls
            else {},
        )
        return ChatResponse(message=message, raw={"usage": usage}, additional_kwargs=dict(usage))

    def _chunks(self, messages: Sequence[ChatMessage]) -> Iterator[ChatResponse]:
        reply = self._reply(messages)
        text = reply.message.content or ""
        words = text.split(" ") if text else [""]
        for index in range(len(words)):
            last = index == len(words) - 1
            yield ChatResponse(
                message=reply.message
                if last
                else ChatMessage(role="assistant", content=" ".join(words[: index + 1])),
                delta=words[index] if index == 0 else " " + words[index],
                raw=reply.raw if last else None,
                additional_kwargs=reply.additional_kwargs if last else {},
            )

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._reply(messages)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._reply(messages)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._chunks(messages)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        chunks = self._chunks(messages)

        async def gen() -> AsyncIterator[ChatResponse]:
            for chunk in chunks:
                yield chunk

        return gen()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=prompt)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        return CompletionResponse(text=prompt)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        yield CompletionResponse(text=prompt, delta=prompt)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        async def gen() -> AsyncIterator[CompletionResponse]:
            yield CompletionResponse(text=prompt, delta=prompt)

        return gen()

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                ChatMessage(role="user", content=user_msg)
                if isinstance(user_msg, str)
                else user_msg
            )
        specs = [t.metadata.to_openai_tool(skip_length_check=True) for t in tools]
        return {"messages": messages, "tools": specs or None}

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        return [
            ToolSelection(
                tool_id=call["id"],
                tool_name=call["function"]["name"],
                tool_kwargs=json.loads(call["function"]["arguments"]),
            )
            for call in response.message.additional_kwargs.get("tool_calls") or []
        ]


class NestingLLM(ScriptedLLM):
    """Like LlamaIndex's MockFunctionCallingLLM: ``achat`` calls ``chat``, so one call opens
    two chat spans and emits two sets of LLM events."""

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)


class ChatCompletingLLM(ScriptedLLM):
    """Serves ``complete`` through its own ``chat``, as llama-index-llms-anthropic and other
    chat-only providers do: a completion opens a chat span inside the completion span."""

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        reply = self.chat([ChatMessage(role="user", content=prompt)])
        return CompletionResponse(text=reply.message.content or "")

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        reply = await self.achat([ChatMessage(role="user", content=prompt)])
        return CompletionResponse(text=reply.message.content or "")
