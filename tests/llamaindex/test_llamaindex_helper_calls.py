"""A memory's own model calls, an agent's structured answer and the unrelated steps of a custom
workflow are no turns of one conversation.

A ``Memory`` with a ``FactExtractionMemoryBlock``: when the chat history outgrows its share,
``Memory`` flushes the oldest messages to the block, which asks the LLM for their facts. That
call is the block's own work: it gets exactly what LlamaIndex sends (the flushed messages and
the extraction prompt, never the agent's prompt or the rest of the session) and is recorded in
a child session, never as a turn of the conversation the agent's later calls receive. Driven
over llama-index-llms-openai's ``OpenAI`` on the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import LLM, ChatMessage
from llama_index.core.llms.structured_llm import StructuredLLM
from llama_index.core.memory import (
    ChatMemoryBuffer,
    ChatSummaryMemoryBuffer,
    FactExtractionMemoryBlock,
    Memory,
)
from llama_index.core.prompts import PromptTemplate
from llama_index.core.workflow import Event, StartEvent, StopEvent, Workflow, step
from llama_index.llms.openai import OpenAI
from pydantic import BaseModel

import ce.llamaindex
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Message, Role
from ce.core.testing import (
    ScriptedOpenAIServer,
    ScriptedResponse,
    deterministic_engine,
    no_blocking,
)

llm_dispatcher = get_dispatcher(__name__)
BUTLER = "You are a butler."
FACTS = "<facts><fact>The user likes tea.</fact></facts>"
QUESTIONS = [
    "I like tea, remember that.",
    "What is the weather?",
    "Tell me a joke.",
    "And another?",
    "What do I like?",
]


def _extracting(body: dict[str, Any]) -> bool:
    return "fact extraction" in str(body["messages"][-1].get("content"))


def script(body: dict[str, Any]) -> ScriptedResponse:
    if _extracting(body):
        return ScriptedResponse(text=FACTS)
    asked = sum(m["role"] == "user" for m in body["messages"])
    return ScriptedResponse(text=f"Answer number {asked}. " + "words " * 40)


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    yield engine
    await engine.close()


async def _converse(server: ScriptedOpenAIServer) -> None:
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    memory = Memory.from_defaults(
        session_id="alice",
        token_limit=300,
        token_flush_size=100,
        chat_history_token_ratio=0.5,
        memory_blocks=[FactExtractionMemoryBlock(name="facts", llm=llm, priority=1)],
    )
    agent = FunctionAgent(tools=[], llm=llm, system_prompt=BUTLER)
    for question in QUESTIONS:
        await agent.run(question, memory=memory)


async def test_a_memory_blocks_fact_extraction_is_no_turn_of_the_conversation(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(script) as server:
        await _converse(server)
        native = [r for r in server.requests if _extracting(r)]
    with ScriptedOpenAIServer(script) as server:
        ce.llamaindex.install(engine)
        await _converse(server)
        requests = server.requests
    extractions = [r for r in requests if _extracting(r)]
    assert extractions and len(extractions) == len(native)
    # the block's calls go as LlamaIndex sends them: the flushed messages and the prompt
    # (the answers' texts differ: the scripted model numbers them by the questions it sees)
    for sent, own in zip(extractions, native, strict=True):
        assert [m["role"] for m in sent["messages"]] == [m["role"] for m in own["messages"]]
        assert sent["messages"][-1] == own["messages"][-1]
        assert [m["content"] for m in sent["messages"] if m["role"] == "user"] == [
            m["content"] for m in own["messages"] if m["role"] == "user"
        ]
    answers = [r for r in requests if not _extracting(r)]
    assert len(answers) == len(QUESTIONS)
    for request in answers:
        assert request["messages"][0]["content"].startswith(BUTLER)
        said = [str(m.get("content")) for m in request["messages"][1:]]
        assert not any("fact extraction" in text for text in said)
        assert FACTS not in said
    # the conversation holds the questions and answers only; the block's call has its own
    doc = await engine.get_session("alice")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == QUESTIONS
    assert all(m.content != FACTS for m in doc.session.messages)
    children = [s for s in await engine.list_sessions() if s.startswith("alice/")]
    assert len(children) == len(extractions)


def summarizing_script(body: dict[str, Any]) -> ScriptedResponse:
    if _summarizing(body):
        return ScriptedResponse(text="SUMMARY: the user likes tea.")
    asked = sum(m["role"] == "user" for m in body["messages"])
    return ScriptedResponse(text=f"Answer {asked}. " + "words " * 30)


def _summarizing(body: dict[str, Any]) -> bool:
    """A call of ``ChatSummaryMemoryBuffer``'s summarizer (its own system prompt)."""
    return str(body["messages"][0].get("content")).startswith("The following is a conversation")


