"""The async engine on Semantic Kernel's paths (``kernel.invoke_prompt``, a chat service's
``get_chat_message_content`` and streaming with ``FunctionChoiceBehavior.Auto()``,
``ChatCompletionAgent.get_response`` and ``invoke_stream`` on a ``ChatHistoryAgentThread``),
with a blocking engine (``engine.sync``) that fails on any use: every request of the
auto-function-calling loop gets the engine's input (the app's ``ChatHistory`` unchanged),
tool pairs intact, usage once per request with the provider's numbers (streaming included),
each function call once with SK's call id, status and duration; two users at once never see
each other; a canary in the user input, the function arguments and its output reaches
neither the wire nor the SQLite file; a search function's result is sent once and stored as
``rag_doc`` evidence with source and score; a model call inside a function is nested."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import pytest
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistory
from semantic_kernel.functions import KernelArguments, kernel_function
from sk_apps import kernel_with, wire

import ce.semantic_kernel
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.schema import EvidenceType, Role
from ce.core.stores import SQLiteStore
from ce.core.testing import (
    ScriptedOpenAIServer,
    ScriptedResponse,
    deterministic_engine,
    no_blocking,
)
from ce.core.testing.assertions import assert_tool_pairs_intact, fenced
from ce.core.tokens import TiktokenEstimator

SYSTEM = "You answer from the knowledge base."
MARK = "NOTEBOOK-MARK-SK"
CANARY = "zed.canary@example.com"
ARG_CANARY = "arg.canary@example.com"
OUT_CANARY = "out.canary@example.com"
DOC_TEXT = "Oslo gets 9 C and light rain this weekend."


class KB:
    @kernel_function(name="search_kb", description="Search the knowledge base.")
    def search_kb(self, query: Annotated[str, "the query"]) -> str:
        return f"Fact about {query}: write to {OUT_CANARY} for details."

    @kernel_function(name="broken", description="A function that fails.")
    def broken(self, query: str) -> str:
        raise RuntimeError("the knowledge base is down")


class Docs:
    @kernel_function(name="search", description="Search the travel documents.")
    def search(self, query: str) -> list[str]:
        hit = {
            "record": {"id": "oslo-1", "content": DOC_TEXT, "source": "doc://oslo"},
            "score": 0.8,
        }
        return [json.dumps(hit)]


def _script(function: str = "KB-search_kb") -> Any:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="Here is what the knowledge base says.", prompt_tokens=123)
        args = json.dumps({"query": f"cats, cc {ARG_CANARY}"})
        return ScriptedResponse(
            tool_calls=[("call_kb", function, args)], prompt_tokens=77, completion_tokens=9
        )

    return script


def _settings() -> OpenAIChatPromptExecutionSettings:
    return OpenAIChatPromptExecutionSettings(function_choice_behavior=FunctionChoiceBehavior.Auto())


async def _ask(path: str, kernel: Kernel, text: str, thread_id: str = "s-async") -> str:
    """Ask ``text`` through SK's ``path``; the session is ``thread_id`` (the agent's thread;
    elsewhere ``ce_session_id`` in the kernel arguments)."""
    if path == "invoke_prompt":
        result = await kernel.invoke_prompt(
            "{{$chat}}",
            arguments=KernelArguments(settings=_settings(), chat=text, ce_session_id=thread_id),
        )
        return str(result)
    if path == "invoke_prompt_stream":
        chunks: list[str] = []
        async for chunk in kernel.invoke_prompt_stream(
            "{{$chat}}",
            arguments=KernelArguments(settings=_settings(), chat=text, ce_session_id=thread_id),
        ):
            chunks.append(str(chunk[0]) if isinstance(chunk, list) and chunk else "")
        return "".join(chunks)
    if path in ("service", "service_stream"):
        service = kernel.get_service(type=None)
        history = ChatHistory(system_message=SYSTEM)
        history.add_user_message(text)
        arguments = KernelArguments(ce_session_id=thread_id)
        if path == "service":
            reply = await service.get_chat_message_content(
                history, _settings(), kernel=kernel, arguments=arguments
            )
            return str(reply)
        parts: list[str] = []
        async for chunk in service.get_streaming_chat_message_content(
            history, _settings(), kernel=kernel, arguments=arguments
        ):
            parts.append(str(chunk or ""))
        return "".join(parts)
    agent = ChatCompletionAgent(
        kernel=kernel,
        name="kb_agent",
        instructions=SYSTEM,
        function_choice_behavior=FunctionChoiceBehavior.Auto(),
    )
    thread = ChatHistoryAgentThread(thread_id=thread_id)
    if path == "agent":
        return str((await agent.get_response(messages=text, thread=thread)).message.content)
    out: list[str] = []
    async for item in agent.invoke_stream(messages=text, thread=thread):
        out.append(str(item.message.content or ""))
    return "".join(out)


PATHS = [
    "invoke_prompt",
    "invoke_prompt_stream",
    "service",
    "service_stream",
    "agent",
    "agent_stream",
]


@pytest.mark.parametrize("path", PATHS)
async def test_the_async_path_awaits_the_engine_and_never_blocks(
    path: str, engine: ContextEngine
) -> None:
    stream = path.endswith("stream")
    with ScriptedOpenAIServer(_script()) as server:
        kernel = kernel_with(server, (KB(), "KB"))
        ce.semantic_kernel.install(engine)
        await engine.update_notebook("s-async", MARK)
        with no_blocking(engine) as blocking:
            answer = await _ask(path, kernel, f"Tell me about cats, I am {CANARY}.")
        requests = server.requests
    assert blocking.used == []
    assert answer == "Here is what the knowledge base says."
    assert len(requests) == 2
    assert [r.get("stream", False) for r in requests] == [stream, stream]
    for request in requests:
        first = request["messages"][0]
        assert first["role"] == "system" and MARK in first["content"]
        if not path.startswith("invoke_prompt"):  # a prompt sends no system prompt of its own
            assert first["content"].startswith(SYSTEM)
        parts = from_openai_messages(request["messages"])
        assert [p.role for p in parts].count(Role.SYSTEM) == 1
        assert_tool_pairs_intact(parts)
        assert "Tell me about cats" in wire(request)
        for canary in (CANARY, ARG_CANARY, OUT_CANARY):
            assert canary not in wire(request)
    assert requests[1]["messages"][-1]["role"] == "tool"
    doc = await engine.get_session("s-async")
    # the tool's output reached the model fenced with its recorded run's evidence id
    fence = fenced(requests[1]["messages"][-1]["content"]) or {}
    assert fence.get("status") == "success" and fence.get("id") in doc.evidences
    usage = doc.session.model_usage
    assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == [(77, 9), (123, 5)]
    assert all(u.provider == "openai" and u.model.startswith("gpt-4o") for u in usage)
    if stream:
        assert all(u.first_token_latency_ms is not None for u in usage)
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.tool, run.status.value) == ("call_kb", "search_kb", "success")
    assert run.provider.name == "KB"
    assert run.duration_ms is not None and run.duration_ms >= 0
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert len(users) == 1 and "Tell me about cats" in users[0]
    final = [m for m in doc.session.messages if m.role is Role.ASSISTANT][-1]
    assert final.content == "Here is what the knowledge base says."
    assert final.invocation is not None and final.invocation.provider == "openai"
    if path.startswith("agent"):
        assert final.author is not None and final.author.id == "kb_agent"


async def test_the_apps_chat_history_is_never_changed(engine: ContextEngine) -> None:
    """The loop grows the app's ChatHistory with SK's own messages; the engine's input goes in
    a new ChatHistory per request."""
    with ScriptedOpenAIServer(_script()) as server:
        kernel = kernel_with(server, (KB(), "KB"))
        ce.semantic_kernel.install(engine, session_id="s-history")
        await engine.update_notebook("s-history", MARK)
        history = ChatHistory(system_message=SYSTEM)
        history.add_user_message("cats?")
        service = kernel.get_service(type=None)
        await service.get_chat_message_content(history, _settings(), kernel=kernel)
        requests = server.requests
    assert [str(m.role.value) for m in history.messages] == ["system", "user", "assistant", "tool"]
    assert history.messages[0].content == SYSTEM
    assert all(MARK in r["messages"][0]["content"] for r in requests)


async def test_two_users_at_once_never_see_each_other(engine: ContextEngine) -> None:
    """Two users, each with their own agent thread, two turns each, under
    ``asyncio.gather``: every request holds only its own user's words (their earlier turn
    included)."""

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        asked = body["messages"][-1]["content"]
        return ScriptedResponse(text=f"noted: {asked.split()[0]}")

    with ScriptedOpenAIServer(echo) as server:
        ce.semantic_kernel.install(engine)

        async def user(name: str) -> None:
            kernel = kernel_with(server)
            agent = ChatCompletionAgent(kernel=kernel, name=f"agent_{name}", instructions=SYSTEM)
            thread = ChatHistoryAgentThread(thread_id=f"u-{name}")
            for turn in range(2):
                await agent.get_response(messages=f"{name}word{turn} from {name}", thread=thread)

        with no_blocking(engine) as blocking:
            await asyncio.gather(user("alice"), user("bob"))
        requests = server.requests
    assert blocking.used == []
    assert len(requests) == 4
    for request in requests:
        text = wire(request)
        own = "alice" if "alice" in text else "bob"
        other = "bob" if own == "alice" else "alice"
        assert other not in text
        if f"{own}word1" in text:
            assert f"{own}word0" in text  # the user's own earlier turn
    for name in ("alice", "bob"):
        doc = await engine.get_session(f"u-{name}")
        users = [m.content for m in doc.session.messages if m.role is Role.USER]
        assert users == [f"{name}word0 from {name}", f"{name}word1 from {name}"]


async def test_runs_without_a_session_are_scoped_to_themselves(engine: ContextEngine) -> None:
    """No thread named, nothing else: each agent invocation's random thread is its own
    session; two direct service calls are two runs."""

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text="ok")

    with ScriptedOpenAIServer(echo) as server:
        kernel = kernel_with(server)
        ce.semantic_kernel.install(engine)
        agent = ChatCompletionAgent(kernel=kernel, name="solo", instructions=SYSTEM)
        await agent.get_response(messages="first question")
        await agent.get_response(messages="second question")
        service = kernel.get_service(type=None)
        for text in ("third", "fourth"):
            history = ChatHistory()
            history.add_user_message(text)
            await service.get_chat_message_content(history, OpenAIChatPromptExecutionSettings())
        requests = server.requests
    assert "first question" not in wire(requests[1])
    assert "third" not in wire(requests[3])
    sessions = await engine.list_sessions()
    assert len([s for s in sessions if s.startswith("thread_")]) == 2
    assert len([s for s in sessions if s.startswith("run:")]) == 2


async def test_the_canary_is_in_neither_the_wire_nor_the_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "ce.sqlite"
    engine = ContextEngine(SQLiteStore(str(path)), config=RuntimeConfig(model_hint="gpt-4o"))
    with ScriptedOpenAIServer(_script()) as server:
        kernel = kernel_with(server, (KB(), "KB"))
        ce.semantic_kernel.install(engine)
        await _ask("agent", kernel, f"Find cats for {CANARY}.", "s-canary")
        requests = server.requests
    doc = await engine.get_session("s-canary")
    assert doc.session.tool_state.tool_calls
    await engine.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    for canary in (CANARY, ARG_CANARY, OUT_CANARY):
        assert all(canary not in wire(r) for r in requests)
        assert canary.encode() not in raw


async def test_every_call_is_within_budget_with_tool_schemas_counted() -> None:
    budget = BudgetConfig(max_input_tokens=900, reserved_reply_tokens=100)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    estimator = TiktokenEstimator()
    with ScriptedOpenAIServer(_script()) as server:
        kernel = kernel_with(server, (KB(), "KB"))
        ce.semantic_kernel.install(engine)
        for turn in range(6):
            await _ask("agent", kernel, f"turn {turn}: " + "words " * 60, "s-budget")
        requests = server.requests
    for request in requests:
        parts = from_openai_messages(request["messages"])
        tools = request.get("tools") or []
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        used += estimator.estimate_tools(tools, "gpt-4o") if tools else 0
        assert used <= 900 - 100 + 8, used
        assert_tool_pairs_intact(parts)
    await engine.close()


async def test_a_search_functions_result_is_sent_once_and_stored_as_rag_doc(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script("Docs-search")) as server:
        kernel = kernel_with(server, (Docs(), "Docs"))
        ce.semantic_kernel.install(engine)
        await _ask("agent", kernel, "Weather in Oslo?", "s-rag")
        requests = server.requests
    assert wire(requests[1]).count(DOC_TEXT) == 1
    doc = await engine.get_session("s-rag")
    (hit,) = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert hit.content == DOC_TEXT and hit.source.uri == "doc://oslo"
    assert hit.confidence == pytest.approx(0.8)
    assert hit.links.tool_call_id == "call_kb"


async def test_a_raising_function_is_stored_as_an_error(engine: ContextEngine) -> None:
    """SK turns the exception into a string result before the auto-invocation filter sees it;
    the function-invocation filter saw it: the run is stored as an error."""
    with ScriptedOpenAIServer(_script("KB-broken")) as server:
        kernel = kernel_with(server, (KB(), "KB"))
        ce.semantic_kernel.install(engine)
        await _ask("agent", kernel, "cats?", "s-broken")
        requests = server.requests
    assert "An error occurred" in requests[1]["messages"][-1]["content"]
    doc = await engine.get_session("s-broken")
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.status.value) == ("call_kb", "error")
    (evidence_id,) = run.result_evidence_ids
    assert "the knowledge base is down" in doc.evidences[evidence_id].content


class Writer:
    """A plugin whose function calls the model itself (through its kernel)."""

    def __init__(self) -> None:
        self.kernel: Kernel | None = None

    @kernel_function(name="summarize", description="Summarize a topic with the model.")
    async def summarize(self, query: str) -> str:
        assert self.kernel is not None
        return str(await self.kernel.invoke_prompt(f"Summarize {query} in a line."))


async def test_a_model_call_inside_a_function_is_nested(engine: ContextEngine) -> None:
    """An LLM-backed function: its model call goes to ``<outer>/<call id>``, never gets the
    outer conversation and never adds to it."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        last = body["messages"][-1]
        if last["role"] == "user" and last["content"].startswith("Summarize"):
            return ScriptedResponse(text="inner summary", prompt_tokens=11, completion_tokens=2)
        if last["role"] == "tool":
            return ScriptedResponse(text="outer answer")
        return ScriptedResponse(tool_calls=[("call_w", "Writer-summarize", '{"query": "cats"}')])

    with ScriptedOpenAIServer(script) as server:
        writer = Writer()
        kernel = writer.kernel = kernel_with(server, (writer, "Writer"))
        ce.semantic_kernel.install(engine)
        await engine.update_notebook("s-outer", MARK)
        answer = await _ask("agent", kernel, "OUTER-QUESTION about cats", "s-outer")
        requests = server.requests
    assert answer == "outer answer"
    inner = [r for r in requests if r["messages"][-1]["content"].startswith("Summarize")]
    (inner_request,) = inner
    assert "OUTER-QUESTION" not in wire(inner_request) and MARK not in wire(inner_request)
    outer = await engine.get_session("s-outer")
    assert [m.content for m in outer.session.messages if m.role is Role.USER] == [
        "OUTER-QUESTION about cats"
    ]
    assert len(outer.session.model_usage) == 2
    nested = await engine.get_session("s-outer/call_w")
    assert [(u.prompt_tokens, u.completion_tokens) for u in nested.session.model_usage] == [(11, 2)]
    assert [m.content for m in nested.session.messages if m.role is Role.USER] == [
        "Summarize cats in a line."
    ]


