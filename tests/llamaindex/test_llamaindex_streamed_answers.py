"""A streamed answer comes back in the next turn's history in one of two forms: a chat
engine's memory holds it stripped (llama-index-core's ``StreamingAgentChatResponse`` writes
``final_text.strip()``), an app that keeps its own history holds the streamed tokens joined,
with the whitespace the model wrote around the answer (as the model's reply has it). Either
way the model must get each earlier answer once, not the recorded reply and the history's
copy both. Real ``SimpleChatEngine``, ``ContextChatEngine`` and
``CondensePlusContextChatEngine`` on llama-index-llms-openai's ``OpenAI`` against the scripted
OpenAI server, each user in a named session (the memory's ``chat_store_key``),
``stream_chat`` and ``astream_chat``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.chat_engine import (
    CondensePlusContextChatEngine,
    ContextChatEngine,
    SimpleChatEngine,
)
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.stores import MemoryStore
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.llamaindex._scopes import ChatTurn

KINDS = ("simple", "context", "condense-plus-context")
USERS = ("alice", "bob")


def _reply(body: dict[str, Any]) -> ScriptedResponse:
    """An answer naming the question it answers, with whitespace around it as models write
    it (a leading space, a closing newline)."""
    question = str(body["messages"][-1]["content"])
    return ScriptedResponse(text=f" Answer to <{question[-24:]}>.\n")


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    served = ScriptedOpenAIServer(_reply).start()
    yield served
    served.close()


def _chat_engine(kind: str, llm: OpenAI, user: str) -> Any:
    memory = ChatMemoryBuffer.from_defaults(chat_store_key=user)
    system_prompt = f"SYS-{user}: answer briefly."
    if kind == "simple":
        return SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=system_prompt)
    documents = [Document(text="Paris is mild in autumn.", doc_id="p")]
    index = VectorStoreIndex.from_documents(documents, embed_model=MockEmbedding(embed_dim=8))
    engine_class = ContextChatEngine if kind == "context" else CondensePlusContextChatEngine
    return engine_class.from_defaults(
        retriever=index.as_retriever(similarity_top_k=1),
        llm=llm,
        memory=memory,
        system_prompt=system_prompt,
    )


async def _stream(chat: Any, question: str, path: str, history: list[ChatMessage] | None) -> str:
    """The answer to ``question`` as the app reads it: the streamed tokens joined (with the
    app's own ``history`` as the chat history, when it keeps one)."""
    if path == "stream":

        def read() -> str:
            return "".join(chat.stream_chat(question, chat_history=history).response_gen)

        return await asyncio.to_thread(read)
    response = await chat.astream_chat(question, chat_history=history)
    return "".join([token async for token in response.async_response_gen()])


def _answer_bodies(server: ScriptedOpenAIServer, user: str) -> list[list[dict[str, Any]]]:
    """The messages of the answering calls of ``user``'s chat (not a condense step)."""
    return [
        r["messages"]
        for r in server.requests
        if r["messages"][0]["role"] == "system" and f"SYS-{user}" in str(r["messages"][0])
    ]


@pytest.mark.parametrize("history", ["memory", "app"])
@pytest.mark.parametrize("path", ["stream", "astream"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_streamed_answer_reaches_the_next_turn_once(
    kind: str, path: str, history: str, server: ScriptedOpenAIServer
) -> None:
    """``history="memory"``: the chat engine's memory carries the conversation (the answers
    stripped); ``"app"``: the app passes its own history, the streamed answers as read."""
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    ce.llamaindex.install(engine)
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    chats = {user: _chat_engine(kind, llm, user) for user in USERS}
    kept: dict[str, list[ChatMessage]] = {user: [] for user in USERS}
    for turn in (1, 2, 3):
        for user in USERS:
            question = f"{user}-{turn}: how is Paris?"
            own = list(kept[user]) if history == "app" else None
            answer = await _stream(chats[user], question, path, own)
            assert answer.startswith(" ") and answer.endswith("\n")  # as the model wrote it
            kept[user] += [
                ChatMessage(role="user", content=question),
                ChatMessage(role="assistant", content=answer),
            ]
    await engine.flush()
    for user in USERS:
        bodies = _answer_bodies(server, user)
        assert len(bodies) == 3
        last = bodies[-1]
        answers = [m["content"].strip() for m in last if m["role"] == "assistant"]
        assert answers == [  # the two earlier answers, once each
            f"Answer to <{user}-1: how is Paris?>.",
            f"Answer to <{user}-2: how is Paris?>.",
        ]
        questions = [m["content"] for m in last if m["role"] == "user"]
        assert questions == [f"{user}-{turn}: how is Paris?" for turn in (1, 2, 3)]
        other = next(u for u in USERS if u != user)
        assert all(other not in str(m["content"]) for m in last)
        doc = await engine.get_session(user)
        stored = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
        assert len(stored) == 3 and len(set(stored)) == 3  # each answer once
    await engine.close()


def test_a_streamed_response_freed_while_the_tracker_is_locked_never_deadlocks() -> None:
    """A streamed response the app drops is forgotten by a weakref callback, which the
    collector may run inside any block of the plugin's: it must not wait for the tracker's
    (non-reentrant) lock, held by that block."""

    class Response:
        pass

    plugin = ce.llamaindex.install(ContextEngine(MemoryStore()))
    tracker = plugin.tracker
    done = threading.Event()

    def drop_inside_the_lock() -> None:
        held = [Response()]
        tracker.stream_turn(held[0], ChatTurn("chat-1", "question", "s"))
        with tracker.lock:
            held.clear()  # the last reference: the callback runs here, inside the lock
        done.set()

    worker = threading.Thread(target=drop_inside_the_lock, daemon=True)
    worker.start()
    worker.join(10)  # a deadlock never returns: give up on it after a while
    deadlocked = not done.is_set()
    if deadlocked:  # the stuck worker holds the lock for good: let uninstall() take another
        tracker.lock = threading.Lock()
    ce.llamaindex.uninstall()
    assert not deadlocked
    assert tracker._streamed == {}