def _chat(server: ScriptedOpenAIServer) -> None:
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    memory = ChatSummaryMemoryBuffer.from_defaults(llm=llm, token_limit=120, chat_store_key="bob")
    chat = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=BUTLER)
    for question in QUESTIONS:
        chat.chat(question)


async def test_a_summary_buffers_summarizer_call_is_no_turn_of_the_conversation(
    engine: ContextEngine,
) -> None:
    """``ChatSummaryMemoryBuffer`` summarises the oldest messages with the LLM when the chat
    engine reads it (a sync ``chat``): that call goes as LlamaIndex sends it, in a child
    session, and the chat's later calls never get its prompt or its summary as turns."""
    with ScriptedOpenAIServer(summarizing_script) as server:
        _chat(server)
        native = [r["messages"] for r in server.requests if _summarizing(r)]
    with ScriptedOpenAIServer(summarizing_script) as server:
        ce.llamaindex.install(engine)
        _chat(server)
        requests = server.requests
    summaries = [r["messages"] for r in requests if _summarizing(r)]
    assert summaries and summaries == native
    for request in requests:
        if _summarizing(request):
            continue
        assert request["messages"][0]["content"].startswith(BUTLER)
        turns = [str(m.get("content")) for m in request["messages"][1:]]
        assert not any(t.startswith("SUMMARY") or "Transcript so far" in t for t in turns)
    doc = await engine.get_session("bob")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == QUESTIONS


class City(BaseModel):
    """The agent's structured answer."""

    city: str


def structured_script(body: dict[str, Any]) -> ScriptedResponse:
    if body.get("response_format") or body.get("tools"):
        if body.get("tools"):
            args = json.dumps({"city": "Oslo"})
            return ScriptedResponse(tool_calls=[("call_city", "City", args)])
        return ScriptedResponse(text=json.dumps({"city": "Oslo"}))
    asked = sum(m["role"] == "user" for m in body["messages"])
    return ScriptedResponse(text=f"Answer {asked}: Oslo.")


def _structuring(body: dict[str, Any]) -> bool:
    return "<current_conversation>" in str(body["messages"][-1].get("content"))


async def _guide(server: ScriptedOpenAIServer) -> list[Any]:
    llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
    memory = ChatMemoryBuffer.from_defaults(chat_store_key="carol")
    agent = FunctionAgent(tools=[], llm=llm, system_prompt="You are a guide.", output_cls=City)
    answers = []
    for question in ("Capital of Norway?", "And of Sweden?"):
        answers.append((await agent.run(question, memory=memory)).structured_response)
    return answers


async def test_an_agents_structured_answer_is_no_turn_of_the_conversation(
    engine: ContextEngine,
) -> None:
    """``FunctionAgent(output_cls=...)`` makes one more call after its answer: the whole
    conversation rendered as XML in one user message, through ``llm.as_structured_llm``.
    That call goes as LlamaIndex sends it (not with the session's history before it) and its
    JSON is no answer the agent's next turn receives."""
    with ScriptedOpenAIServer(structured_script) as server:
        native_answers = await _guide(server)
        native = [[(m["role"], m.get("content")) for m in r["messages"]] for r in server.requests]
    with ScriptedOpenAIServer(structured_script) as server:
        ce.llamaindex.install(engine)
        answers = await _guide(server)
        requests = server.requests
    assert answers == native_answers == [{"city": "Oslo"}, {"city": "Oslo"}]
    sent = [[(m["role"], m.get("content")) for m in r["messages"]] for r in requests]
    assert sent == native
    assert sum(_structuring(r) for r in requests) == 2
    doc = await engine.get_session("carol")
    said = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert said == ["Answer 1: Oslo.", "Answer 2: Oslo."]


