"""A ``Memory`` with memory blocks flushes the messages that outgrow its chat history to its
blocks and drops them from the history it returns: LlamaIndex then sends them once, inside
the blocks' system message (a ``VectorMemoryBlock`` quotes them as ``<message role=...>``).
With the plugin the model receives them once too — the session stops sending what the memory
flushed — for one user over several runs, two users under ``asyncio.gather``, a flush that
takes the previous turn whole, and a sync chat engine; the store still holds every turn, and a
flushed answer that reads as one the memory keeps never takes a kept turn with it. A
``Memory`` without blocks only trims: the session's history, within the engine's budget, is
sent as before. Real agents and chat engines on llama-index-llms-openai's ``OpenAI`` against
the scripted OpenAI server; the requests are compared with the same app's without the plugin.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.memory import Memory, StaticMemoryBlock, VectorMemoryBlock
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine

BUTLER = "You are a butler."
QUESTIONS = [
    "My favourite colour is teal.",
    "Tell me a story.",
    "Another story, please.",
    "And one more.",
    "What is my favourite colour?",
    "Thank you, goodbye.",
]
LONG = "Tell me a long story."


class TextStore(BasePydanticVectorStore):
    """An in-memory vector store that keeps the text of its nodes (a ``VectorMemoryBlock``
    needs one) and returns the newest two for every query."""

    stores_text: bool = True
    _nodes: list[BaseNode] = PrivateAttr(default_factory=list)

    @property
    def client(self) -> None:
        return None

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        self._nodes.extend(nodes)
        return [n.node_id for n in nodes]

    def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
        self._nodes = [n for n in self._nodes if n.ref_doc_id != ref_doc_id]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        nodes = self._nodes[-2:]
        return VectorStoreQueryResult(
            nodes=nodes, similarities=[0.5] * len(nodes), ids=[n.node_id for n in nodes]
        )


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return str(content or "")


def script(body: dict[str, Any]) -> ScriptedResponse:
    question = _text([m for m in body["messages"] if m["role"] == "user"][-1]["content"])
    words = 200 if question == LONG else 30
    return ScriptedResponse(text=f"answer to {question} " + "words " * words)


def _sent(request: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """A request as the model reads it: its instruction (the system messages joined) and its
    turns."""
    messages = request["messages"]
    system = "\n\n".join(_text(m["content"]) for m in messages if m["role"] == "system")
    return system, [(m["role"], _text(m["content"])) for m in messages if m["role"] != "system"]


def _in_the_block_only(request: dict[str, Any], question: str) -> bool:
    """Whether ``request`` holds ``question`` once, quoted by the ``VectorMemoryBlock``."""
    system, turns = _sent(request)
    quoted = system.count(f"<message role='user'>{question}</message>") == 1
    return quoted and all(text != question for _, text in turns)


def _vector() -> VectorMemoryBlock:
    return VectorMemoryBlock(
        name="vec", vector_store=TextStore(), embed_model=MockEmbedding(embed_dim=8)
    )


def _memory(user: str, blocks: Callable[[str], list[BaseMemoryBlock]] | None) -> Memory:
    return Memory.from_defaults(
        session_id=user,
        token_limit=300,
        token_flush_size=100,
        chat_history_token_ratio=0.5,
        memory_blocks=blocks(user) if blocks is not None else [],
    )


def _profile_and_vector(user: str) -> list[BaseMemoryBlock]:
    return [
        StaticMemoryBlock(name="profile", static_content=f"The user is {user}.", priority=0),
        _vector(),
    ]


async def _converse(
    server: ScriptedOpenAIServer,
    questions: dict[str, list[str]],
    blocks: Callable[[str], list[BaseMemoryBlock]] | None,
) -> None:
    """Each user's questions, one run each, the users' runs of a round under ``gather``."""
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    agent = FunctionAgent(tools=[], llm=llm, system_prompt=BUTLER)
    memories = {user: _memory(user, blocks) for user in questions}
    for round_ in zip(*questions.values(), strict=True):
        await asyncio.gather(
            *(
                agent.run(question, memory=memories[user])
                for user, question in zip(questions, round_, strict=True)
            )
        )


async def _both(
    engine: ContextEngine,
    questions: dict[str, list[str]],
    blocks: Callable[[str], list[BaseMemoryBlock]] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests of the app without the plugin, then with it."""
    with ScriptedOpenAIServer(script) as server:
        await _converse(server, questions, blocks)
        native = server.requests
    with ScriptedOpenAIServer(script) as server:
        ce.llamaindex.install(engine)
        await _converse(server, questions, blocks)
        await engine.flush()
        return native, server.requests


