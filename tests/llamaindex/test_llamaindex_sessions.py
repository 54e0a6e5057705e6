"""Which conversation a model call belongs to (issue 10), on real LlamaIndex apps: the request
bodies llama-index-llms-openai's ``OpenAI`` sends to the scripted OpenAI server, and what each
session holds.

- a nested call (a query engine or a sub-agent inside an agent's tool, a chat engine's condense
  step) receives only its own messages, redacted, and is recorded in the child scope
  ``<outer session>/<tool call id>[/<component span id>]``; the outer session never sees it;
- users named by their memory (chat-store key, a ``Memory``'s own id, a
  ``ContextEngineMemory``) or by ``instrument_tags`` never see each other's messages, 20 of
  them concurrently included;
- calls with no identity at all are scoped to their own run (``run:<root span id>``);
- a reused tool-call id does not switch the engine off; a broken store still sends the app's
  messages redacted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.llms.openai")

from llama_index.core import Document, PromptTemplate, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.chat_engine import CondensePlusContextChatEngine, SimpleChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import (
    ChatMessage,
    CompletionResponse,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.memory import (
    ChatMemoryBuffer,
    Memory,
    SimpleComposableMemory,
    VectorMemory,
)
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.storage.chat_store import SimpleChatStore
from llama_index.core.tools import FunctionTool, QueryEngineTool
from llama_index.llms.openai import OpenAI
from llamaindex_fakes import ChatCompletingLLM, ScriptedLLM

import ce.llamaindex
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.llamaindex import ContextEngineMemory

OUTER_SYS = "OUTER-SYS: you plan and call tools."
EXPERT_SYS = "EXPERT-SYS: you are the expert."
OUTER_QUESTION = "Outer question: what do the docs say about Paris?"
REDACTED = "[REDACTED:email]"


def _text(request: dict[str, Any]) -> str:
    return json.dumps(request)


def _system(request: dict[str, Any]) -> str:
    first = request["messages"][0]
    return str(first["content"]) if first["role"] == "system" else ""


def _openai(server: ScriptedOpenAIServer) -> OpenAI:
    return OpenAI(model="gpt-4o", api_base=server.base_url, api_key="sk-test")


@pytest.fixture
def server_box() -> Iterator[dict[str, Any]]:
    box: dict[str, Any] = {}
    yield box
    server = box.get("server")
    if server is not None:
        server.close()


async def _sessions(engine: ContextEngine) -> list[str]:
    return list(await engine.list_sessions())  # after the deferred records


async def _contents(engine: ContextEngine, session_id: str, role: Role) -> list[str]:
    doc = await engine.get_session(session_id)
    return [m.content for m in doc.session.messages if m.role is role]


async def _drive(agent: FunctionAgent, question: str, **kwargs: Any) -> str:
    handler = agent.run(user_msg=question, **kwargs)
    async for _ in handler.stream_events():
        pass
    return str((await handler).response.content)


# -- nested calls: a query engine and a sub-agent inside an agent's tool -------------------


def _docs_index() -> VectorStoreIndex:
    documents = [
        Document(text="Paris is mild in autumn.", metadata={"source": "kb://paris"}, doc_id="p"),
        Document(text="Oslo is cold in autumn.", metadata={"source": "kb://oslo"}, doc_id="o"),
    ]
    return VectorStoreIndex.from_documents(documents, embed_model=MockEmbedding(embed_dim=8))


def _nested_script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    system = _system(body)
    if "OUTER-SYS" in system:
        if messages[-1]["role"] == "tool":
            return ScriptedResponse(text="Final: the docs say Paris is mild.")
        if any(t["function"]["name"] == "ask_expert" for t in body.get("tools", [])):
            arguments = {"question": "What is the answer? Ask carol@example.com."}
            return ScriptedResponse(tool_calls=[("call_x", "ask_expert", json.dumps(arguments))])
        arguments = {"input": "Paris in autumn, for nested.canary@example.com"}
        return ScriptedResponse(tool_calls=[("call_q", "search_docs", json.dumps(arguments))])
    if "EXPERT-SYS" in system:
        if messages[-1]["role"] == "tool":
            return ScriptedResponse(text="Expert: the answer is 42.")
        return ScriptedResponse(tool_calls=[("call_0", "lookup", json.dumps({"q": "answer"}))])
    return ScriptedResponse(text="Paris is mild in autumn.")  # the query engine's synthesis


async def _assert_outer_untouched(
    engine: ContextEngine, requests: list[dict[str, Any]], outer: str, call_id: str
) -> list[dict[str, Any]]:
    """The outer agent's requests and session hold only its own conversation; returns the
    nested requests."""
    outer_requests = [r for r in requests if "OUTER-SYS" in _system(r)]
    nested = [r for r in requests if r not in outer_requests]
    assert len(outer_requests) == 2 and nested
    for request in nested:  # only its own messages: no outer question, no outer prompt
        assert "OUTER-SYS" not in _text(request) and OUTER_QUESTION not in _text(request)
        assert "@example.com" not in _text(request) and REDACTED in _text(request)
    last = outer_requests[1]["messages"]
    assert sum(m["role"] == "system" for m in last) == 1 and "EXPERT-SYS" not in _text(
        outer_requests[1]
    )
    assert last[-1]["role"] == "tool" and last[-1]["tool_call_id"] == call_id
    assert last[-2]["tool_calls"][0]["id"] == call_id
    assert await _contents(engine, outer, Role.USER) == [OUTER_QUESTION]
    replies = await _contents(engine, outer, Role.ASSISTANT)
    assert replies[-1] == "Final: the docs say Paris is mild."
    assert not any("42" in r or "mild in autumn" in r for r in replies)
    doc = await engine.get_session(outer)
    assert [t.tool_call_id for t in doc.session.tool_state.tool_calls] == [call_id]
    assert len(doc.session.model_usage) == 2  # the outer agent's own calls only
    assert "EXPERT-SYS" not in str(doc.session.messages) and "Context information" not in str(
        doc.session.messages
    )
    return nested


async def test_a_query_engine_inside_an_agent_tool_is_a_child_scope(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_nested_script).start()
    llm = _openai(server)
    query_engine = _docs_index().as_query_engine(llm=llm, similarity_top_k=2)
    tool = QueryEngineTool.from_defaults(
        query_engine, name="search_docs", description="Search the docs."
    )
    agent = FunctionAgent(tools=[tool], llm=llm, system_prompt=OUTER_SYS)
    ce.llamaindex.install(engine)
    with instrument_tags({"ce_session_id": "outer-q"}):
        assert "Paris is mild" in await _drive(agent, OUTER_QUESTION)

    nested = await _assert_outer_untouched(engine, server.requests, "outer-q", "call_q")
    (synthesis,) = nested
    assert "Paris is mild in autumn." in _text(synthesis)  # the retrieved context
    (child,) = [s for s in await _sessions(engine) if s.startswith("outer-q/")]
    assert child.startswith("outer-q/call_q/")  # the tool call, then the synthesizer's call
    assert await _contents(engine, child, Role.ASSISTANT) == ["Paris is mild in autumn."]
    (prompt,) = await _contents(engine, child, Role.USER)
    assert "nested.canary" not in prompt and REDACTED in prompt
    assert len(await engine.list_turns(child)) == 1  # injected: budgeted and redacted
    # the retrieval is the outer tool call's evidence
    doc = await engine.get_session("outer-q")
    assert any(e.links and e.links.tool_call_id == "call_q" for e in doc.evidences.values())


async def test_a_sub_agent_as_a_tool_is_a_child_scope(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_nested_script).start()
    llm = _openai(server)

    def lookup(q: str) -> str:
        """Look something up."""
        return f"lookup says 42 for {q}"

    expert = FunctionAgent(
        tools=[FunctionTool.from_defaults(lookup)], llm=llm, system_prompt=EXPERT_SYS
    )

    async def ask_expert(question: str) -> str:
        """Ask the expert agent."""
        return str((await expert.run(user_msg=question)).response.content)

    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(ask_expert)], llm=llm, system_prompt=OUTER_SYS
    )
    ce.llamaindex.install(engine)
    with instrument_tags({"ce_session_id": "outer-a"}):
        assert "Paris is mild" in await _drive(agent, OUTER_QUESTION)

    nested = await _assert_outer_untouched(engine, server.requests, "outer-a", "call_x")
    assert len(nested) == 2  # the expert's tool-call step and its answer
    first, second = (r["messages"] for r in nested)
    assert first[0]["role"] == "system" and first[0]["content"].startswith("EXPERT-SYS")
    assert [m["role"] for m in first[1:]] == ["user"]
    assert [m["role"] for m in second[1:]] == ["user", "assistant", "tool"]
    assert second[-1]["tool_call_id"] == "call_0"
    assert await _sessions(engine) == ["outer-a", "outer-a/call_x"]
    child = await engine.get_session("outer-a/call_x")
    assert [t.tool_call_id for t in child.session.tool_state.tool_calls] == ["call_0"]
    assert (await _contents(engine, "outer-a/call_x", Role.ASSISTANT))[-1] == (
        "Expert: the answer is 42."
    )
    assert len(child.session.model_usage) == 2
    assert len(await engine.list_turns("outer-a/call_x")) == 2


async def test_a_nested_call_naming_its_own_session_goes_there(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_nested_script).start()
    llm = _openai(server)

    def lookup(q: str) -> str:
        """Look something up."""
        return f"lookup says 42 for {q}"

    expert = FunctionAgent(
        tools=[FunctionTool.from_defaults(lookup)], llm=llm, system_prompt=EXPERT_SYS
    )

    async def ask_expert(question: str) -> str:
        """Ask the expert agent."""
        with instrument_tags({"ce_session_id": "expert-log"}):
            return str((await expert.run(user_msg=question)).response.content)

    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(ask_expert)], llm=llm, system_prompt=OUTER_SYS
    )
    ce.llamaindex.install(engine)
    with instrument_tags({"ce_session_id": "outer-n"}):
        await _drive(agent, OUTER_QUESTION)
    assert sorted(await _sessions(engine)) == ["expert-log", "outer-n"]
    assert len(await engine.list_turns("expert-log")) == 2
    assert "OUTER-SYS" not in str((await engine.get_session("expert-log")).session.messages)


# -- prompt calls without an open parent: a streamed synthesis, an app's own predict --------

CHAT_TURN = "PRIVATECHATTURN: hello, I am the user."
DOC_TEXTS = ("Paris is mild in autumn.", "Oslo is cold in autumn.")


def _chat_or_synthesis(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text="chat reply" if CHAT_TURN in _text(body) else "partial answer")


def _private_chat() -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content="CHAT-SYS"),
        ChatMessage(role="user", content=CHAT_TURN),
    ]


async def _assert_only_the_chat_in(engine: ContextEngine, session_id: str) -> None:
    assert await _contents(engine, session_id, Role.USER) == [CHAT_TURN]
    assert await _contents(engine, session_id, Role.ASSISTANT) == ["chat reply"]
    assert len((await engine.get_session(session_id)).session.model_usage) == 1


@pytest.mark.parametrize("path", ["sync", "async"])
@pytest.mark.parametrize("mode", ["refine", "compact"])
async def test_a_streaming_query_engines_synthesis_stays_out_of_the_chat(
    mode: str, path: str, engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """A streaming query engine's last synthesizer call (``llm.stream`` / ``astream``) is
    made when the app reads the response, after the query returned, with no open span
    above it; in a session that already holds a chat it is still a component: every
    synthesizer request holds its own prompt only (none of the chat, each retrieved text
    once: no evidence block repeating the text the prompt quotes), each is recorded in a
    child scope of the session, and the chat session gains no synthesizer turn."""
    server = server_box["server"] = ScriptedOpenAIServer(_chat_or_synthesis).start()
    llm = _openai(server)
    query_engine = _docs_index().as_query_engine(
        llm=llm, streaming=True, response_mode=mode, similarity_top_k=2
    )
    ce.llamaindex.install(engine)

    def run_sync() -> str:
        with instrument_tags({"ce_session_id": "chat-q"}):
            llm.chat(_private_chat())
            return "".join(query_engine.query("What about Paris?").response_gen)

    async def run_async() -> str:
        with instrument_tags({"ce_session_id": "chat-q"}):
            await llm.achat(_private_chat())
            response = await query_engine.aquery("What about Paris?")
            return "".join([t async for t in response.async_response_gen()])

    answer = await asyncio.to_thread(run_sync) if path == "sync" else await run_async()
    assert answer == "partial answer"
    chat, *synthesis = server.requests
    assert CHAT_TURN in _text(chat) and synthesis
    assert len(synthesis) == (2 if mode == "refine" else 1)  # refine: one call per node
    for request in synthesis:
        assert CHAT_TURN not in _text(request) and "CHAT-SYS" not in _text(request)
        assert all(_text(request).count(doc) <= 1 for doc in DOC_TEXTS)
        assert "<evidence" not in _text(request)
    assert all(any(doc in _text(r) for r in synthesis) for doc in DOC_TEXTS)
    await _assert_only_the_chat_in(engine, "chat-q")
    children = [s for s in await _sessions(engine) if s != "chat-q"]
    assert len(children) == len(synthesis)
    assert all(s.startswith("chat-q/OpenAI.") and s.count("/") == 1 for s in children)


async def test_a_top_level_prompt_call_is_a_child_scope_of_its_session(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """An app's own ``llm.predict`` / ``apredict`` under a named session goes to
    ``<session>/<its span id>``: it receives its prompt only, and the session keeps its chat."""
    server = server_box["server"] = ScriptedOpenAIServer(_chat_or_synthesis).start()
    llm = _openai(server)
    ce.llamaindex.install(engine)
    prompt = PromptTemplate("Classify this text: {text}")

    def run_sync() -> str:
        with instrument_tags({"ce_session_id": "chat-p"}):
            llm.chat(_private_chat())
            return llm.predict(prompt, text="SYNCTEXT")

    assert await asyncio.to_thread(run_sync) == "partial answer"
    with instrument_tags({"ce_session_id": "chat-p"}):
        assert await llm.apredict(prompt, text="ASYNCTEXT") == "partial answer"
    _, *predicts = server.requests
    assert [r["messages"] for r in predicts] == [
        [{"role": "user", "content": f"Classify this text: {word}"}]
        for word in ("SYNCTEXT", "ASYNCTEXT")
    ]
    await _assert_only_the_chat_in(engine, "chat-p")
    children = sorted(s for s in await _sessions(engine) if s != "chat-p")
    spans = [s.removeprefix("chat-p/").split("-", 1)[0] for s in children]
    assert spans == ["OpenAI.apredict", "OpenAI.predict"]  # the prompt calls' span ids
    for child in children:
        (user,) = await _contents(engine, child, Role.USER)
        assert user.startswith("Classify this text: ")


# -- a chat engine's condense step ---------------------------------------------------------


def _cpc_script(messages: list[dict[str, Any]]) -> tuple[str, list[Any]]:
    last = str(messages[-1]["content"])
    if "Standalone question" in last:
        return "standalone: what about Oslo?", []
    return f"answer {sum(m['role'] == 'user' for m in messages)}", []


def _cpc_response(body: dict[str, Any]) -> ScriptedResponse:
    text, _ = _cpc_script(body["messages"])
    return ScriptedResponse(text=text)


@pytest.mark.parametrize("provider", ["chat-completing", "openai"])
async def test_condense_plus_context_condense_call_stays_out_of_the_chat(
    provider: str, engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """``CondensePlusContextChatEngine`` condenses with ``llm.complete``: a provider that
    serves it through its own ``chat`` (Anthropic-style) opens a chat span inside the
    completion span, which is a nested scope; llama-index-llms-openai's ``OpenAI`` serves it
    without a chat span (the completion seam redacts its prompt; nothing records it). Either
    way the condense prompt reaches the model redacted, the chat session holds the
    conversation only, and the answer call carries it, streamed too (sync and async: the
    stream is read after the chat engine's span closed)."""
    llm: Any
    if provider == "openai":
        server = server_box["server"] = ScriptedOpenAIServer(_cpc_response).start()
        llm = _openai(server)
    else:
        llm = ChatCompletingLLM(script=_cpc_script, seen=[])
    memory = ChatMemoryBuffer.from_defaults(chat_store_key="alice")
    chat = CondensePlusContextChatEngine.from_defaults(
        retriever=_docs_index().as_retriever(similarity_top_k=1),
        llm=llm,
        memory=memory,
        system_prompt="CHAT-SYS",
    )
    ce.llamaindex.install(engine)

    def converse() -> list[str]:  # the second answer streamed
        first = str(chat.chat("What about Paris?"))
        return [first, "".join(chat.stream_chat("And for erin@example.com?").response_gen)]

    async def aconverse() -> list[str]:
        first = str(await chat.achat("What about Paris?"))
        streamed = await chat.astream_chat("And for erin@example.com?")
        return [first, "".join([t async for t in streamed.async_response_gen()])]

    if provider == "openai":
        assert await aconverse() == ["answer 1", "answer 2"]
    else:
        assert await asyncio.to_thread(converse) == ["answer 1", "answer 2"]
    assert await _contents(engine, "alice", Role.USER) == [
        "What about Paris?",
        f"And for {REDACTED}?",
    ]
    assert await _contents(engine, "alice", Role.ASSISTANT) == ["answer 1", "answer 2"]
    assert len(await engine.list_turns("alice")) == 2
    if provider == "openai":
        requests = server.requests
        condense = [r for r in requests if "Standalone question" in _text(r)]
        answers = [r for r in requests if r not in condense]
    else:
        condense = [{"messages": _dicts(m)} for m in llm.seen if _is_condense(m)]
        answers = [{"messages": _dicts(m)} for m in llm.seen if not _is_condense(m)]
        (child,) = [s for s in await _sessions(engine) if s.startswith("alice/")]
        assert "complete" in child  # the completion span's id
        (prompt,) = await _contents(engine, child, Role.USER)
        assert "Standalone question" in prompt and "erin@" not in prompt
    assert "erin@" not in _text(condense[0]) and REDACTED in _text(condense[0])
    assert len(condense) == 1 and len(answers) == 2
    second = answers[1]["messages"]  # the answer call carries the conversation
    assert [m["content"] for m in second if m["role"] != "system"] == [
        "What about Paris?",
        "answer 1",
        f"And for {REDACTED}?",
    ]
    assert "Standalone question" not in _text(answers[1])


COMPLETION_CANARY = "grace.canary@example.com"
COMPLETION_METHODS = ("complete", "acomplete", "stream_complete", "astream_complete")


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_completions_reach_openai_redacted_under_the_global_install(
    path: str, engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """``CondensePlusContextChatEngine`` on llama-index-llms-openai's ``OpenAI`` with the
    global ``install()`` only: the condense prompt quotes the whole conversation (an e-mail
    address included) and ``OpenAI`` serves the completion without a chat span; the
    completion seam passes it through the configured redactor. So does every completion the
    app makes itself (``complete`` / ``acomplete``, streamed too): no request body holds the
    address."""
    server = server_box["server"] = ScriptedOpenAIServer(_cpc_response).start()
    llm = _openai(server)
    chat = CondensePlusContextChatEngine.from_defaults(
        retriever=_docs_index().as_retriever(similarity_top_k=1),
        llm=llm,
        memory=ChatMemoryBuffer.from_defaults(chat_store_key="grace"),
        system_prompt="CHAT-SYS",
    )
    ce.llamaindex.install(engine)
    first = f"Hello, I am {COMPLETION_CANARY}. What about Paris?"
    prompt = f"Standalone question: what about Oslo for {COMPLETION_CANARY}?"

    def run_sync() -> list[str]:
        answers = [str(chat.chat(first)), str(chat.chat("And Oslo?"))]
        answers.append(llm.complete(prompt).text)
        answers.append("".join(r.delta or "" for r in llm.stream_complete(prompt)))
        return answers

    async def run_async() -> list[str]:
        answers = [str(await chat.achat(first)), str(await chat.achat("And Oslo?"))]
        answers.append((await llm.acomplete(prompt)).text)
        answers.append("".join([r.delta or "" async for r in await llm.astream_complete(prompt)]))
        return answers

    answers = await asyncio.to_thread(run_sync) if path == "sync" else await run_async()
    assert answers == ["answer 1", "answer 2"] + ["standalone: what about Oslo?"] * 2
    requests = server.requests
    assert len(requests) == 5 and all(COMPLETION_CANARY not in _text(r) for r in requests)
    condense = [r for r in requests if "Standalone question" in _text(r)]
    assert len(condense) == 3  # the chat engine's condense step, complete, stream_complete
    assert all(REDACTED in _text(r) for r in condense)
    assert "Hello, I am" in _text(condense[0])  # the condense prompt quotes the conversation
    assert condense[2]["stream"] is True
    assert await _contents(engine, "grace", Role.USER) == [
        f"Hello, I am {REDACTED}. What about Paris?",
        "And Oslo?",
    ]


async def test_the_completion_seams_come_off_exactly_and_cover_classes_made_later(
    engine: ContextEngine,
) -> None:
    """Every LLM class's own completion methods are replaced at install (a class defined
    later too) and put back as the very objects on uninstall; a completion of ``wrap()``'s
    LLM is handled by the wrapper (the wrapped LLM's seam leaves its prompt alone)."""
    originals = {m: vars(OpenAI)[m] for m in COMPLETION_METHODS}
    fake = {m: vars(ChatCompletingLLM)[m] for m in ("complete", "acomplete")}
    plugin = ce.llamaindex.install(engine, session_id="s-complete")
    assert all(vars(OpenAI)[m] is not o for m, o in originals.items())
    assert all(vars(ChatCompletingLLM)[m] is not o for m, o in fake.items())

    class Later(ScriptedLLM):  # echoes the prompt it received
        pass

    llm = Later(script=lambda messages: ("ok", []), seen=[])
    assert all(getattr(vars(ScriptedLLM)[m], "ce_prompt_seam", False) for m in COMPLETION_METHODS)
    later = llm.complete(f"for {COMPLETION_CANARY}").text
    assert later == f"for {REDACTED}"
    assert (await llm.acomplete(f"a {COMPLETION_CANARY}")).text == f"a {REDACTED}"
    streamed = [r.delta async for r in await llm.astream_complete(prompt=COMPLETION_CANARY)]
    assert streamed == [REDACTED]
    assert [r.delta for r in llm.stream_complete(COMPLETION_CANARY)] == [REDACTED]

    wrapped = ce.llamaindex.wrap(llm)
    assert (await wrapped.acomplete(f"w {COMPLETION_CANARY}")).text == f"w {REDACTED}"
    plugin.uninstall()
    assert all(vars(OpenAI)[m] is o for m, o in originals.items())
    assert all(vars(ChatCompletingLLM)[m] is o for m, o in fake.items())
    assert not any(
        getattr(vars(ScriptedLLM)[m], "ce_prompt_seam", False) for m in COMPLETION_METHODS
    )
    assert llm.complete(COMPLETION_CANARY).text == COMPLETION_CANARY


class _EchoCompletions(CustomLLM):
    """A completion-only LLM echoing its prompt; ``CustomLLM``'s ``acomplete`` /
    ``astream_complete`` call its ``complete`` / ``stream_complete`` (nested completions)."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="echo")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=prompt)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        yield CompletionResponse(text=prompt, delta=prompt)


async def test_a_completion_is_redacted_once_and_fails_open_on_a_broken_redactor(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt goes through the redactor once (a nested completion, ``CustomLLM``'s
    ``acomplete`` calling ``complete``, keeps it as it got it); a redactor
    that raises lets the prompt through as it was (reported as ``redaction_failed``) or, with
    ``fail_closed``, raises into the call (the model is not called)."""
    from ce.llamaindex import _handlers

    redacted: list[str] = []
    redact = _handlers.redacted_prompt

    def counting(plugin: Any, prompt: str) -> str:
        redacted.append(prompt)
        return redact(plugin, prompt)

    monkeypatch.setattr(_handlers, "redacted_prompt", counting)
    llm = _EchoCompletions()
    plugin = ce.llamaindex.install(engine, session_id="s-once")
    assert (await llm.acomplete(f"a {COMPLETION_CANARY}")).text == f"a {REDACTED}"
    streamed = [r.delta async for r in await llm.astream_complete(f"s {COMPLETION_CANARY}")]
    assert streamed == [f"s {REDACTED}"]
    # the app's prompt once per call (a stream read after its span closed may see the
    # redacted prompt again: no longer nested, and redacting it changes nothing)
    assert redacted[0] == f"a {COMPLETION_CANARY}" and redacted[1] == f"s {COMPLETION_CANARY}"
    assert [p for p in redacted if COMPLETION_CANARY in p] == redacted[:2]
    seen = len(redacted)  # wrap()'s completions go through the engine: no second redaction
    wrapped = ce.llamaindex.wrap(llm)
    assert (await wrapped.acomplete(f"w {COMPLETION_CANARY}")).text == f"w {REDACTED}"
    assert wrapped.complete(f"v {COMPLETION_CANARY}").text == f"v {REDACTED}"
    assert len(redacted) == seen

    def broken(plugin: Any, prompt: str) -> str:
        raise RuntimeError("redactor down")

    monkeypatch.setattr(_handlers, "redacted_prompt", broken)
    failed = plugin.failures["redaction_failed"]
    assert llm.complete(COMPLETION_CANARY).text == COMPLETION_CANARY
    assert (await llm.acomplete(COMPLETION_CANARY)).text == COMPLETION_CANARY
    assert plugin.failures["redaction_failed"] == failed + 2
    plugin.uninstall()
    ce.llamaindex.install(engine, session_id="s-once", fail_closed=True)
    with pytest.raises(RuntimeError, match="redactor down"):
        llm.complete(COMPLETION_CANARY)
    with pytest.raises(RuntimeError, match="redactor down"):
        await llm.acomplete(COMPLETION_CANARY)


async def test_a_nested_completion_is_recorded_once(engine: ContextEngine) -> None:
    """``CustomLLM``'s ``acomplete`` calls its ``complete``, and each emits its completion's
    events: one model call is one usage record and one output, in the completion's scope (a
    component of the session)."""
    llm = _EchoCompletions()
    ce.llamaindex.install(engine, session_id="s-nested")
    assert (await llm.acomplete("first")).text == "first"
    assert llm.complete("second").text == "second"
    await engine.flush()
    recorded = []
    for session_id in await engine.list_sessions():
        doc = await engine.get_session(session_id)
        assert doc is not None and session_id.startswith("s-nested/")
        outputs = [e.content for e in doc.evidences.values() if e.type.value == "llm_output"]
        recorded.append((len(doc.session.model_usage), outputs))
    assert sorted(recorded) == [(1, ["first"]), (1, ["second"])]


def _is_condense(messages: list[ChatMessage]) -> bool:
    return "Standalone question" in str(messages[-1].content)


def _dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [{"role": m.role.value, "content": str(m.content)} for m in messages]


# -- users named by their memory; no identity at all ---------------------------------------


def _echo(body: dict[str, Any]) -> ScriptedResponse:
    users = [m for m in body["messages"] if m["role"] == "user"]
    return ScriptedResponse(text=f"noted: {users[-1]['content']}")


def _canaries(request: dict[str, Any], words: list[str]) -> set[str]:
    text = _text(request)
    return {w for w in words if w in text}


@pytest.mark.parametrize("memory_kind", ["chat_store_key", "memory_own_id", "ce_memory"])
async def test_two_chat_engines_with_their_own_memories_never_mix(
    memory_kind: str, engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """Alice and Bob each chat through their own memory: keys ``"alice"`` / ``"bob"`` on one
    chat store, two ``Memory`` objects without a session id (each has its own random id), or
    two ``ContextEngineMemory`` without a session id (each generates its own)."""
    server = server_box["server"] = ScriptedOpenAIServer(_echo).start()
    llm = _openai(server)
    store = SimpleChatStore()

    def memory(user: str) -> Any:
        if memory_kind == "chat_store_key":
            return ChatMemoryBuffer.from_defaults(chat_store=store, chat_store_key=user)
        if memory_kind == "memory_own_id":
            return Memory.from_defaults()
        return ContextEngineMemory.from_defaults(engine)

    ce.llamaindex.install(engine)
    chats = {
        user: SimpleChatEngine.from_defaults(llm=llm, memory=memory(user), system_prompt="SYS")
        for user in ("alice", "bob")
    }
    words = {"alice": "PLUMCANARY", "bob": "KIWICANARY"}
    for turn in range(2):
        for user, chat in chats.items():
            await chat.achat(f"{user} turn {turn}: my word is {words[user]}")
    requests = server.requests
    assert len(requests) == 4
    for index, request in enumerate(requests):
        user = ("alice", "bob")[index % 2]
        assert _canaries(request, list(words.values())) == {words[user]}, index
    # the second turn carries the user's own first turn, from the engine's session
    assert "alice turn 0" in _text(requests[2]) and "bob turn 0" in _text(requests[3])
    sessions = await _sessions(engine)
    assert len(sessions) == 2 and not any(s.startswith("run:") for s in sessions)


def _composable_chats(llm: OpenAI, store: SimpleChatStore) -> dict[str, SimpleChatEngine]:
    """Per user, a chat engine on ``SimpleComposableMemory`` whose primary memory is a buffer
    keyed by the user (LlamaIndex's documented composition: a ``VectorMemory`` as secondary)."""
    chats = {}
    for user in ("ann", "bob"):
        memory = SimpleComposableMemory.from_defaults(
            primary_memory=ChatMemoryBuffer.from_defaults(chat_store=store, chat_store_key=user),
            secondary_memory_sources=[
                VectorMemory.from_defaults(
                    vector_store=None, embed_model=MockEmbedding(embed_dim=8)
                )
            ],
        )
        chats[user] = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt="SYS")
    return chats


async def test_a_composable_memory_names_the_conversation_its_primary_memory_names(
    engine: ContextEngine,
) -> None:
    """Each user's ``SimpleComposableMemory`` wraps a ``ChatMemoryBuffer`` keyed by the user,
    under ``install(session_id="app")``: each user's conversation is the session the primary
    buffer names (as a bare keyed buffer's is), so Bob's requests are what LlamaIndex sends
    him, never Ann's turns; a reset of Ann's memory starts Ann's conversation over only."""

    def converse(server: ScriptedOpenAIServer) -> list[list[dict[str, Any]]]:
        chats = _composable_chats(_openai(server), SimpleChatStore())
        for user, chat in chats.items():
            chat.chat(f"I am {user}, my secret is {user}-1234")
            chat.chat("what is my secret?")
        chats["ann"].reset()
        for chat in chats.values():
            chat.chat("and now?")
        return [r["messages"] for r in server.requests]

    with ScriptedOpenAIServer(_echo) as server:
        native = converse(server)
    with ScriptedOpenAIServer(_echo) as server:
        ce.llamaindex.install(engine, session_id="app")
        requests = converse(server)
    assert requests == native
    assert "ann-1234" not in json.dumps(requests[2:4] + requests[5:])
    assert [m["content"] for m in requests[4]] == ["SYS", "and now?"]
    assert sorted(await _sessions(engine)) == ["ann", "bob"]
    assert await _contents(engine, "bob", Role.USER) == [
        "I am bob, my secret is bob-1234",
        "what is my secret?",
        "and now?",
    ]


async def test_calls_without_any_identity_are_scoped_to_their_own_run(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_nested_script).start()
    llm = _openai(server)
    ce.llamaindex.install(engine)

    def lookup(q: str) -> str:
        """Look something up."""
        return f"lookup says 42 for {q}"

    for word in ("FIRSTRUN", "SECONDRUN"):  # the same agent object, two runs
        expert = FunctionAgent(
            tools=[FunctionTool.from_defaults(lookup)], llm=llm, system_prompt=EXPERT_SYS
        )
        await expert.run(user_msg=f"what is the answer? {word}")
    for word in ("FIRSTCHAT", "SECONDCHAT"):
        await llm.achat([ChatMessage(role="user", content=f"just chatting {word}")])
    requests = server.requests
    assert len(requests) == 6  # two per agent run, one per chat
    words = ["FIRSTRUN", "SECONDRUN", "FIRSTCHAT", "SECONDCHAT"]
    owners = ["FIRSTRUN", "FIRSTRUN", "SECONDRUN", "SECONDRUN", "FIRSTCHAT", "SECONDCHAT"]
    for request, owner in zip(requests, owners, strict=True):
        assert _canaries(request, words) == {owner}
    assert [m["role"] for m in requests[2]["messages"]] == ["system", "user"]
    assert [m["role"] for m in requests[5]["messages"]] == ["user"]
    sessions = await _sessions(engine)
    assert len(sessions) == 4 and all(s.startswith("run:") for s in sessions)
    assert sum(s.startswith("run:FunctionAgent.run-") for s in sessions) == 2
    for session_id in sessions:  # every call recorded, in its own run's session
        assert len(await engine.list_turns(session_id)) in (1, 2)


async def test_runs_started_together_without_identity_stay_apart(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """Two agent runs started before either is awaited (at llama-index-workflows 2.0 the
    second run's span is opened as a child of the first, still running)."""
    server = server_box["server"] = ScriptedOpenAIServer(_echo).start()
    llm = _openai(server)
    ce.llamaindex.install(engine)
    first = FunctionAgent(tools=[], llm=llm, system_prompt="SYS").run(user_msg="ONEWORD")
    second = FunctionAgent(tools=[], llm=llm, system_prompt="SYS").run(user_msg="TWOWORD")
    await first
    await second
    for request in server.requests:
        assert len(_canaries(request, ["ONEWORD", "TWOWORD"])) == 1
    sessions = await _sessions(engine)
    assert len(sessions) == 2 and all(s.startswith("run:") for s in sessions)


# -- framework ids the engine would reject; a broken store ----------------------------------


def _reusing_script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="done")
    return ScriptedResponse(tool_calls=[("call_0", "lookup", json.dumps({"q": "x"}))])


async def test_a_tool_call_id_reused_across_turns_keeps_the_session_injected(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_reusing_script).start()
    llm = _openai(server)

    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    plugin = ce.llamaindex.install(engine)
    failed = plugin.failures["integration_failed"]  # the plugin is one object: counts add up
    memory = ChatMemoryBuffer.from_defaults(chat_store_key="reuser")
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(lookup)], llm=llm, system_prompt="S")
    await agent.run(user_msg="first turn", memory=memory)
    await agent.run(user_msg="second turn, mail frank@example.com", memory=memory)
    await agent.run(user_msg="third turn, mail grace@example.com", memory=memory)
    requests = server.requests
    assert len(requests) == 6
    assert plugin.failures["integration_failed"] == failed
    assert len(await engine.list_turns("reuser")) == 6  # every call injected
    for request in requests[2:]:
        assert "@example.com" not in _text(request)
    assert REDACTED in _text(requests[-1])
    # every call and result stay paired (the engine may rename a reused id in the request)
    for request in requests:
        assert_tool_pairs_intact(from_openai_messages(request["messages"]))
    last = requests[-1]["messages"]
    assert last[-1]["role"] == "tool" and last[-1]["tool_call_id"].startswith("call_0")
    assert last[-2]["tool_calls"][0]["id"] == last[-1]["tool_call_id"]


