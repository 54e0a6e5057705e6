"""Async paths await the engine (issue 11), on llama-index-llms-openai's ``OpenAI`` against the
scripted OpenAI server: ``achat``, ``astream_chat``, a ``FunctionAgent`` tool loop (streaming
or not), a ``ReActAgent`` and a chat engine run with a blocking engine (``engine.sync``) that
fails on any use, and the model still receives the engine's input (the notebook, within the
budget, redacted) while the calls are recorded; 20 sessions × 3 calls at once never see each
other; the image blocks of the app's messages reach the wire; the seams come off exactly and
cover LLM classes defined after ``install()``."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import FunctionAgent, ReActAgent
from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatResponse,
    DocumentBlock,
    ImageBlock,
    TextBlock,
)
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.callbacks import llm_chat_callback
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI
from llamaindex_fakes import ScriptedLLM

import ce.llamaindex
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.schema import Role
from ce.core.stores import SQLiteStore
from ce.core.testing import (
    ScriptedOpenAIServer,
    ScriptedResponse,
    deterministic_engine,
    no_blocking,
)
from ce.core.tokens import TiktokenEstimator
from ce.llamaindex import ContextEngineMemory

SYSTEM = "You answer from the knowledge base."
CANARY = "zed.canary@example.com"
REDACTED = "[REDACTED:email]"
MARK = "NOTEBOOK-MARK-ASYNC"
BUDGET = BudgetConfig(max_input_tokens=900, reserved_reply_tokens=100)
FILLER = "Background detail that matters little. " * 30
IMAGE = "https://example.com/cat.png"


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    yield engine
    await engine.close()


def _tokens(request: dict[str, Any]) -> int:
    estimator = TiktokenEstimator()
    parts = from_openai_messages(request["messages"])
    return sum(estimator.estimate_message(p.role, p.content, "gpt-4o") for p in parts)


def _openai(server: ScriptedOpenAIServer, **kwargs: Any) -> OpenAI:
    return OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test", **kwargs)


def search_kb(query: str) -> str:
    """Search the knowledge base."""
    return f"Fact about {query}: it is documented."


def _agent_script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="Here is what the knowledge base says.")
    return ScriptedResponse(tool_calls=[("call_kb", "search_kb", json.dumps({"query": "cats"}))])


def _history() -> list[ChatMessage]:
    """An app's conversation longer than the budget, ending with a question that carries the
    canary."""
    messages = [ChatMessage(role="system", content=SYSTEM)]
    for turn in range(12):
        messages.append(ChatMessage(role="user", content=f"Old question {turn}. {FILLER}"))
        messages.append(ChatMessage(role="assistant", content=f"Old answer {turn}. {FILLER}"))
    messages.append(ChatMessage(role="user", content=f"New question: mail me at {CANARY}."))
    return messages


def _react_script(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text="Thought: I can answer without a tool.\nAnswer: Done.")


QUESTION = f"New question: mail me at {CANARY}."
PATHS = {  # the async paths apps take, and the LLM methods they end in
    "achat": "achat",
    "astream_chat": "astream_chat",
    "function_agent": "astream_chat_with_tools",
    "function_agent_no_streaming": "achat_with_tools",
    "react_agent": "astream_chat",
    "chat_engine": "astream_chat",
}


async def _run(path: str, llm: OpenAI) -> str:
    """One async run of ``path``; the answer."""
    if path == "achat":
        return str((await llm.achat(_history())).message.content)
    if path == "astream_chat":
        return str([c async for c in await llm.astream_chat(_history())][-1].message.content)
    if path == "chat_engine":
        chat = SimpleChatEngine.from_defaults(llm=llm, system_prompt=SYSTEM)
        streamed = await chat.astream_chat(QUESTION)
        return "".join([token async for token in streamed.async_response_gen()])
    tools = [FunctionTool.from_defaults(search_kb)]
    agent: Any
    if path == "react_agent":
        agent = ReActAgent(tools=tools, llm=llm, system_prompt=SYSTEM)
    else:
        streaming = path == "function_agent"
        agent = FunctionAgent(tools=tools, llm=llm, system_prompt=SYSTEM, streaming=streaming)
    handler = agent.run(user_msg=QUESTION)
    async for _ in handler.stream_events():
        pass
    return str((await handler).response.content)


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_the_async_path_awaits_the_engine_and_never_blocks(
    path: str, engine: ContextEngine
) -> None:
    script: Any = lambda body: ScriptedResponse(text="Done.")  # noqa: E731
    script = {"react_agent": _react_script}.get(path, script)
    script = _agent_script if path.startswith("function_agent") else script
    with ScriptedOpenAIServer(script) as server:
        llm = _openai(server, additional_kwargs={"stream_options": {"include_usage": True}})
        ce.llamaindex.install(engine)
        await engine.update_notebook("s-async", MARK)
        with no_blocking(engine) as blocking, instrument_tags({"ce_session_id": "s-async"}):
            reply = await _run(path, llm)
            ce.llamaindex.uninstall()
        requests = server.requests

    agent = path.startswith("function_agent")
    assert blocking.used == []
    assert len(requests) == (2 if agent else 1)
    assert [r.get("stream", False) for r in requests][-1] == ("stream" in PATHS[path])
    for request in requests:
        messages = request["messages"]
        assert messages[0]["role"] == "system"
        assert MARK in messages[0]["content"]
        if path != "react_agent":  # llama-index-core 0.14.0's ReActAgent drops system_prompt
            assert SYSTEM in messages[0]["content"]
        assert CANARY not in json.dumps(request)
        assert _tokens(request) <= BUDGET.max_input_tokens - BUDGET.reserved_reply_tokens
    assert REDACTED in requests[0]["messages"][-1]["content"]
    if agent:
        assert requests[1]["messages"][-1]["role"] == "tool"
    elif path in ("achat", "astream_chat"):
        assert len(requests[0]["messages"]) < len(_history())  # the budget left history out
    await engine.flush()
    doc = await engine.get_session("s-async")
    assert len(doc.session.model_usage) == len(requests)
    assert all((u.prompt_tokens, u.completion_tokens) == (10, 5) for u in doc.session.model_usage)
    answers = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert answers[-1] in (reply, f"Thought: I can answer without a tool.\nAnswer: {reply}")


async def test_twenty_sessions_at_once_each_see_only_their_own(engine: ContextEngine) -> None:
    """20 sessions × 3 ``achat`` calls under ``asyncio.gather``, each call sending only its new
    question: every request carries its own session's earlier turns (from the engine) and no
    other session's canary, with no blocking engine call."""
    words = [f"word{chr(65 + i)}{chr(65 + i)}canary" for i in range(20)]

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text=f"ack {len(body['messages'])}")

    with ScriptedOpenAIServer(echo) as server:
        llm = _openai(server)
        ce.llamaindex.install(engine)

        async def user(index: int) -> None:
            for turn in range(3):
                question = f"turn {turn}: my word is {words[index]}"
                with instrument_tags({"ce_session_id": f"user-{index}"}):
                    await llm.achat([ChatMessage(role="user", content=question)])

        with no_blocking(engine) as blocking:
            await asyncio.gather(*(user(i) for i in range(20)))
            ce.llamaindex.uninstall()
        requests = server.requests

    assert blocking.used == []
    assert len(requests) == 60
    seen: dict[str, list[int]] = {}
    for request in requests:
        text = json.dumps(request)
        (word,) = [w for w in words if w in text]
        turn = int(request["messages"][-1]["content"].split(":")[0].removeprefix("turn "))
        seen.setdefault(word, []).append(turn)
        for earlier in range(turn):  # the session's history, from the engine
            assert f"turn {earlier}: my word is {word}" in text
    assert {w: sorted(t) for w, t in seen.items()} == {w: [0, 1, 2] for w in words}
    await engine.flush()
    for index in range(20):
        doc = await engine.get_session(f"user-{index}")
        assert len(doc.session.model_usage) == 3


