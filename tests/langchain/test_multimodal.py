"""The app's own messages through the engine (issue 11): an image part reaches the wire
unchanged (ChatOpenAI on the scripted OpenAI server, sync and async); in replace mode the
messages the engine kept are the app's own objects (ids, ``additional_kwargs``), a message whose
text the engine redacted keeps its image, and augment mode keeps the app's objects too."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib
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
    convert_to_openai_messages,
)
from langchain_openai import ChatOpenAI
from scripted import replies, texts

import ce.langchain
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages, to_openai_messages
from ce.core.integration import openai_to_messages
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine
from ce.core.tokens import TiktokenEstimator

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


async def _call(model: Any, path: str, messages: list[BaseMessage]) -> None:
    """``model.invoke`` (on a worker thread) or ``model.ainvoke`` with ``messages``."""
    if path == "invoke":
        await asyncio.to_thread(model.invoke, messages)
    else:
        await model.ainvoke(messages)


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
    await _call(model, path, messages)

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


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_named_agents_messages_go_as_the_apps_own_and_their_names_are_counted(
    path: str, engine: ContextEngine
) -> None:
    """A multi-agent app names who wrote each message (a LangGraph supervisor's agents
    answer as ``AIMessage(name=...)``): those messages reach the model as the app's own
    objects, name and id kept, not as unnamed assistant turns the calling agent would take for
    its own; the session stores the names, and the budget counts them as they go."""
    ce.langchain.install(engine, session_id="team")
    messages: list[BaseMessage] = [
        SystemMessage("You are the writer.", id="sys-1"),
        HumanMessage("Brief me on Oslo.", name="alice", id="u-1"),
        AIMessage("Facts: 9 C and rain in Oslo.", name="researcher", id="a-1"),
        AIMessage("Noted.", name="writer", id="a-2"),
        HumanMessage("Write it, please.", name="alice", id="u-2"),
    ]
    model = replies("Pack a rain jacket.")
    await _call(model, path, messages)
    (sent,) = model.seen
    assert all(a is b for a, b in zip(sent[1:], messages[1:], strict=True))
    assert [m.name for m in sent[1:]] == ["alice", "researcher", "writer", "alice"]
    doc = await engine.get_session("team")
    stored = [(m.role.value, m.name, m.content) for m in doc.session.messages[1:5]]
    assert stored == [
        ("user", "alice", "Brief me on Oslo."),
        ("assistant", "researcher", "Facts: 9 C and rain in Oslo."),
        ("assistant", "writer", "Noted."),
        ("user", "alice", "Write it, please."),
    ]
    (turn,) = await engine.list_turns("team")
    wire = to_openai_messages(from_openai_messages(convert_to_openai_messages(sent)))
    counted = TiktokenEstimator().estimate_messages(openai_to_messages(wire), "gpt-4o")
    assert turn.report.token_used == counted  # the names included


async def test_an_agents_reply_named_after_its_call_goes_as_the_apps_own_to_the_next_agent(
    engine: ContextEngine,
) -> None:
    """A LangGraph agent names its reply after the model call that made it
    (``create_react_agent(name=...)``): the session stored the reply unnamed, and the next
    agent's request still carries the app's own message, its name and id kept."""
    ce.langchain.install(engine, session_id="graph")
    history: list[BaseMessage] = [HumanMessage("Brief me on Oslo.")]
    model = replies("Facts: 9 C and rain in Oslo.", "Pack a rain jacket.")
    reply = await model.ainvoke([SystemMessage("You are the researcher."), *history])
    reply.name = "researcher"
    history.append(reply)
    await model.ainvoke([SystemMessage("You are the writer."), *history])
    sent = model.seen[-1]
    assert sent[-1] is reply and sent[-1].name == "researcher" and sent[-1].id == reply.id


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


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_message_changed_in_place_after_a_call_never_goes_as_it_now_is(
    path: str, engine: ContextEngine
) -> None:
    # a continued history is not converted again (its cost grows with what is new); an old
    # message the app changed in place must then not reach the model as the app's object
    ce.langchain.install(engine, session_id="edited")
    messages: list[BaseMessage] = [SystemMessage("You are terse."), HumanMessage("Hi!")]
    model = replies("one", "two")

    async def call() -> None:
        if path == "invoke":
            messages.append(await asyncio.to_thread(model.invoke, messages))
        else:
            messages.append(await model.ainvoke(messages))

    await call()
    messages[1].content = f"Hi! Mail {CANARY}"  # changed in place, after the call
    messages.append(HumanMessage("And now?"))
    await call()
    _, second = model.seen
    assert CANARY not in texts(second)
    assert [m.content for m in second[1:]] == ["Hi!", "one", "And now?"]
    assert second[1] is not messages[1]  # the engine's version, not the changed object
    assert second[2] is messages[2] and second[3] is messages[3]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_shared_message_changed_in_place_never_goes_as_it_now_is_in_any_session(
    path: str, engine: ContextEngine
) -> None:
    # one message object in two users' histories, changed in place between their calls:
    # the session that converted it before the change must not send it as it now is, though
    # the other session converted it since
    ce.langchain.install(engine)
    shared = HumanMessage("Hi!")
    histories: dict[str, list[BaseMessage]] = {
        s: [SystemMessage("You are terse."), shared] for s in ("alice", "bob")
    }
    model = replies("one", "two", "three")

    async def call(session: str) -> None:
        messages = histories[session]
        config: Any = {"metadata": {"ce_session_id": session}}
        if path == "invoke":
            messages.append(await asyncio.to_thread(model.invoke, messages, config))
        else:
            messages.append(await model.ainvoke(messages, config))

    await call("alice")
    shared.content = f"Hi! Mail {CANARY}"  # changed in place, after alice's call
    await call("bob")
    histories["alice"].append(HumanMessage("And now?"))
    await call("alice")
    # (the first call got the shared object itself: it reads as changed now)
    assert CANARY not in texts(model.seen[1]) and CANARY not in texts(model.seen[2])
    last = model.seen[-1]
    assert [m.content for m in last[1:]] == ["Hi!", "one", "And now?"]
    assert last[1] is not shared


async def test_a_rewritten_message_is_copied_once_and_again_when_the_app_changes_it(
    engine: ContextEngine,
) -> None:
    # the engine fences a tool result on every call: the model gets one copy of the app's
    # message, a new one once the app gives the message a new field value
    ce.langchain.install(engine, session_id="fenced")
    tool_call = {"name": "lookup", "args": {"q": "pixel"}, "id": "call_1"}
    result = ToolMessage("a pixel", tool_call_id="call_1", id="t-1", artifact={"raw": 1})
    messages: list[BaseMessage] = [
        SystemMessage("You are terse."),
        HumanMessage("Look it up."),
        AIMessage("", id="a-1", tool_calls=[tool_call]),
        result,
    ]
    model = replies("one", "two", "three")
    for question in ("Again?", "And now?"):
        messages.append(await model.ainvoke(messages))
        messages.append(HumanMessage(question))
    result.artifact = {"raw": 2}
    await model.ainvoke(messages)
    first, second, third = (seen[3] for seen in model.seen)
    assert all(isinstance(m, ToolMessage) and "a pixel" in str(m.content) for m in (first, second))
    assert first is not result and second is first  # the engine's text, copied once
    assert third is not first and isinstance(third, ToolMessage)
    assert third.artifact == {"raw": 2} and "a pixel" in str(third.content)


def _engine_text(content: Any) -> str:
    """The text of a message the engine wrote: a string, or (a message with media parts) the
    text part of its content-part list."""
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if part["type"] == "text")
    return content or ""


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
            _engine_text(m.get("content")),
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


# -- images counted against the budget (issue 11) -----------------------------------------


def png(width: int, height: int) -> str:
    """A PNG data URL of ``width`` x ``height`` (its header: all the token counter reads)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    body = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def _wire_call(engine: ContextEngine, session: str, messages: list[BaseMessage]) -> Any:
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="Seen.")) as server:
        model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
        model.invoke(messages, {"metadata": {"ce_session_id": session}})
        (request,) = server.requests
    return request["messages"]