def _summarizing_script(body: dict[str, Any]) -> ScriptedResponse:
    if "OUTER-SYS" not in _system(body):
        return ScriptedResponse(text="NESTED SUMMARY")
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="done")
    turn = sum(m["role"] == "user" for m in body["messages"])
    arguments = json.dumps({"text": f"TEXT-OF-TURN-{turn}"})
    return ScriptedResponse(tool_calls=[("call_0", "summarize", arguments)])


async def test_tool_runs_reusing_a_call_id_get_child_scopes_of_their_own(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """The model answers ``call_0`` in both turns; each turn's tool makes its own LLM call.
    The second run's child scope is named by the id the session stores the reused call
    under (``call_0~2``): its nested request holds only its own messages, not the first
    turn's exchange."""
    server = server_box["server"] = ScriptedOpenAIServer(_summarizing_script).start()
    llm = _openai(server)

    async def summarize(text: str) -> str:
        """Summarize a text."""
        messages = [
            ChatMessage(role="system", content="SUMMARIZER-SYS"),
            ChatMessage(role="user", content=f"Summarize: {text}"),
        ]
        return str((await llm.achat(messages)).message.content)

    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(summarize)], llm=llm, system_prompt=OUTER_SYS
    )
    ce.llamaindex.install(engine)
    for turn in ("first turn", "second turn"):
        with instrument_tags({"ce_session_id": "outer-r"}):
            assert await _drive(agent, turn) == "done"
    nested = [r for r in server.requests if "SUMMARIZER-SYS" in _text(r)]
    assert [r["messages"] for r in nested] == [
        [
            {"role": "system", "content": "SUMMARIZER-SYS"},
            {"role": "user", "content": f"Summarize: TEXT-OF-TURN-{turn}"},
        ]
        for turn in (1, 2)
    ]
    assert await _sessions(engine) == ["outer-r", "outer-r/call_0", "outer-r/call_0~2"]
    doc = await engine.get_session("outer-r")
    assert [t.tool_call_id for t in doc.session.tool_state.tool_calls] == ["call_0", "call_0~2"]
    for child, turn in (("outer-r/call_0", 1), ("outer-r/call_0~2", 2)):
        assert await _contents(engine, child, Role.USER) == [f"Summarize: TEXT-OF-TURN-{turn}"]