def _image_message(text: str) -> ChatMessage:
    return ChatMessage(
        role="user", blocks=[TextBlock(text=text), ImageBlock(url=IMAGE, detail="low")]
    )


def _image_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    if not isinstance(content, list):
        return []
    return [p for p in content if p.get("type") == "image_url"]


@pytest.mark.parametrize("path", ["chat", "achat"])
async def test_image_blocks_reach_the_model_unchanged(path: str, engine: ContextEngine) -> None:
    """An earlier message with an image (unchanged: the app's very object is sent) and a new
    question with an image whose text the engine redacts: both images reach the wire, on the
    next call too (the redacted one is then history the engine stored redacted)."""
    replies = [ScriptedResponse(text="A cat."), ScriptedResponse(text="You are welcome.")]
    with ScriptedOpenAIServer(replies) as server:
        llm = _openai(server)
        ce.llamaindex.install(engine, session_id="s-image")
        mine = [
            ChatMessage(role="system", content=SYSTEM),
            _image_message("Here is my first picture."),
            ChatMessage(role="assistant", content="Nice picture."),
            _image_message(f"And this one? Mail me at {CANARY}."),
        ]

        async def ask() -> ChatResponse:
            return llm.chat(mine) if path == "chat" else await llm.achat(mine)

        first = await ask()
        mine += [first.message, ChatMessage(role="user", content="Thanks!")]
        await ask()
        requests = server.requests
    assert len(requests) == 2
    for request in requests:
        users = [m for m in request["messages"] if m["role"] == "user"]
        for message in users[:2]:
            (part,) = _image_parts(message)
            assert part["image_url"]["url"] == IMAGE
        assert "Here is my first picture." in json.dumps(users[0])
        assert REDACTED in json.dumps(users[1]) and CANARY not in json.dumps(request)
    assert json.dumps(requests[1]["messages"][-1]["content"]) == '"Thanks!"'


