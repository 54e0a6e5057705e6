"""The app's own messages through the engine (issue 11): an image part reaches the wire
unchanged (ChatOpenAI on the scripted OpenAI server, sync and async); in replace mode the
messages the engine kept are the app's own objects (ids, ``additional_kwargs``), a message whose
text the engine redacted keeps its image, and augment mode keeps the app's objects too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_openai import ChatOpenAI
from scripted import replies

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

# a 1x1 PNG
DATA_URL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
    "hQGAhKmMIQAAAABJRU5ErkJggg=="
)
IMAGE = {"type": "image_url", "image_url": {"url": DATA_URL}}
CANARY = "alice.canary@example.com"


class Received(BaseCallbackHandler):
    """The message list every chat-model run starts with (what the model receives)."""

    def __init__(self) -> None:
        self.messages: list[list[BaseMessage]] = []

    def on_chat_model_start(
        self, serialized: Any, messages: list[list[BaseMessage]], **kwargs: Any
    ) -> None:
        self.messages.append(list(messages[0]))


def app_messages(question: str = "What is in this picture?") -> list[BaseMessage]:
    return [
        SystemMessage("You describe pictures.", id="sys-1"),
        HumanMessage("Hello!", id="u-1", additional_kwargs={"app_tag": "greeting"}),
        AIMessage(
            "Hi! Send me a picture.",
            id="a-1",
            additional_kwargs={"app_tag": "reply"},
            response_metadata={"model_name": "gpt-4o"},
        ),
        HumanMessage(
            content=[{"type": "text", "text": question}, IMAGE],
            id="u-2",
            additional_kwargs={"app_tag": "image"},
        ),
    ]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_an_image_part_reaches_the_wire_unchanged(path: str, engine: ContextEngine) -> None:
    await engine.update_notebook("pics", "NOTEBOOK-MARK")
    received = Received()
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="A single pixel.")) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        ce.langchain.install(engine)
        config: Any = {"metadata": {"ce_session_id": "pics"}, "callbacks": [received]}
        messages = app_messages()
        if path == "invoke":
            await asyncio.to_thread(model.invoke, messages, config)
        else:
            await model.ainvoke(messages, config)
        (request,) = server.requests

    wire = request["messages"]
    assert [m["role"] for m in wire] == ["system", "user", "assistant", "user"]
    assert "You describe pictures." in wire[0]["content"] and "NOTEBOOK-MARK" in wire[0]["content"]
    assert wire[-1]["content"] == [{"type": "text", "text": "What is in this picture?"}, IMAGE]
    # the model received the app's own messages: ids and additional_kwargs intact
    (sent,) = received.messages
    assert [m.id for m in sent] == ["sys-1", "u-1", "a-1", "u-2"]
    assert [m.additional_kwargs.get("app_tag") for m in sent] == [
        None,
        "greeting",
        "reply",
        "image",
    ]
    assert sent[2].response_metadata == {"model_name": "gpt-4o"}
    doc = await engine.get_session("pics")
    assert doc.session.messages[-1].content == "A single pixel."


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_replace_mode_hands_the_model_the_apps_own_objects(
    path: str, engine: ContextEngine
) -> None:
    await engine.update_notebook("own", "NOTEBOOK-MARK")
    ce.langchain.install(engine, session_id="own")
    messages = app_messages(f"Mail this picture to {CANARY}.")
    tool_call = {"name": "lookup", "args": {"q": "pixel"}, "id": "call_1"}
    messages[2:3] = [
        AIMessage("", id="a-1", tool_calls=[tool_call]),
        ToolMessage("a pixel", tool_call_id="call_1", id="t-1", artifact={"raw": 1}),
        AIMessage("Hi! Send me a picture.", id="a-2", additional_kwargs={"app_tag": "reply"}),
    ]
    model = replies("ok")
    if path == "invoke":
        await asyncio.to_thread(model.invoke, messages)
    else:
        await model.ainvoke(messages)

    (sent,) = model.seen
    assert [m.id for m in sent] == ["sys-1", "u-1", "a-1", "t-1", "a-2", "u-2"]
    # unchanged: the very objects the app passed
    assert sent[1] is messages[1] and sent[2] is messages[2] and sent[4] is messages[4]
    # the engine's text (its context; the fenced tool result; the redacted question) on a
    # copy of the app's message: the image, ids, additional_kwargs and artifact stay
    assert "NOTEBOOK-MARK" in str(sent[0].content)
    assert isinstance(sent[3], ToolMessage) and sent[3].artifact == {"raw": 1}
    assert sent[3].tool_call_id == "call_1" and "a pixel" in str(sent[3].content)
    assert sent[5].content == [
        {"type": "text", "text": "Mail this picture to [REDACTED:email]."},
        IMAGE,
    ]
    assert sent[5].additional_kwargs == {"app_tag": "image"}
    assert CANARY in str(messages[5].content)  # the app's own message is not changed


async def test_augment_mode_hands_the_model_the_apps_own_objects(engine: ContextEngine) -> None:
    await engine.update_notebook("aug", "NOTEBOOK-MARK")
    ce.langchain.install(engine, session_id="aug", mode="augment")
    messages = app_messages()
    model = replies("ok")
    await model.ainvoke(messages)
    (sent,) = model.seen
    assert sent[0] is messages[0]
    assert "NOTEBOOK-MARK" in str(sent[1].content)  # the engine's context after the prompt
    assert len(sent) == len(messages) + 1
    assert all(a is b for a, b in zip(sent[2:], messages[1:], strict=True))


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_the_same_message_objects_in_a_new_call_are_prepared_again(
    path: str, engine: ContextEngine
) -> None:
    # the engine hands the model the app's own objects back: a later call with those very
    # objects (another session here) is a new call all the same
    ce.langchain.install(engine)
    messages: list[BaseMessage] = [SystemMessage("You are terse."), HumanMessage("Hi!")]
    model = replies("one", "two")
    configs: list[Any] = [{"metadata": {"ce_session_id": s}} for s in ("first", "second")]
    if path == "invoke":  # one after the other in one thread (one context)
        await asyncio.to_thread(lambda: [model.invoke(messages, c) for c in configs])
    else:
        for config in configs:
            await model.ainvoke(messages, config)
    assert all(a is b for seen in model.seen for a, b in zip(seen, messages, strict=True))
    assert len(await engine.list_turns("first")) == 1
    assert len(await engine.list_turns("second")) == 1


def test_the_plugins_reading_of_a_message_is_the_engines() -> None:
    # reconcile compares messages by what the engine reads of them, without building the
    # engine's parts: that reading must stay the engine's own
    from ce.core.formats import from_openai_messages, to_openai_messages
    from ce.core.integration import openai_key as _key
    from ce.langchain._convert import to_openai

    messages: list[Any] = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, IMAGE, "b"], "name": "jo"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"x": 1}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r1"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2", "name": "g"},
        {"role": "assistant", "content": "done", "name": "bot"},
        *to_openai(app_messages()),
    ]
    engine_reading = [
        (
            m["role"],
            m.get("content") or "",
            m.get("tool_call_id"),
            m.get("name"),
            tuple(
                (c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in m.get("tool_calls") or ()
            ),
        )
        for m in to_openai_messages(from_openai_messages(messages))
    ]
    assert [_key(m) for m in messages] == engine_reading


async def test_blocks_the_engine_cannot_read_do_not_reach_the_model(engine: ContextEngine) -> None:
    # a block that is neither text nor media (reasoning, provider-specific) holds text the
    # redactor never saw: the model gets the message without it (ids and images kept)
    ce.langchain.install(engine, session_id="blocks")
    hidden = {"type": "reasoning", "reasoning": f"mail {CANARY}"}
    messages: list[BaseMessage] = [
        HumanMessage(content=[{"type": "text", "text": "Look."}, IMAGE, hidden], id="u-1")
    ]
    model = replies("ok")
    await model.ainvoke(messages)
    (sent,) = model.seen
    assert CANARY not in str([m.content for m in sent])
    assert sent[-1].id == "u-1"
    assert sent[-1].content == [{"type": "text", "text": "Look."}, IMAGE]