class _BrokenStore:
    """Wraps a store; every read and write raises."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("close",):
            return getattr(self._inner, name)

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("store is down")

        return broken


async def test_fail_open_sends_the_apps_messages_redacted(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_echo).start()
    llm = _openai(server)
    engine.store = _BrokenStore(engine.store)  # type: ignore[assignment]
    plugin = ce.llamaindex.install(engine)
    failed = plugin.failures["integration_failed"]
    mine = [
        ChatMessage(role="system", content="app system"),
        ChatMessage(role="user", content="reach me at heidi@example.com"),
    ]
    reply = await llm.achat(mine)
    assert "heidi" not in str(reply.message.content)
    (request,) = server.requests
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert request["messages"][0]["content"] == "app system"
    assert request["messages"][1]["content"] == f"reach me at {REDACTED}"
    assert plugin.failures["integration_failed"] > failed
    assert [m.content for m in mine] == ["app system", "reach me at heidi@example.com"]


async def test_fail_open_redacts_when_the_conversion_fails(
    engine: ContextEngine, server_box: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_echo).start()
    llm = _openai(server)

    def broken(messages: Any) -> Any:
        raise ValueError("cannot convert")

    monkeypatch.setattr("ce.llamaindex._inject.to_openai", broken)
    plugin = ce.llamaindex.install(engine, session_id="s-convert")
    failed = plugin.failures["integration_failed"]
    await llm.achat([ChatMessage(role="user", content="reach me at ivan@example.com")])
    (request,) = server.requests
    assert request["messages"][-1]["content"] == f"reach me at {REDACTED}"
    assert plugin.failures["integration_failed"] == failed + 1


async def test_fail_closed_still_raises(engine: ContextEngine, server_box: dict[str, Any]) -> None:
    server = server_box["server"] = ScriptedOpenAIServer(_echo).start()
    llm = _openai(server)
    engine.store = _BrokenStore(engine.store)  # type: ignore[assignment]
    ce.llamaindex.install(engine, fail_closed=True)
    with pytest.raises(RuntimeError, match="store is down"):
        await llm.achat([ChatMessage(role="user", content="reach me at judy@example.com")])
    assert server.requests == []


class _TwoSources(BaseRetriever):
    """One passage from two sources."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(text=DOC_TEXTS[0], metadata={"source": uri}), score=0.8)
            for uri in ("kb://paris", "faq://paris")
        ]


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_fail_closed_raises_into_a_query_engines_synthesis(
    path: str, engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """A query engine's synthesizer call whose prompt quotes one passage from two sources
    records those nodes before the call: with ``fail_closed`` and the store down, the query
    raises the store's error and the model is not called."""
    server = server_box["server"] = ScriptedOpenAIServer(_echo).start()
    query_engine = RetrieverQueryEngine.from_args(retriever=_TwoSources(), llm=_openai(server))
    engine.store = _BrokenStore(engine.store)  # type: ignore[assignment]
    ce.llamaindex.install(engine, fail_closed=True)
    with pytest.raises(RuntimeError, match="store is down"):
        if path == "sync":
            await asyncio.to_thread(query_engine.query, "What about Paris?")
        else:
            await query_engine.aquery("What about Paris?")
    assert server.requests == []


# -- 20 concurrent users -------------------------------------------------------------------


async def test_twenty_concurrent_users_never_see_each_others_messages(
    engine: ContextEngine, server_box: dict[str, Any]
) -> None:
    """Twenty users at once, two turns each, five of each kind: agents named by
    ``instrument_tags``, chat engines named by their chat-store key, agents with their own
    ``Memory`` (no session id given), chat engines with a ``ContextEngineMemory`` without a
    session id. Every request carries its own user's word and no other's, and a second turn
    carries the first."""
    server = server_box["server"] = ScriptedOpenAIServer(_echo).start()
    llm = _openai(server)
    ce.llamaindex.install(engine)
    words = [f"word{chr(65 + i)}{chr(65 + i)}canary" for i in range(20)]
    store = SimpleChatStore()

    async def agent_user(index: int) -> None:
        agent = FunctionAgent(tools=[], llm=llm, system_prompt="SYS")
        memory = Memory.from_defaults() if index % 4 == 2 else None
        for turn in range(2):
            question = f"turn {turn}: my word is {words[index]}"
            if memory is not None:
                await agent.run(user_msg=question, memory=memory)
                continue
            with instrument_tags({"ce_session_id": f"user-{index}"}):
                await agent.run(user_msg=question)

    async def chat_user(index: int) -> None:
        memory: Any = ContextEngineMemory.from_defaults(engine)
        if index % 4 == 1:
            memory = ChatMemoryBuffer.from_defaults(
                chat_store=store, chat_store_key=f"user-{index}"
            )
        chat = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt="SYS")
        for turn in range(2):
            await chat.achat(f"turn {turn}: my word is {words[index]}")

    await asyncio.gather(*(agent_user(i) if i % 2 == 0 else chat_user(i) for i in range(20)))
    requests = server.requests
    assert len(requests) == 40
    seen: dict[str, int] = {}
    for request in requests:
        (word,) = _canaries(request, words)
        seen[word] = seen.get(word, 0) + 1
        if "turn 1" in _text(request):  # the second turn has the first
            assert "turn 0" in _text(request)
    assert seen == dict.fromkeys(words, 2)
    sessions = await _sessions(engine)
    assert len(sessions) == 20 and not any(s.startswith("run:") for s in sessions)
    assert sum(s.startswith("user-") for s in sessions) == 10
    assert sum(s.startswith("memory:") for s in sessions) == 5