async def test_an_agents_structured_answer_is_recorded_once(engine: ContextEngine) -> None:
    """The structured answer's model call (``StructuredLLM.achat`` through the LLM's
    ``astructured_predict`` and ``achat``) is one call: recorded once, with the model's usage
    and reply (not also the ``StructuredLLM``'s re-serialised copy of it)."""
    with ScriptedOpenAIServer(structured_script) as server:
        ce.llamaindex.install(engine)
        await _guide(server)
        requests = server.requests
    await engine.flush()
    sessions = await engine.list_sessions()
    usage = [u for s in sessions for u in (await engine.get_session(s)).session.model_usage]
    assert len(usage) == len(requests) == 4
    structured = [s for s in sessions if s.startswith("carol/StructuredLLM.achat-")]
    assert len(structured) == 2
    for session_id in structured:
        doc = await engine.get_session(session_id)
        said = [_written(m) for m in doc.session.messages if m.role is Role.ASSISTANT]
        assert said == [json.dumps({"city": "Oslo"})]  # as the model wrote it
        records = [
            (u.provider, u.prompt_tokens, u.completion_tokens) for u in doc.session.model_usage
        ]
        assert records == [("openai", 10, 5)]


class Invoice(BaseModel):
    """What a structured LLM extracts."""

    number: str
    total: int


INVOICE = {"number": "INV-7", "total": 42}
EXTRACT = "Extract the invoice: INV-7, total 42."
FRIENDLY = "You are a friendly assistant."
HELLO = "Hello, who are you?"


def invoice_script(body: dict[str, Any]) -> ScriptedResponse:
    if body.get("response_format"):
        return ScriptedResponse(text=json.dumps(INVOICE))
    if body.get("tools"):  # llama-index-llms-openai before 0.6 predicts with a function call
        name = body["tools"][0]["function"]["name"]
        return ScriptedResponse(tool_calls=[("call_invoice", name, json.dumps(INVOICE))])
    return ScriptedResponse(text=f"Hi! ({body['messages'][-1]['content']})")


def _written(message: Message) -> str:
    """What the model wrote in a stored reply: its text, or its function call's arguments
    (the structured prediction of an LLM that predicts with a function call)."""
    return message.content or " ".join(c.raw_arguments for c in message.tool_calls or ())


async def _extract_then_greet(server: ScriptedOpenAIServer, method: str) -> tuple[Any, Any]:
    """In session ``u``: ``llm.as_structured_llm(Invoice)``'s ``method``, then a plain chat
    of the same LLM (sync after a sync extraction, async after an async one)."""
    llm = OpenAI(
        model="gpt-4o",
        api_base=server.base_url,
        api_key="sk-test",
        additional_kwargs={"stream_options": {"include_usage": True}},
    )
    asked = [ChatMessage(role="user", content=EXTRACT)]
    greeting = [
        ChatMessage(role="system", content=FRIENDLY),
        ChatMessage(role="user", content=HELLO),
    ]
    with instrument_tags({"ce_session_id": "u"}):
        structured = llm.as_structured_llm(Invoice)
        if method == "chat":
            extracted = structured.chat(asked)
        elif method == "achat":
            extracted = await structured.achat(asked)
        elif method == "stream_chat":
            extracted = list(structured.stream_chat(asked))[-1]
        else:
            extracted = [r async for r in await structured.astream_chat(asked)][-1]
        if method in ("chat", "stream_chat"):
            reply = llm.chat(greeting)
        else:
            reply = await llm.achat(greeting)
    return extracted.message.content, reply.message.content