def _by_user(requests: list[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    return [r for r in requests if f"The user is {user}." in json.dumps(r["messages"])]


async def _holds_every_turn(engine: ContextEngine, user: str, questions: list[str]) -> None:
    doc = await engine.get_session(user)
    said = [m for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert [m.content for m in said if m.role is Role.USER] == questions
    answers = [m.content for m in said if m.role is Role.ASSISTANT]
    assert [a.split(" words")[0] for a in answers] == [f"answer to {q}" for q in questions]


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    yield engine
    await engine.close()


async def test_flushed_turns_go_once_in_the_memory_block(engine: ContextEngine) -> None:
    native, requests = await _both(engine, {"ann": QUESTIONS}, lambda _: [_vector()])
    assert [_sent(r) for r in requests] == [_sent(r) for r in native]
    assert _in_the_block_only(requests[-1], QUESTIONS[0])
    await _holds_every_turn(engine, "ann", QUESTIONS)


async def test_two_users_under_gather_each_get_their_flushed_turns_once(
    engine: ContextEngine,
) -> None:
    questions = {user: [f"{user}: {q}" for q in QUESTIONS] for user in ("alice", "bob")}
    native, requests = await _both(engine, questions, _profile_and_vector)
    assert len(requests) == len(native) == 2 * len(QUESTIONS)
    for user, asked in questions.items():
        own = _by_user(requests, user)
        assert [_sent(r) for r in own] == [_sent(r) for r in _by_user(native, user)]
        other = "bob" if user == "alice" else "alice"
        assert not any(f"{other}:" in json.dumps(r["messages"]) for r in own)
        assert _in_the_block_only(own[-1], asked[0])
        await _holds_every_turn(engine, user, asked)


async def test_a_flush_that_takes_the_previous_turn_whole(engine: ContextEngine) -> None:
    # the long answer outgrows the chat history: putting the next question flushes every
    # message before it, the previous question and its answer included
    questions = [QUESTIONS[0], LONG, QUESTIONS[4], QUESTIONS[5]]
    native, requests = await _both(engine, {"ann": questions}, lambda _: [_vector()])
    assert _sent(native[2])[1] == [("user", QUESTIONS[4])]  # LlamaIndex flushed them all
    assert [_sent(r) for r in requests] == [_sent(r) for r in native]
    assert all(_in_the_block_only(request, LONG) for request in requests[2:])
    await _holds_every_turn(engine, "ann", questions)


def _chat(server: ScriptedOpenAIServer, questions: list[str]) -> None:
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    memory = _memory("carol", lambda _: [_vector()])
    chat_engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=BUTLER)
    for question in questions:
        chat_engine.chat(question)


async def test_a_sync_chat_engines_flushed_turns_go_once(engine: ContextEngine) -> None:
    # SimpleChatEngine puts the question into the memory before its model call, and a sync
    # put runs the flush on an event loop of LlamaIndex's own
    questions = [*QUESTIONS[:2], LONG, *QUESTIONS[2:]]
    with ScriptedOpenAIServer(script) as server:
        await asyncio.to_thread(_chat, server, questions)
        native = server.requests
    with ScriptedOpenAIServer(script) as server:
        ce.llamaindex.install(engine)
        await asyncio.to_thread(_chat, server, questions)
        requests = server.requests
    await engine.flush()
    assert [_sent(r) for r in requests] == [_sent(r) for r in native]
    assert _in_the_block_only(requests[-1], QUESTIONS[0])
    assert all(_in_the_block_only(request, LONG) for request in requests[3:])
    await _holds_every_turn(engine, "carol", questions)


def same_answer_script(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text="Certainly. " + "words " * 20)


async def test_an_answer_given_twice_never_cuts_a_kept_turn(engine: ContextEngine) -> None:
    # every answer reads the same: a flushed one reads as those the memory keeps, which a cut
    # up to the newest stored one of them would take with their turns
    questions = [*QUESTIONS, "One more question.", "The last one."]

    def users(request: dict[str, Any]) -> list[str]:
        return [text for role, text in _sent(request)[1] if role == "user"]

    with ScriptedOpenAIServer(same_answer_script) as server:
        await _converse(server, {"ann": questions}, lambda _: [_vector()])
        native = server.requests
    with ScriptedOpenAIServer(same_answer_script) as server:
        ce.llamaindex.install(engine)
        await _converse(server, {"ann": questions}, lambda _: [_vector()])
        requests = server.requests
    assert [users(r) for r in requests] == [users(r) for r in native]


async def test_a_memory_without_blocks_trims_only(engine: ContextEngine) -> None:
    # no block holds what the memory flushes: the engine's budget replaces the trimming
    native, requests = await _both(engine, {"ann": QUESTIONS}, None)
    assert QUESTIONS[0] not in json.dumps(native[-1]["messages"])
    turns = _sent(requests[-1])[1]
    assert [text for role, text in turns if role == "user"] == QUESTIONS
    await _holds_every_turn(engine, "ann", QUESTIONS)