def _png(width: int, height: int) -> bytes:
    """A PNG of ``width`` x ``height`` (its header: all the token counter reads)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    body = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return b"\x89PNG\r\n\x1a\n" + body


PIXEL_URL = "data:image/png;base64," + base64.b64encode(_png(1, 1)).decode()


@pytest.mark.parametrize("mode", ["replace", "augment"])
@pytest.mark.parametrize("form", ["url", "bytes"])
async def test_an_image_is_counted_by_openais_rule_and_reaches_the_wire(
    mode: str, form: str
) -> None:
    """A 1x1 picture on gpt-4o is one 512 px tile: the report's token_used is 85 + 170 = 255
    more than for the same question without it, whether the block holds a data URL or the
    image bytes; the wire gets the image as LlamaIndex's OpenAI LLM sends it."""
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    block = ImageBlock(url=PIXEL_URL) if form == "url" else ImageBlock(image=_png(1, 1))
    pictured = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", blocks=[TextBlock(text="What is this?"), block]),
    ]
    plain = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content="What is this?"),
    ]
    replies = [ScriptedResponse(text="A pixel."), ScriptedResponse(text="Nothing.")]
    with ScriptedOpenAIServer(replies) as server:
        llm = _openai(server)
        ce.llamaindex.install(engine, session_id="s-with", mode=mode)
        await llm.achat(pictured)
        ce.llamaindex.uninstall()
        ce.llamaindex.install(engine, session_id="s-without", mode=mode)
        await llm.achat(plain)
        first = server.requests[0]
    (part,) = _image_parts(first["messages"][-1])
    assert part["image_url"]["url"] == PIXEL_URL
    (with_image,) = await engine.list_turns("s-with")
    (without,) = await engine.list_turns("s-without")
    assert with_image.report.token_used == without.report.token_used + 255
    doc = await engine.get_session("s-with")
    assert [p.type for p in doc.session.messages[-2].parts or ()] == ["text", "image"]
    await engine.close()


