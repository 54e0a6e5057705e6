"""A continued ``ChatHistory`` is converted once: the auto-function-calling loop's next round
and the app's next turn on the same ``ChatHistory`` convert only their new messages; the
engine is handed what the full conversion would hand it (authors, media, an agent's repeated
reply read once); an old message the app changed in place after a request passed it never
reaches the model as it now is (the engine's version goes instead)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import pytest
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import (
    AuthorRole,
    ChatHistory,
    ChatMessageContent,
    FunctionCallContent,
    FunctionResultContent,
    ImageContent,
    TextContent,
)
from semantic_kernel.functions import KernelArguments, kernel_function
from sk_apps import kernel_with, wire

import ce.semantic_kernel
import ce.semantic_kernel._inject as inject
from ce.core.engine import ContextEngine
from ce.core.integration import HistoryMemo
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.testing.assertions import assert_restored_history_continues
from ce.semantic_kernel._convert import (
    author,
    continued,
    from_sent,
    opaque,
    to_openai,
    to_pending,
)

SYSTEM = "You are terse."
CANARY = "edit.canary@example.com"


class Weather:
    @kernel_function(name="weather", description="The weather in a city.")
    def weather(self, city: Annotated[str, "the city"]) -> str:
        return f"sunny in {city}"


def _script(body: dict[str, Any]) -> ScriptedResponse:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return ScriptedResponse(text="It is sunny.")
    if "weather" in str(last.get("content")):
        return ScriptedResponse(tool_calls=[("call_w", "W-weather", json.dumps({"city": "Oslo"}))])
    return ScriptedResponse(text=f"reply {len(body['messages'])}")


async def _request(service: Any, history: ChatHistory, kernel: Any, stream: bool) -> Any:
    settings = OpenAIChatPromptExecutionSettings(
        function_choice_behavior=FunctionChoiceBehavior.Auto()
    )
    arguments = KernelArguments(ce_session_id="s-edit")
    if not stream:
        return await service.get_chat_message_content(
            history, settings, kernel=kernel, arguments=arguments
        )
    total = None
    async for chunk in service.get_streaming_chat_message_content(
        history, settings, kernel=kernel, arguments=arguments
    ):
        if chunk is not None:
            total = chunk if total is None else total + chunk
    return total


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_message_changed_in_place_after_a_request_never_goes_as_it_now_is(
    stream: bool, engine: ContextEngine
) -> None:
    # a continued history is not converted again (its cost grows with what is new): an old
    # message the app changed in place must then not reach the model as the app's object
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server, (Weather(), "W"))
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        history = ChatHistory(system_message=SYSTEM)
        history.add_user_message("Hi!")
        history.add_message(await _request(service, history, kernel, stream))
        history.messages[1].content = f"Hi! Mail {CANARY}"  # changed in place, after the call
        history.add_user_message("And now?")
        await _request(service, history, kernel, stream)
        _, second = server.requests
    assert CANARY not in wire(second)
    sent = [(m["role"], m.get("content")) for m in second["messages"][1:]]
    assert sent == [("user", "Hi!"), ("assistant", "reply 2"), ("user", "And now?")]
    assert str(history.messages[1].content) == f"Hi! Mail {CANARY}"  # the app's, untouched
    doc = await engine.get_session("s-edit")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == ["Hi!", "And now?"]


async def test_the_loops_next_round_converts_only_its_new_messages(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[int] = []

    def counting(messages: Sequence[Any]) -> list[dict[str, Any]]:
        converted.append(len(messages))
        return to_openai(messages)

    monkeypatch.setattr(inject, "to_openai", counting)
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server, (Weather(), "W"))
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        history = ChatHistory(system_message=SYSTEM)
        history.add_user_message("The weather in Oslo?")
        history.add_message(await _request(service, history, kernel, False))
        history.add_user_message("Thanks!")
        await _request(service, history, kernel, False)
        requests = server.requests
    # round 1: system + user; round 2: + the function call and its result; the next turn:
    # + the reply and the new question
    assert converted == [2, 2, 2]
    assert [m["role"] for m in requests[1]["messages"]][-2:] == ["assistant", "tool"]
    assert requests[2]["messages"][-1]["content"] == "Thanks!"
    assert [str(m.role.value) for m in history.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]


def _messages() -> list[Any]:
    image = ImageContent(uri="https://example.com/cat.png")
    reply = ChatMessageContent(role=AuthorRole.ASSISTANT, content="Facts.", name="researcher")
    return [
        ChatMessageContent(role=AuthorRole.SYSTEM, content=SYSTEM),
        ChatMessageContent(role=AuthorRole.USER, items=[TextContent(text="See this"), image]),
        ChatMessageContent(
            role=AuthorRole.ASSISTANT,
            name="researcher",
            items=[FunctionCallContent(id="c1", name="W-weather", arguments='{"city": "Oslo"}')],
        ),
        ChatMessageContent(
            role=AuthorRole.TOOL,
            items=[FunctionResultContent(id="c1", name="W-weather", result="sunny")],
        ),
        reply,
        reply.model_copy(deep=True),  # an AgentGroupChat channel's repeat
        ChatMessageContent(role=AuthorRole.ASSISTANT, content="Brief.", name="writer"),
    ]


@pytest.mark.parametrize("split", [0, 3, 5, 6])
def test_a_continued_history_reads_as_a_full_conversion(split: int) -> None:
    app = _messages()
    histories = HistoryMemo()
    for messages in (app[:split], app):  # a first request, then the history continued
        history = histories.convert("s", messages, to_openai, opaque, author)
        assert history is not None
        pending = continued(history)
        full = to_pending(messages)
        assert pending.dicts == full.dicts
        assert pending.authors == full.authors
        assert pending.opaque == full.opaque
        assert len(pending.messages) == len(full.messages)
        assert all(a is b for a, b in zip(pending.messages, full.messages, strict=True))
    assert full.opaque == [1]
    assert len(full.messages) == len(app) - 1  # the repeat read once


def test_from_sent_builds_a_message_changed_since_its_conversion() -> None:
    app = [
        ChatMessageContent(role=AuthorRole.USER, content="hi"),
        ChatMessageContent(role=AuthorRole.ASSISTANT, content="ok"),
    ]
    history = HistoryMemo().convert("s", app, to_openai, opaque, author)
    assert history is not None
    pending = continued(history)
    sent = [dict(d) for d in history.pending]
    assert list(from_sent(sent, pending, history).messages) == app  # as they are
    first, second = from_sent(sent, pending, history).messages
    assert first is app[0] and second is app[1]
    app[0].content = f"hi, mail {CANARY}"
    first, second = from_sent(sent, pending, history).messages
    assert first is not app[0] and str(first.content) == "hi"
    assert second is app[1]
    app[1].items.append(ImageContent(uri="https://example.com/cat.png"))  # now opaque
    _, second = from_sent(sent, pending, history).messages
    assert second is not app[1] and str(second.content) == "ok"


def test_a_chat_history_restored_from_its_serialized_form_continues() -> None:
    # an app that keeps its ChatHistory as JSON between requests restores new objects
    history = ChatHistory(system_message="Be brief.")
    for i in range(6):
        history.add_user_message(f"Question {i}?")
        history.add_assistant_message(f"Answer {i}.")
    restored = ChatHistory.restore_chat_history(history.serialize())
    restored.add_user_message("And now?")
    assert_restored_history_continues(
        list(history.messages), list(restored.messages), to_openai, opaque
    )
