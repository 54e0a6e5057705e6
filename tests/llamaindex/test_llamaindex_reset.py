"""A LlamaIndex memory's reset (``chat_engine.reset()``, ``memory.reset()`` /
``await memory.areset()``) starts the conversation over: the model's next request holds none
of the messages (nor the documents retrieved) before the reset, in the session the memory's
runs used and in no other. Real chat engines and agents on llama-index-llms-openai's ``OpenAI``
against the scripted OpenAI server; the assertions are on the request bodies it received."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.chat_engine import (
    CondensePlusContextChatEngine,
    ContextChatEngine,
    SimpleChatEngine,
)
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import (
    ChatMemoryBuffer,
    ChatSummaryMemoryBuffer,
    Memory,
    SimpleComposableMemory,
)
from llama_index.core.memory.types import BaseMemory
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core.engine import ContextEngine
from ce.core.integration import INTEGRATION_FAILED
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.llamaindex import ContextEngineMemory

SYS = "SYS"
PARIS = "PARIS-DOC: Paris is mild in autumn, with about 15 degrees in the afternoon."
OSLO = "OSLO-DOC: Oslo is cold in autumn, with about 7 degrees in the afternoon."


def _reply(body: dict[str, Any]) -> ScriptedResponse:
    users = [m for m in body["messages"] if m["role"] == "user"]
    return ScriptedResponse(text=f"answer to {_text(users[-1]['content'])}")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return str(content)


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    served = ScriptedOpenAIServer(_reply).start()
    yield served
    served.close()


def _llm(server: ScriptedOpenAIServer) -> OpenAI:
    return OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")


def _contents(request: dict[str, Any]) -> list[str]:
    return [_text(m["content"]) for m in request["messages"]]


def _asked(server: ScriptedOpenAIServer, question: str) -> dict[str, Any]:
    """The last request whose last user message is ``question``."""
    asking = [r for r in server.requests if _text(r["messages"][-1]["content"]) == question]
    assert asking, f"no request asked {question!r}"
    return asking[-1]


MEMORIES = {
    "default-memory": (lambda: None, None),
    "memory-session": (lambda: Memory.from_defaults(session_id="user-7"), None),
    "keyed-buffer": (lambda: ChatMemoryBuffer.from_defaults(chat_store_key="user-7"), None),
    "summary-buffer": (
        lambda: ChatSummaryMemoryBuffer.from_defaults(chat_store_key="user-7", token_limit=4000),
        None,
    ),
    "composable-install-default": (
        lambda: SimpleComposableMemory.from_defaults(
            primary_memory=ChatMemoryBuffer.from_defaults()
        ),
        "s-install",
    ),
    "ce-memory": (lambda: ContextEngineMemory.from_defaults(session_id="user-7"), None),
}


def _simple(server: ScriptedOpenAIServer, memory: BaseMemory | None) -> SimpleChatEngine:
    extra = {} if memory is None else {"memory": memory}
    return SimpleChatEngine.from_defaults(llm=_llm(server), system_prompt=SYS, **extra)


@pytest.mark.parametrize("kind", list(MEMORIES))
async def test_a_chat_engines_reset_starts_the_conversation_over(
    kind: str, server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    make, default_session = MEMORIES[kind]
    ce.llamaindex.install(engine, session_id=default_session)
    chat = _simple(server, make())

    def conversation() -> None:
        chat.chat("first secret question")
        chat.chat("second question")
        chat.reset()
        assert chat.chat_history == []
        chat.chat("new conversation question")

    await asyncio.to_thread(conversation)
    assert _contents(_asked(server, "second question")) == [
        SYS,
        "first secret question",
        "answer to first secret question",
        "second question",
    ]
    assert _contents(_asked(server, "new conversation question")) == [
        SYS,
        "new conversation question",
    ]


@pytest.mark.parametrize("how", ["chat_engine.reset()", "await memory.areset()"])
@pytest.mark.parametrize("kind", ["default-memory", "keyed-buffer", "ce-memory"])
async def test_the_async_path_starts_over_too(
    kind: str, how: str, server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    ce.llamaindex.install(engine)
    chat = _simple(server, MEMORIES[kind][0]())
    await chat.achat("first secret question")
    await chat.achat("second question")
    if how == "chat_engine.reset()":
        chat.reset()  # sync, on the loop's thread: queued before the session's next call
    else:
        await chat._memory.areset()
    response = await chat.astream_chat("new conversation question")
    assert [t async for t in response.async_response_gen()]
    assert len(_contents(_asked(server, "second question"))) == 4
    assert _contents(_asked(server, "new conversation question")) == [
        SYS,
        "new conversation question",
    ]


class CityRetriever(BaseRetriever):
    """The documents of the cities the question names."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__()
        self._nodes = [TextNode(text=t, id_=t.split("-")[0]) for t in texts]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        question = query_bundle.query_str
        return [NodeWithScore(node=n, score=1.0) for n in self._nodes if n.id_.title() in question]