@pytest.mark.parametrize(("budget", "action"), [(1200, "degraded"), (790, "dropped")])
async def test_an_old_image_message_goes_for_budget(budget: int, action: str) -> None:
    """Two 1024 x 1024 pictures (765 tokens each on gpt-4o) do not fit: the old message goes
    at a cheaper level, without its image (the app's own block is not put back), or entirely;
    the new one keeps its image."""
    config = BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=0)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=config))
    big = "data:image/png;base64," + base64.b64encode(_png(1024, 1024)).decode()
    mine = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", blocks=[TextBlock(text="Look at this."), ImageBlock(url=big)]),
        ChatMessage(role="assistant", content="A big picture."),
        ChatMessage(role="user", blocks=[TextBlock(text="And this one?"), ImageBlock(url=big)]),
    ]
    with ScriptedOpenAIServer([ScriptedResponse(text="Another.")]) as server:
        ce.llamaindex.install(engine, session_id="s-budget")
        await _openai(server).achat(mine)
        (request,) = server.requests
    wire = request["messages"]
    assert [len(_image_parts(m)) for m in wire][-1] == 1
    assert sum(len(_image_parts(m)) for m in wire) == 1
    old = [m["content"] for m in wire if "Look at this." in json.dumps(m)]
    assert old == (["Look at this.\n[image omitted]"] if action == "degraded" else [])
    (turn,) = await engine.list_turns("s-budget")
    assert turn.report.token_used <= budget
    doc = await engine.get_session("s-budget")
    old_id = next(m.message_id for m in doc.session.messages if m.content == "Look at this.")
    (decision,) = [d for d in turn.report.prune_decisions if d.block_id == f"msg:{old_id}"]
    assert decision.action == action
    await engine.close()


async def test_stored_image_history_is_rebuilt_with_its_image() -> None:
    """The app passes only its new question: the earlier picture comes from the session, as
    a message the plugin builds from the engine's input, image block and all."""
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    replies = [ScriptedResponse(text="A pixel."), ScriptedResponse(text="Yes.")]
    with ScriptedOpenAIServer(replies) as server:
        llm = _openai(server)
        ce.llamaindex.install(engine, session_id="s-history")
        await llm.achat(
            [ChatMessage(role="user", blocks=[TextBlock(text="Look."), ImageBlock(url=PIXEL_URL)])]
        )
        await llm.achat([ChatMessage(role="user", content="Still there?")])
        second = server.requests[1]["messages"]
    pictured = [m for m in second if _image_parts(m)]
    assert len(pictured) == 1 and _image_parts(pictured[0])[0]["image_url"]["url"] == PIXEL_URL
    assert second[-1]["content"] == "Still there?"
    await engine.close()


def test_inline_media_are_encoded_once_not_on_every_call() -> None:
    """A framework passes the same blocks on every call: the data URL handed to the engine is
    the same string each time (no new copy of the picture per call)."""
    from ce.llamaindex._convert import to_openai

    by_url = ChatMessage(role="user", blocks=[TextBlock(text="a"), ImageBlock(url=PIXEL_URL)])
    by_bytes = ChatMessage(role="user", blocks=[TextBlock(text="b"), ImageBlock(image=_png(2, 2))])
    for message in (by_url, by_bytes):
        first, second = to_openai([message]), to_openai([message])
        assert first == second
        assert (
            first[0]["content"][1]["image_url"]["url"]
            is second[0]["content"][1]["image_url"]["url"]
        )


def test_audio_and_document_blocks_become_engine_parts_and_back() -> None:
    from ce.llamaindex._convert import _build, to_openai

    pdf = b"%PDF-1.4\n<< /Type /Page >>\n"
    wav = b"RIFF" + b"\x00" * 40
    message = ChatMessage(
        role="user",
        blocks=[
            TextBlock(text="Listen and read."),
            AudioBlock(audio=wav, format="wav"),
            DocumentBlock(data=pdf, title="a.pdf", document_mimetype="application/pdf"),
        ],
    )
    (converted,) = to_openai([message])
    (part,) = from_openai_messages([converted])
    assert part.content == "Listen and read."
    assert [p.type for p in part.parts or ()] == ["text", "audio", "file"]
    rebuilt = _build(converted)
    assert [type(b).__name__ for b in rebuilt.blocks] == [
        "TextBlock",
        "AudioBlock",
        "DocumentBlock",
    ]
    assert to_openai([rebuilt]) == [converted]