@pytest.mark.parametrize("mode", ["replace", "augment"])
async def test_the_image_reaches_the_wire_unchanged_and_is_counted(
    mode: str, engine: ContextEngine
) -> None:
    # the report's token_used includes the image by OpenAI's rule: a 1x1 picture on gpt-4o
    # is one 512 px tile, 85 + 170 = 255 tokens more than the same question without it
    ce.langchain.install(engine, mode=mode)
    pictured = app_messages()
    plain = app_messages()
    plain[-1] = HumanMessage("What is in this picture?", id="u-2")
    wire = await asyncio.to_thread(_wire_call, engine, "with", pictured)
    await asyncio.to_thread(_wire_call, engine, "without", plain)
    assert wire[-1]["content"] == [{"type": "text", "text": "What is in this picture?"}, IMAGE]
    (with_image,) = await engine.list_turns("with")
    (without,) = await engine.list_turns("without")
    assert with_image.report.token_used == without.report.token_used + 255
    doc = await engine.get_session("with")
    stored = [m for m in doc.session.messages if m.role.value == "user"][-1]
    assert [p.type for p in stored.parts or ()] == ["text", "image"]


@pytest.mark.parametrize(("budget", "action"), [(1200, "degraded"), (790, "dropped")])
async def test_an_old_image_message_goes_for_budget_and_the_new_one_keeps_its_image(
    budget: int, action: str
) -> None:
    # 1024 x 1024 is 765 tokens on gpt-4o: two do not fit, so the old message goes, its image
    # with it: at a cheaper level (its text saying the image was left out) or entirely; the
    # model does not get the old picture back from the app's own message object
    config = BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=0)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=config))
    ce.langchain.install(engine)
    big = {"type": "image_url", "image_url": {"url": png(1024, 1024)}}
    messages: list[BaseMessage] = [
        SystemMessage("You describe pictures."),
        HumanMessage(content=[{"type": "text", "text": "Look at this."}, big], id="u-1"),
        AIMessage("A big picture.", id="a-1"),
        HumanMessage(content=[{"type": "text", "text": "And this one?"}, big], id="u-2"),
    ]
    wire = await asyncio.to_thread(_wire_call, engine, "budget", messages)
    images = [m for m in wire if isinstance(m["content"], list) and big in m["content"]]
    assert images == [wire[-1]]
    assert wire[-1]["content"] == [{"type": "text", "text": "And this one?"}, big]
    old = [m for m in wire if "Look at this." in str(m["content"])]
    if action == "degraded":
        assert old == [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Look at this.\n[image omitted]"}],
            }
        ]
    else:
        assert old == []
    (turn,) = await engine.list_turns("budget")
    assert turn.report.token_used <= budget
    doc = await engine.get_session("budget")
    old_id = next(m.message_id for m in doc.session.messages if m.content == "Look at this.")
    (decision,) = [d for d in turn.report.prune_decisions if d.block_id == f"msg:{old_id}"]
    assert decision.action == action
    await engine.close()


async def test_a_tool_results_image_is_counted_and_kept(engine: ContextEngine) -> None:
    # a tool that returns a picture (a screenshot): the engine counts it, the model gets the
    # app's tool message with it
    ce.langchain.install(engine)
    tool_call = {"name": "shot", "args": {}, "id": "call_1"}

    def history(result: Any) -> list[BaseMessage]:
        return [
            HumanMessage("Take a screenshot.", id="u-1"),
            AIMessage("", id="a-1", tool_calls=[tool_call]),
            ToolMessage(result, tool_call_id="call_1", id="t-1"),
        ]

    model = replies("A pixel.", "Text.")
    pictured = history([{"type": "text", "text": "the screen"}, IMAGE])
    await model.ainvoke(pictured, {"metadata": {"ce_session_id": "shot"}})
    await model.ainvoke(history("the screen"), {"metadata": {"ce_session_id": "text"}})
    tool = model.seen[0][-1]
    assert isinstance(tool, ToolMessage) and IMAGE in tool.content
    (with_image,) = await engine.list_turns("shot")
    (without,) = await engine.list_turns("text")
    assert with_image.report.token_used == without.report.token_used + 255