@pytest.mark.parametrize("kind", [ContextChatEngine, CondensePlusContextChatEngine])
async def test_a_rag_chat_engine_after_reset_sends_nothing_of_the_earlier_conversation(
    kind: Any, server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    ce.llamaindex.install(engine)
    chat = kind.from_defaults(
        retriever=CityRetriever([PARIS, OSLO]),
        llm=_llm(server),
        memory=ChatMemoryBuffer.from_defaults(chat_store_key="rag-user"),
        system_prompt="CHAT-SYS: answer from the documents.",
    )

    def conversation() -> None:
        chat.chat("Weather in Paris?")
        chat.chat("And what about Paris tomorrow?")
        chat.reset()
        chat.chat("Weather in Oslo?")

    await asyncio.to_thread(conversation)
    before = json.dumps(_asked(server, "And what about Paris tomorrow?"))
    assert "Weather in Paris?" in before and "PARIS-DOC" in before
    after = json.dumps(_asked(server, "Weather in Oslo?")["messages"])
    assert "OSLO-DOC" in after
    for earlier in ("PARIS-DOC", "Paris", "answer to Weather", "answer to And"):
        assert earlier not in after


@pytest.mark.parametrize("naming", ["keyed buffers", "instrument_tags"])
async def test_one_users_reset_leaves_the_other_users_conversation(
    naming: str, server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    ce.llamaindex.install(engine)
    users = ["alice", "bob"]
    chats = {
        user: _simple(
            server,
            ChatMemoryBuffer.from_defaults(
                chat_store_key=user if naming == "keyed buffers" else "chat_history"
            ),
        )
        for user in users
    }

    async def ask(user: str, question: str) -> None:
        if naming == "instrument_tags":
            with instrument_tags({"ce_session_id": f"chat-{user}"}):
                await chats[user].achat(question)
        else:
            await chats[user].achat(question)

    await asyncio.gather(*(ask(u, f"{u} first question") for u in users))
    await asyncio.gather(*(ask(u, f"{u} second question") for u in users))
    await chats["alice"]._memory.areset()
    await asyncio.gather(*(ask(u, f"{u} third question") for u in users))
    assert _contents(_asked(server, "alice third question")) == [SYS, "alice third question"]
    assert _contents(_asked(server, "bob third question")) == [
        SYS,
        "bob first question",
        "answer to bob first question",
        "bob second question",
        "answer to bob second question",
        "bob third question",
    ]


@pytest.mark.parametrize("naming", ["instrument_tags", "engine.session", "install default"])
async def test_a_conversation_named_around_the_runs_is_cleared_by_a_reset_outside_them(
    naming: str, server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    ce.llamaindex.install(engine, session_id="conv-1" if naming == "install default" else None)
    chat = _simple(server, ChatMemoryBuffer.from_defaults())

    def ask(question: str) -> None:
        if naming == "instrument_tags":
            with instrument_tags({"ce_session_id": "conv-1"}):
                chat.chat(question)
        elif naming == "engine.session":
            with engine.session("conv-1"):
                chat.chat(question)
        else:
            chat.chat(question)

    def conversation() -> None:
        ask("first secret question")
        ask("second question")
        chat.reset()  # outside the tags / engine.session: the session the runs used
        ask("new conversation question")

    await asyncio.to_thread(conversation)
    assert len(_contents(_asked(server, "second question"))) == 4
    assert _contents(_asked(server, "new conversation question")) == [
        SYS,
        "new conversation question",
    ]
    doc = await engine.get_session("conv-1")
    assert "first secret question" in json.dumps([m.content for m in doc.session.messages])


@pytest.mark.parametrize("how", ["await memory.areset()", "memory.reset()"])
async def test_an_agents_memory_reset_starts_its_next_run_over(
    how: str, server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    ce.llamaindex.install(engine)
    agent = FunctionAgent(tools=[], llm=_llm(server), system_prompt=SYS, streaming=False)
    memory = Memory.from_defaults(session_id="agent-user")
    await agent.run(user_msg="first secret question", memory=memory)
    await agent.run(user_msg="second question", memory=memory)
    if how == "memory.reset()":
        memory.reset()
    else:
        await memory.areset()
    await agent.run(user_msg="new conversation question", memory=memory)
    assert "first secret question" in _contents(_asked(server, "second question"))
    assert _contents(_asked(server, "new conversation question")) == [
        SYS,
        "new conversation question",
    ]


async def test_a_memory_no_run_used_clears_only_the_session_it_names(
    server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    ce.llamaindex.install(engine, session_id="shared")
    chat = _simple(server, ChatMemoryBuffer.from_defaults())  # names no conversation
    await chat.achat("first question")
    ChatMemoryBuffer.from_defaults().reset()  # names nothing, no run used it: clears nothing
    await chat.achat("second question")
    assert len(_contents(_asked(server, "second question"))) == 4
    # a memory rebuilt for a conversation (another worker, a restart) resets it by its name
    first = _simple(server, Memory.from_defaults(session_id="user-9"))
    await first.achat("user-9 question")
    await Memory.from_defaults(session_id="user-9").areset()
    rebuilt = _simple(server, Memory.from_defaults(session_id="user-9"))
    await rebuilt.achat("user-9 again")
    assert _contents(_asked(server, "user-9 again")) == [SYS, "user-9 again"]


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_an_engine_error_during_a_reset_fails_open(
    path: str, server: ScriptedOpenAIServer, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = ce.llamaindex.install(engine)
    chat = _simple(server, ChatMemoryBuffer.from_defaults(chat_store_key="user-7"))
    await chat.achat("first question")

    async def broken(session_id: str) -> Any:
        raise RuntimeError("store down")

    failed = plugin.failures[INTEGRATION_FAILED]
    monkeypatch.setattr(engine, "clear_history", broken)
    if path == "sync":
        await asyncio.to_thread(chat.reset)
    else:
        await chat._memory.areset()
    assert chat._memory.get_all() == []  # the app's reset stands
    assert plugin.failures[INTEGRATION_FAILED] == failed + 1  # logged, a Degraded event


async def test_the_plugin_holds_a_memory_weakly(
    server: ScriptedOpenAIServer, engine: ContextEngine
) -> None:
    plugin = ce.llamaindex.install(engine)
    memory = ChatMemoryBuffer.from_defaults(chat_store_key="user-7")
    chat = _simple(server, memory)
    await chat.achat("question")
    assert plugin.tracker is not None and plugin.tracker.memory_session(memory) == "user-7"
    held = weakref.ref(memory)
    del chat, memory
    gc.collect()
    assert held() is None


async def test_a_context_engine_memory_without_the_plugin_clears_its_session(
    engine: ContextEngine,
) -> None:
    memory = ContextEngineMemory.from_defaults(engine, session_id="solo")
    memory.put(ChatMessage(role="user", content="first secret question"))
    memory.put(ChatMessage(role="assistant", content="an answer"))
    assert [m.content for m in await memory.aget()] == ["first secret question", "an answer"]
    await memory.areset()
    assert await memory.aget_all() == []
    memory.put(ChatMessage(role="user", content="new conversation question"))
    assert [m.content for m in await memory.aget()] == ["new conversation question"]
    memory.reset()
    assert memory.get_all() == []
    memory.put(ChatMessage(role="user", content="third conversation"))
    assert [m.content for m in memory.get()] == ["third conversation"]
    doc = await engine.get_session("solo")  # stored still
    assert len(doc.session.messages) == 4