async def test_a_reused_call_id_nests_each_turn_in_a_child_of_its_own(
    engine: ContextEngine,
) -> None:
    """A model that names its function call ``call_0`` on every turn: the LLM-backed
    function's model call of the second turn goes to ``<outer>/call_0~2`` and receives
    nothing of the first turn's."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        last = body["messages"][-1]
        if last["role"] == "user" and last["content"].startswith("Summarize"):
            return ScriptedResponse(text=f"inner: {last['content']}")
        if last["role"] == "tool":
            return ScriptedResponse(text="outer answer")
        query = json.dumps({"query": last["content"]})
        return ScriptedResponse(tool_calls=[("call_0", "Writer-summarize", query)])

    with ScriptedOpenAIServer(script) as server:
        writer = Writer()
        kernel = writer.kernel = kernel_with(server, (writer, "Writer"))
        ce.semantic_kernel.install(engine)
        for question in ("cats", "dogs"):
            await _ask("agent", kernel, question, "s-reused")
        requests = server.requests
    inner = [r for r in requests if r["messages"][-1]["content"].startswith("Summarize")]
    assert [[m["content"] for m in r["messages"] if m["role"] != "system"] for r in inner] == [
        ["Summarize cats in a line."],
        ["Summarize dogs in a line."],
    ]
    for child_id, question in (("s-reused/call_0", "cats"), ("s-reused/call_0~2", "dogs")):
        child = await engine.get_session(child_id)
        assert [m.content for m in child.session.messages if m.role is Role.USER] == [
            f"Summarize {question} in a line."
        ]


async def test_the_summarization_reducer_is_recorded_and_never_rewritten(
    engine: ContextEngine,
) -> None:
    """SK's summarization reducer calls the same service: its request goes as SK wrote it
    (no engine context), recorded in a child scope, not in the conversation."""
    from semantic_kernel.contents import ChatHistorySummarizationReducer

    def script(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text="SUMMARY", prompt_tokens=40, completion_tokens=3)

    with ScriptedOpenAIServer(script) as server:
        kernel = kernel_with(server)
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine, session_id="s-reduce")
        await engine.update_notebook("s-reduce", MARK)
        reducer = ChatHistorySummarizationReducer(service=service, target_count=2)
        for turn in range(4):
            reducer.add_user_message(f"question {turn}")
            reducer.add_assistant_message(f"answer {turn}")
        assert await reducer.reduce() is not None
        (request,) = server.requests
    assert MARK not in wire(request)
    assert "question 0" in wire(request)
    assert (await engine.get_session("s-reduce")).session.model_usage == []
    children = [s for s in await engine.list_sessions() if s.startswith("s-reduce/summarize:")]
    (child,) = children
    usage = (await engine.get_session(child)).session.model_usage
    assert [(u.prompt_tokens, u.stage.value) for u in usage] == [(40, "summarize")]


async def test_fail_open_is_still_redacted(engine: ContextEngine, monkeypatch: Any) -> None:
    """The engine fails on every request: the app's own messages go through, redacted (user
    text, function arguments, function output), and the run completes."""

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("prepare_call failed on purpose")

    monkeypatch.setattr(engine, "prepare_call", broken)
    with ScriptedOpenAIServer(_script()) as server:
        kernel = kernel_with(server, (KB(), "KB"))
        ce.semantic_kernel.install(engine)
        answer = await _ask("agent", kernel, f"Cats for {CANARY}?", "s-open")
        requests = server.requests
    assert answer == "Here is what the knowledge base says."
    assert len(requests) == 2
    for request in requests:
        assert request["messages"][0]["content"] == SYSTEM
        for canary in (CANARY, ARG_CANARY, OUT_CANARY):
            assert canary not in wire(request)
    assert "[REDACTED:email]" in wire(requests[1])