@pytest.mark.parametrize("method", ["chat", "achat", "stream_chat", "astream_chat"])
async def test_a_structured_llms_call_is_a_component_streamed_or_not(
    engine: ContextEngine, method: str
) -> None:
    """``llm.as_structured_llm(cls)``'s chat in a named session, streamed or not (a stream's
    model call is made when the app reads it, after the ``StructuredLLM``'s span closed): a
    component in its own child scope, sent as LlamaIndex builds it and recorded once with
    the model's reply and usage; the session's next call never receives it."""
    with ScriptedOpenAIServer(invoice_script) as server:
        native_out = await _extract_then_greet(server, method)
        native = [r["messages"] for r in server.requests]
    with ScriptedOpenAIServer(invoice_script) as server:
        ce.llamaindex.install(engine)
        out = await _extract_then_greet(server, method)
        requests = server.requests
    assert out == native_out
    assert [r["messages"] for r in requests] == native
    assert requests[1]["messages"] == [
        {"role": "system", "content": FRIENDLY},
        {"role": "user", "content": HELLO},
    ]
    await engine.flush()
    doc = await engine.get_session("u")
    assert [(m.role, m.content) for m in doc.session.messages] == [
        (Role.SYSTEM, FRIENDLY),
        (Role.USER, HELLO),
        (Role.ASSISTANT, out[1]),
    ]
    assert len(doc.session.model_usage) == 1
    children = [s for s in await engine.list_sessions() if s != "u"]
    assert len(children) == 1 and children[0].startswith(f"u/StructuredLLM.{method}-")
    child = await engine.get_session(children[0])
    assert [(m.role, _written(m)) for m in child.session.messages] == [
        (Role.USER, EXTRACT),
        (Role.ASSISTANT, json.dumps(INVOICE)),  # as the model wrote it
    ]
    records = [
        (u.provider, u.prompt_tokens, u.completion_tokens) for u in child.session.model_usage
    ]
    assert records == [("openai", 10, 5)]


@llm_dispatcher.span
def _predicting(self: OpenAI, *args: Any, **kwargs: Any) -> Any:
    """A streamed structured prediction an LLM class defines itself."""
    return OpenAI.stream_structured_predict(self, *args, **kwargs)


async def test_the_read_seam_comes_off_exactly_and_an_async_stream_never_blocks(
    engine: ContextEngine,
) -> None:
    """``StructuredLLM.stream_chat`` / ``astream_chat`` and the streamed structured
    predictions of every LLM class (``LLM``'s, ``OpenAI``'s own, a class made after install)
    read their stream with the call marked (the read seam, also around the async seam): the
    async stream still awaits the engine at the seam, and ``uninstall()`` puts back the very
    methods each class held (and creates later classes unmarked again)."""
    predicts = ("stream_structured_predict", "astream_structured_predict")
    read = {(StructuredLLM, m) for m in ("stream_chat", "astream_chat")}
    read |= {(cls, m) for cls in (LLM, OpenAI) for m in predicts}
    originals = {(cls, m): vars(cls)[m] for cls, m in read}
    with ScriptedOpenAIServer(invoice_script) as server:
        ce.llamaindex.install(engine)
        assert all(vars(cls)[m] is not o for (cls, m), o in originals.items())
        later = type("LaterLLM", (OpenAI,), {"stream_structured_predict": _predicting})
        assert getattr(vars(later)["stream_structured_predict"], "ce_read_seam", False)
        structured = OpenAI(
            model="gpt-4o", api_base=server.base_url, api_key="sk-test"
        ).as_structured_llm(Invoice)
        asked = [ChatMessage(role="user", content=EXTRACT)]
        with no_blocking(engine) as blocking, instrument_tags({"ce_session_id": "u"}):
            chunks = [r async for r in await structured.astream_chat(asked)]
        ce.llamaindex.uninstall()
        assert all(vars(cls)[m] is o for (cls, m), o in originals.items())
        again = type("AgainLLM", (OpenAI,), {"stream_structured_predict": _predicting})
        assert vars(again)["stream_structured_predict"] is _predicting
        assert list(structured.stream_chat(asked))[-1].message.content == chunks[-1].message.content
        requests = server.requests
    assert blocking.used == []
    assert [r["messages"] for r in requests] == [[{"role": "user", "content": EXTRACT}]] * 2
    (session_id,) = await engine.list_sessions()
    assert session_id.startswith("u/StructuredLLM.astream_chat-")


def predict_script(body: dict[str, Any]) -> ScriptedResponse:
    """The extraction (a tool call when LlamaIndex offers the output class as a tool, else
    JSON text), a greeting for any other request."""
    if body.get("tools"):
        return ScriptedResponse(tool_calls=[("call_inv", "Invoice", json.dumps(INVOICE))])
    if body.get("response_format"):
        return ScriptedResponse(text=json.dumps(INVOICE))
    return ScriptedResponse(text=f"Hi! ({body['messages'][-1]['content']})")


