"""``CondenseQuestionChatEngine`` (``as_chat_engine(chat_mode="condense_question")``): each
turn condenses the conversation and the new message into a standalone question, then asks a
query engine. None of its model calls carries the conversation: the condense step is one prompt,
the answer is the query engine's synthesizer's. Both are components of the chat's session and
get exactly what LlamaIndex sends; the chat's turns (the user's message, the answer) are the
session's conversation, per user. Streamed or not, sync or async; llama-index-llms-openai's
``OpenAI`` on the scripted OpenAI server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.chat_engine import CondenseQuestionChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.stores import MemoryStore
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

PARIS = "Paris is the capital of France."
BERLIN = "Berlin is the capital of Germany."
QUESTIONS = {
    "alice": ["Tell me about France.", "And its capital?"],
    "bob": ["Tell me about Germany.", "Which city is its capital?"],
}
PATHS = ["chat", "achat", "stream_chat", "astream_chat"]


def _condensing(body: dict[str, Any]) -> bool:
    return "standalone question" in str(body["messages"][-1]["content"])


def _script(body: dict[str, Any]) -> ScriptedResponse:
    last = str(body["messages"][-1]["content"])
    if _condensing(body):
        follow_up = last.split("<Follow Up Message>")[1].split("<Standalone question>")[0]
        return ScriptedResponse(text=f"STANDALONE {follow_up.strip()}")
    query = last.split("Query: ")[1].split("\n")[0]
    return ScriptedResponse(text=f"ANSWER to {query}")


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    served = ScriptedOpenAIServer(_script).start()
    yield served
    served.close()


def _chat_engine(server: ScriptedOpenAIServer, user: str, streaming: bool) -> Any:
    documents = [Document(text=PARIS), Document(text=BERLIN)]
    index = VectorStoreIndex.from_documents(documents, embed_model=MockEmbedding(embed_dim=8))
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    return CondenseQuestionChatEngine.from_defaults(
        query_engine=index.as_query_engine(llm=llm, streaming=streaming, similarity_top_k=2),
        llm=llm,
        memory=ChatMemoryBuffer.from_defaults(chat_store_key=user),
    )


async def _converse(chat: Any, path: str, question: str) -> str:
    if path == "chat":
        return str(await asyncio.to_thread(chat.chat, question))
    if path == "achat":
        return str(await chat.achat(question))
    if path == "stream_chat":
        response = await asyncio.to_thread(chat.stream_chat, question)
        return "".join(await asyncio.to_thread(list, response.response_gen))
    response = await chat.astream_chat(question)
    return "".join([token async for token in response.async_response_gen()])


@pytest.mark.parametrize("path", PATHS)
async def test_the_chat_is_the_session_and_each_call_gets_what_llamaindex_sends(
    path: str, server: ScriptedOpenAIServer
) -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    ce.llamaindex.install(engine)
    try:
        chats = {user: _chat_engine(server, user, "stream" in path) for user in QUESTIONS}
        answers: dict[str, list[str]] = {user: [] for user in QUESTIONS}

        async def user_turns(user: str) -> None:
            for question in QUESTIONS[user]:
                answers[user].append(await _converse(chats[user], path, question))

        await asyncio.gather(*(user_turns(user) for user in QUESTIONS))
        await engine.flush()
    finally:
        ce.llamaindex.uninstall()

    answering = [r["messages"] for r in server.requests if not _condensing(r)]
    assert len(answering) == 4
    for messages in answering:
        # the query engine's prompt alone, as LlamaIndex builds it: no earlier turn of anyone
        assert [m["role"] for m in messages] == ["system", "user"]
        assert "ANSWER" not in str(messages)
        assert PARIS in messages[1]["content"] and BERLIN in messages[1]["content"]
    sessions = await engine.list_sessions()
    for user, questions in QUESTIONS.items():
        assert answers[user][0] == f"ANSWER to {questions[0]}"
        assert answers[user][1] == f"ANSWER to STANDALONE {questions[1]}"
        doc = await engine.get_session(user)
        turns = [(m.role, m.content) for m in doc.session.messages]
        assert turns == [
            (Role.USER, questions[0]),
            (Role.ASSISTANT, answers[user][0]),
            (Role.USER, questions[1]),
            (Role.ASSISTANT, answers[user][1]),
        ]
        replies = doc.session.messages[1::2]
        assert all(m.invocation and m.invocation.model == "gpt-4o" for m in replies)
        # the condense step and the synthesizer's calls: components of the user's session
        components = [s for s in sessions if s.startswith(f"{user}/")]
        assert len(components) == 3
        for component in components:
            inner = (await engine.get_session(component)).session.messages
            assert [m.role for m in inner][-1] is Role.ASSISTANT
            assert all(m.content not in questions[:1] for m in inner)
    await engine.close()
