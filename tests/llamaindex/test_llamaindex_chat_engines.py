"""LlamaIndex chat engines inline what they retrieve into their system prompt (a context
template); the plugin records the same hits as evidence. The model gets each retrieved text
once: fenced with its evidence id, budgeted as evidence, the prompt pointing at it; a budget
too small for it leaves it out (reported), never sends it raw. Real ``ContextChatEngine`` and
``CondensePlusContextChatEngine`` on llama-index-llms-openai's ``OpenAI`` against the scripted
OpenAI server, sync and async."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.chat_engine import CondensePlusContextChatEngine, ContextChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.openai import OpenAI

import ce.llamaindex
from ce.core import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.pipeline import LEFT_OUT_POINTER
from ce.core.schema import EvidenceType
from ce.core.stores import MemoryStore
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

PARIS = "Paris is mild in autumn, with about 15 degrees in the afternoon. " * 6
OSLO = "Oslo is cold in autumn, with about 7 degrees in the afternoon. " * 6
ENGINES = {"context": ContextChatEngine, "condense-plus-context": CondensePlusContextChatEngine}


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    served = ScriptedOpenAIServer(lambda body: ScriptedResponse(text="answer")).start()
    yield served
    served.close()


def _chat_engine(kind: str, server: ScriptedOpenAIServer) -> Any:
    documents = [
        Document(text=PARIS.strip(), metadata={"source": "kb://paris"}, doc_id="p"),
        Document(text=OSLO.strip(), metadata={"source": "kb://oslo"}, doc_id="o"),
    ]
    index = VectorStoreIndex.from_documents(documents, embed_model=MockEmbedding(embed_dim=8))
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    return ENGINES[kind].from_defaults(
        retriever=index.as_retriever(similarity_top_k=2),
        llm=llm,
        memory=ChatMemoryBuffer.from_defaults(),
        system_prompt="CHAT-SYS: answer from the documents.",
    )


def _answer_calls(server: ScriptedOpenAIServer) -> list[str]:
    """The request bodies of the answering chat calls (not a condense step), as text."""
    return [
        json.dumps(r["messages"][0]["content"])
        for r in server.requests
        if r["messages"][0]["role"] == "system"
    ]


async def _run(chat: Any, path: str) -> None:
    questions = ["How is the weather in Paris?", "And in Oslo?"]
    if path == "sync":
        await asyncio.to_thread(lambda: [chat.chat(q) for q in questions])
    else:
        for question in questions:
            await chat.achat(question)


@pytest.mark.parametrize("path", ["sync", "async"])
@pytest.mark.parametrize("kind", list(ENGINES))
async def test_retrieved_text_reaches_the_model_once_fenced_with_its_evidence(
    kind: str, path: str, server: ScriptedOpenAIServer
) -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    ce.llamaindex.install(engine, session_id="rag-chat")
    chat = _chat_engine(kind, server)
    await _run(chat, path)
    await engine.flush()
    doc = await engine.get_session("rag-chat")
    hits = {e.content: e.evidence_id for e in doc.evidences.values()}
    hits = {text: eid for text, eid in hits.items() if "autumn" in text}
    assert len(hits) == 2
    calls = _answer_calls(server)
    assert len(calls) == 2
    for system in calls:
        for text, evidence_id in hits.items():
            quoted = json.dumps(text)[1:-1]
            assert system.count(quoted) == 1  # once, not raw and fenced
            fence = re.search(rf'<evidence id=\\"{evidence_id}\\"[^>]*>(.*?)</evidence>', system)
            assert fence is not None and quoted in fence.group(1)
            assert f"evidence {evidence_id}" in system  # the prompt points at it
        assert "CHAT-SYS: answer from the documents." in system
    (stored,) = [m for m in doc.session.messages if m.role.value == "system"][-1:]
    assert PARIS.strip()[:40] not in stored.content  # the instruction references, not quotes
    await engine.close()


def _tight_context_chat(
    server: ScriptedOpenAIServer, max_input_tokens: int, session_id: str
) -> tuple[ContextEngine, Any]:
    """An engine with ``max_input_tokens`` (100 of them for the reply), installed for
    ``session_id``, and a ContextChatEngine on the scripted server."""
    config = RuntimeConfig(
        model_hint="gpt-4o",
        budget=BudgetConfig(max_input_tokens=max_input_tokens, reserved_reply_tokens=100),
    )
    engine = ContextEngine(MemoryStore(), config=config)
    ce.llamaindex.install(engine, session_id=session_id)
    return engine, _chat_engine("context", server)


async def test_a_tight_budget_leaves_the_retrieved_text_out_never_raw(
    server: ScriptedOpenAIServer,
) -> None:
    """With no room for the documents the model gets the prompt without them (their
    evidence reported dropped), not the raw text the chat engine inlined; where the prompt
    held each of them it says that a document was left out."""
    engine, chat = _tight_context_chat(server, 280, "tight")
    await chat.achat("How is the weather in Paris?")
    (system,) = _answer_calls(server)
    assert "mild in autumn" not in system and "cold in autumn" not in system
    assert system.count(LEFT_OUT_POINTER) == 2 and "[retrieved document: evidence" not in system
    report = await engine.get_report("tight")
    dropped = [d for d in report.prune_decisions if d.action == "dropped"]
    doc = await engine.get_session("tight")
    rag = [e.evidence_id for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert rag and all(any(eid in d.block_id for d in dropped) for eid in rag)
    assert report.token_used <= report.token_budget
    await engine.close()


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_the_documents_the_prompt_holds_come_before_the_evidence_share(
    path: str, server: ScriptedOpenAIServer
) -> None:
    """The documents a chat engine inlined are the prompt's: with room for one of them (but
    not for both within the evidence share of the budget, which held both back before) the
    first goes whole, fenced, the prompt pointing at it, and the prompt says the other was
    left out: no pointer names a block the model does not get."""
    engine, chat = _tight_context_chat(server, 420, "one-fits")
    if path == "sync":
        await asyncio.to_thread(chat.chat, "How is the weather in Paris?")
    else:
        await chat.achat("How is the weather in Paris?")
    (system,) = _answer_calls(server)
    report = await engine.get_report("one-fits")
    decided = {d.block_id: d for d in report.prune_decisions if d.block_id.startswith("ev:")}
    assert [d.action for d in decided.values()] == ["kept", "dropped"]
    assert all("the prompt points to it" in d.reason for d in decided.values())
    kept, dropped = (block_id.removeprefix("ev:") for block_id in decided)
    assert system.count(f'<evidence id=\\"{kept}\\"') == 1
    assert f"[retrieved document: evidence {kept}]" in system
    assert dropped not in system and system.count(LEFT_OUT_POINTER) == 1
    sent, left_out = ("mild", "cold") if "mild in autumn" in system else ("cold", "mild")
    assert system.count(f"{sent} in autumn") == 6 and f"{left_out} in autumn" not in system
    assert report.token_used <= report.token_budget
    await engine.close()


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_the_condense_step_is_recorded_with_its_usage_in_its_own_scope(
    path: str, server: ScriptedOpenAIServer
) -> None:
    """``CondensePlusContextChatEngine`` condenses the follow-up question with
    ``llm.complete`` (no chat span on ``OpenAI``): every call on the wire has its usage
    recorded once, the condense call in a scope of its own, never in the chat's session."""
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o"))
    ce.llamaindex.install(engine, session_id="condense")
    chat = _chat_engine("condense-plus-context", server)
    await _run(chat, path)
    await engine.flush()
    calls = [r for r in server.requests if "messages" in r]
    assert len(calls) == 3  # answer, condense, answer
    usage: dict[str, int] = {}
    for session_id in await engine.list_sessions():
        doc = await engine.get_session(session_id)
        usage[session_id] = len(doc.session.model_usage)
    assert usage["condense"] == 2
    (child,) = [s for s in usage if s != "condense"]
    assert child.startswith("condense/") and usage[child] == 1
    (record,) = (await engine.get_session(child)).session.model_usage
    assert record.prompt_tokens > 0 and record.model == "gpt-4o"
    await engine.close()