async def _predict_then_greet(server: ScriptedOpenAIServer, method: str) -> tuple[Any, Any]:
    """In session ``u``: the LLM's streamed structured prediction (``method``), read to its
    end, then a plain chat of the same LLM (sync after a sync prediction, async after an
    async one)."""
    llm = OpenAI(
        model="gpt-4o",
        api_base=server.base_url,
        api_key="sk-test",
        additional_kwargs={"stream_options": {"include_usage": True}},
    )
    prompt = PromptTemplate("Extract the invoice: {text}")
    greeting = [
        ChatMessage(role="system", content=FRIENDLY),
        ChatMessage(role="user", content=HELLO),
    ]
    with instrument_tags({"ce_session_id": "u"}):
        if method == "stream_structured_predict":
            predicted = list(llm.stream_structured_predict(Invoice, prompt, text="INV-7"))[-1]
            reply = llm.chat(greeting)
        else:
            stream = await llm.astream_structured_predict(Invoice, prompt, text="INV-7")
            predicted = [p async for p in stream][-1]
            reply = await llm.achat(greeting)
    return predicted, reply.message.content


@pytest.mark.parametrize("method", ["stream_structured_predict", "astream_structured_predict"])
async def test_a_streamed_structured_prediction_is_a_component(
    engine: ContextEngine, method: str
) -> None:
    """``llm.stream_structured_predict`` / ``astream_structured_predict`` in a named session
    make their model call when the app reads the stream, after their span closed: that call
    is still the prediction's, a component in its own child scope, sent as LlamaIndex builds
    it and recorded once; the session's next call never receives the extraction."""
    with ScriptedOpenAIServer(predict_script) as server:
        native_out = await _predict_then_greet(server, method)
        native = [r["messages"] for r in server.requests]
    with ScriptedOpenAIServer(predict_script) as server:
        ce.llamaindex.install(engine)
        out = await _predict_then_greet(server, method)
        requests = server.requests
    assert out == native_out
    assert [r["messages"] for r in requests] == native
    assert requests[1]["messages"] == [
        {"role": "system", "content": FRIENDLY},
        {"role": "user", "content": HELLO},
    ]
    await engine.flush()
    doc = await engine.get_session("u")
    assert [(m.role, m.content) for m in doc.session.messages] == [
        (Role.SYSTEM, FRIENDLY),
        (Role.USER, HELLO),
        (Role.ASSISTANT, out[1]),
    ]
    assert len(doc.session.model_usage) == 1
    children = [s for s in await engine.list_sessions() if s != "u"]
    assert len(children) == 1 and children[0].startswith(f"u/OpenAI.{method}-")
    child = await engine.get_session(children[0])
    assert [m.role for m in child.session.messages] == [Role.USER, Role.ASSISTANT]
    assert len(child.session.model_usage) == 1


class Drafted(Event):
    draft: str


class Reflect(Workflow):
    """A custom workflow: one step prompts for a draft, the next for its critique."""

    def __init__(self, llm: OpenAI, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.llm = llm

    @step
    async def write(self, ev: StartEvent) -> Drafted:
        prompt = ChatMessage(role="user", content=f"Write a haiku about {ev.topic}.")
        return Drafted(draft=str((await self.llm.achat([prompt])).message.content))

    @step
    async def critique(self, ev: Drafted) -> StopEvent:
        messages = [
            ChatMessage(role="system", content="You are a strict critic."),
            ChatMessage(role="user", content=f"Critique: {ev.draft}"),
        ]
        return StopEvent(result=(await self.llm.achat(messages)).message.content)


def haiku_script(body: dict[str, Any]) -> ScriptedResponse:
    last = str(body["messages"][-1]["content"])
    return ScriptedResponse(text=f"A haiku. ({last[:20]})" if last.startswith("Write") else "Meh.")


async def test_the_steps_of_a_custom_workflow_each_get_their_own_messages(
    engine: ContextEngine,
) -> None:
    """Two runs of a workflow whose steps prompt from scratch, with no session named: each
    call goes as the workflow builds it (the critique without the draft's exchange before
    it), recorded in the run's session and a child of it."""

    async def run(install: bool) -> list[Any]:
        with ScriptedOpenAIServer(haiku_script) as server:
            if install:
                ce.llamaindex.install(engine)
            llm = OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")
            for topic in ("cats", "dogs"):
                await Reflect(llm, timeout=30).run(topic=topic)
            if install:
                ce.llamaindex.uninstall()
            return [r["messages"] for r in server.requests]

    native = await run(False)
    assert await run(True) == native
    runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
    assert len(runs) == 4 and sum("/" in s for s in runs) == 2