async def test_the_seams_come_off_exactly_and_cover_classes_made_later(
    engine: ContextEngine,
) -> None:
    originals = {m: vars(OpenAI)[m] for m in ("achat", "astream_chat")}
    ce.llamaindex.install(engine, session_id="s-later")
    assert all(vars(OpenAI)[m] is not o for m, o in originals.items())
    assert "__init_subclass__" in vars(BaseLLM)

    class Later(ScriptedLLM):  # an LLM class defined after install()
        @llm_chat_callback()
        async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
            return self._reply(messages)

    await engine.update_notebook("s-later", MARK)
    llm = Later(script=lambda messages: ("ok", []), seen=[])
    with no_blocking(engine) as blocking:
        await llm.achat([ChatMessage(role="user", content="made later")])
    assert blocking.used == []
    assert MARK in str(llm.seen[0][0].content)
    ce.llamaindex.uninstall()
    assert all(vars(OpenAI)[m] is o for m, o in originals.items())
    assert "__init_subclass__" not in vars(BaseLLM)
    assert not getattr(vars(Later)["achat"], "ce_async_seam", False)
    await llm.achat([ChatMessage(role="user", content="after uninstall")])
    assert [m.content for m in llm.seen[1]] == ["after uninstall"]


def test_the_last_calls_record_survives_its_event_loop_ending(tmp_path: Path) -> None:
    """A short script's only call: its record's flush task is cancelled when ``asyncio.run``
    shuts the loop down in the middle of the write (an SQLite store awaits a worker thread);
    the record is still there for the next engine use."""
    engine = ContextEngine(store=SQLiteStore(str(tmp_path / "sessions.db")))
    llm = ScriptedLLM(script=lambda messages: ("the last answer", []), seen=[])
    ce.llamaindex.install(engine, session_id="s-last")

    async def script() -> None:  # a short script: one call, then the loop is closed
        await llm.achat([ChatMessage(role="user", content="one question")])

    asyncio.run(script())
    ce.llamaindex.uninstall()
    engine.sync.flush()
    doc = engine.sync.get_session("s-last")
    engine.sync.close()
    assert [m.content for m in doc.session.messages if m.role is Role.ASSISTANT] == [
        "the last answer"
    ]
    assert len(doc.session.model_usage) == 1


async def test_an_async_chat_engine_on_the_engines_memory_never_blocks(
    engine: ContextEngine,
) -> None:
    llm = ScriptedLLM(script=lambda messages: ("the answer", []), seen=[])
    ce.llamaindex.install(engine)
    memory = ContextEngineMemory.from_defaults(engine, session_id="s-memory")
    chat = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM)
    with no_blocking(engine) as blocking:
        assert str(await chat.achat(f"first, mail {CANARY}")) == "the answer"
        streamed = await chat.astream_chat("second")
        assert "".join([t async for t in streamed.async_response_gen()]) == "the answer"
        await engine.flush()
        history = [m.content for m in await memory.aget_all()]
    assert blocking.used == []
    assert history == [f"first, mail {REDACTED}", "the answer", "second", "the answer"]
    assert CANARY not in str(llm.seen[-1])


@pytest.mark.parametrize("entry", ["chat", "stream_chat"])
async def test_blocking_calls_from_async_code_keep_their_history(entry: str) -> None:
    """An app calling ``chat`` / ``stream_chat`` from async code, yielding to its loop
    between calls: each call's records are written inline (none left queued on the loop the
    next call blocks), so every call gets the session's history."""
    engine = deterministic_engine()
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="noted")) as server:
        llm = _openai(server)
        plugin = ce.llamaindex.install(engine)
        with instrument_tags({"ce_session_id": "notebook"}):
            for i in range(4):
                messages = [ChatMessage(role="user", content=f"question {i}")]
                if entry == "chat":
                    llm.chat(messages)
                else:
                    list(llm.stream_chat(messages))
                await asyncio.sleep(0)  # the loop runs whatever is ready
        ce.llamaindex.uninstall()
        requests = server.requests
    assert not plugin.failures
    assert [len(r["messages"]) for r in requests] == [1, 3, 5, 7]
