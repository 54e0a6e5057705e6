"""ce-haystack on Haystack's own paths: an Agent's tool loop through ``run`` and ``run_async``,
streamed or not, and Pipelines. Every model call gets the engine's input (its own system
prompt first, the newest user input, tool pairs intact, within budget with the tool schemas
counted); the async paths await the engine and never block; tool runs are stored once with
Haystack's call id, status and duration, usage once per call with the provider's numbers
(streamed too: the plugin asks OpenAI for it); a canary in the user input, the tool arguments
and the tool output reaches neither the wire nor the SQLite file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.tools import Tool
from hs_apps import generator, wire

import ce.haystack
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.integration import SESSION_KEY
from ce.core.schema import Role
from ce.core.stores import SQLiteStore
from ce.core.testing import (
    ScriptedOpenAIServer,
    ScriptedResponse,
    deterministic_engine,
    no_blocking,
)
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator

SYSTEM = "You answer from the knowledge base."
MARK = "NOTEBOOK-MARK-HS"
CANARY = "zed.canary@example.com"
ARG_CANARY = "arg.canary@example.com"
OUT_CANARY = "out.canary@example.com"


def search_kb(query: str) -> str:
    """Search the knowledge base."""
    return f"Fact about {query}: write to {OUT_CANARY} for details."


def broken(query: str) -> str:
    """A tool that fails."""
    raise RuntimeError("the knowledge base is down")


def _tool(function: Callable[[str], str]) -> Tool:
    return Tool(
        name=function.__name__,
        description=str(function.__doc__),
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
        function=function,
    )


def _script(tool: str = "search_kb") -> Callable[[dict[str, Any]], ScriptedResponse]:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="Here is what the knowledge base says.", prompt_tokens=123)
        args = json.dumps({"query": f"cats, cc {ARG_CANARY}"})
        turn = sum(m["role"] == "user" for m in body["messages"])  # a new call id each turn
        return ScriptedResponse(
            tool_calls=[(f"call_kb_{turn}", tool, args)], prompt_tokens=77, completion_tokens=9
        )

    return script


def _agent(server: ScriptedOpenAIServer, *tools: Tool) -> Agent:
    return Agent(
        chat_generator=generator(server),
        tools=list(tools or (_tool(search_kb),)),
        system_prompt=SYSTEM,
    )


PATHS = ["run", "run_stream", "run_async", "run_async_stream"]


async def _ask(path: str, agent: Agent, text: str, session_id: str) -> tuple[str, list[str]]:
    """Ask ``text`` through the Agent's ``path`` in session ``session_id`` (named in the
    Agent's ``hook_context``); the answer and the chunks the app's callback got."""
    chunks: list[str] = []
    kwargs: dict[str, Any] = {"hook_context": {SESSION_KEY: session_id}}
    messages = [ChatMessage.from_user(text)]
    if path == "run_stream":
        kwargs["streaming_callback"] = lambda c: chunks.append(c.content)
    if path == "run_async_stream":

        async def collect(chunk: StreamingChunk) -> None:
            chunks.append(chunk.content)

        kwargs["streaming_callback"] = collect
    if path.startswith("run_async"):
        result = await agent.run_async(messages, **kwargs)
    else:
        result = agent.run(messages, **kwargs)
    return str(result["last_message"].text), chunks


@pytest.mark.parametrize("path", PATHS)
async def test_every_path_injects_and_records(path: str, engine: ContextEngine) -> None:
    stream = path.endswith("stream")
    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine)
        await engine.update_notebook("s-path", MARK)
        if path.startswith("run_async"):
            with no_blocking(engine) as blocking:
                answer, chunks = await _ask(path, agent, f"Cats? I am {CANARY}.", "s-path")
            assert blocking.used == []
        else:
            answer, chunks = await _ask(path, agent, f"Cats? I am {CANARY}.", "s-path")
        requests = server.requests
    assert answer == "Here is what the knowledge base says."
    if stream:  # the app's own callback still gets every chunk
        assert "".join(chunks).endswith(answer)
    assert len(requests) == 2
    for request in requests:
        first = request["messages"][0]
        assert first["role"] == "system" and first["content"].startswith(SYSTEM)
        assert MARK in first["content"]
        parts = from_openai_messages(request["messages"])
        assert [p.role for p in parts].count(Role.SYSTEM) == 1
        assert_tool_pairs_intact(parts)
        assert "Cats? I am" in wire(request)
        for canary in (CANARY, ARG_CANARY, OUT_CANARY):
            assert canary not in wire(request)
        assert [t["function"]["name"] for t in request["tools"]] == ["search_kb"]
        if stream:
            assert request["stream_options"] == {"include_usage": True}
    assert requests[1]["messages"][-1]["role"] == "tool"
    doc = await engine.get_session("s-path")
    usage = doc.session.model_usage
    assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == [(77, 9), (123, 5)]
    assert all(u.provider == "openai" and u.model.startswith("gpt-4o") for u in usage)
    if stream:
        assert all(u.first_token_latency_ms is not None for u in usage)
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.tool, run.status.value) == ("call_kb_1", "search_kb", "success")
    assert run.duration_ms is not None and run.duration_ms >= 0
    (evidence_id,) = run.result_evidence_ids
    assert doc.evidences[evidence_id].content.startswith("Fact about cats")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert len(users) == 1 and users[0].startswith("Cats? I am")
    final = [m for m in doc.session.messages if m.role is Role.ASSISTANT][-1]
    assert final.content == answer
    assert final.invocation is not None and final.invocation.provider == "openai"


async def test_the_agents_state_is_never_changed(engine: ContextEngine) -> None:
    """The engine's input goes to the generator only: the messages the Agent returns are its
    own, with the app's system prompt and user message."""
    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine, session_id="s-state")
        await engine.update_notebook("s-state", MARK)
        result = agent.run([ChatMessage.from_user("cats?")])
    messages = result["messages"]
    assert [m.role.value for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[0].text == SYSTEM and messages[1].text == "cats?"
    assert all(MARK not in (m.text or "") for m in messages)


async def test_sessions_named_by_hook_context_share_history_and_others_do_not(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine)
        await _ask("run", agent, "first question", "s-shared")
        await _ask("run", agent, "second question", "s-shared")
        agent.run([ChatMessage.from_user("third question")])  # no session: its own run
        requests = server.requests
    assert "first question" in wire(requests[2]) and "second question" in wire(requests[2])
    assert "first question" not in wire(requests[4])
    assert "second question" not in wire(requests[4])
    doc = await engine.get_session("s-shared")
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == ["first question", "second question"]


async def test_a_raising_tool_is_stored_as_an_error(engine: ContextEngine) -> None:
    """Haystack hands the model the error as text (a tool message with ``error=True``): the
    run is stored with the error status."""
    with ScriptedOpenAIServer(_script("broken")) as server:
        agent = _agent(server, _tool(broken))
        ce.haystack.install(engine)
        await _ask("run", agent, "cats?", "s-broken")
        requests = server.requests
    assert "the knowledge base is down" in requests[1]["messages"][-1]["content"]
    doc = await engine.get_session("s-broken")
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.status.value) == ("call_kb_1", "error")
    (evidence_id,) = run.result_evidence_ids
    assert "the knowledge base is down" in doc.evidences[evidence_id].content


async def test_the_canary_is_in_neither_the_wire_nor_the_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "ce.sqlite"
    engine = ContextEngine(SQLiteStore(str(path)), config=RuntimeConfig(model_hint="gpt-4o"))
    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine)
        await _ask("run_async", agent, f"Find cats for {CANARY}.", "s-canary")
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
        agent = _agent(server)
        ce.haystack.install(engine)
        for turn in range(6):
            await _ask("run", agent, f"turn {turn}: " + "words " * 60, "s-budget")
        requests = server.requests
    assert len(requests) == 12
    for request in requests:
        parts = from_openai_messages(request["messages"])
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        used += estimator.estimate_tools(request["tools"], "gpt-4o")
        assert used <= 900 - 100 + 8, used
        assert_tool_pairs_intact(parts)
        assert request["messages"][0]["content"].startswith(SYSTEM)
    assert "turn 5:" in wire(requests[-1])
    await engine.close()


async def test_fail_open_is_still_redacted(engine: ContextEngine, monkeypatch: Any) -> None:
    async def broken_prepare(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the engine is down")

    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine)
        monkeypatch.setattr(engine, "prepare_call", broken_prepare)
        answer, _ = await _ask("run_async", agent, f"Cats for {CANARY}?", "s-open")
        requests = server.requests
    assert answer == "Here is what the knowledge base says."
    for request in requests:
        assert request["messages"][0]["content"] == SYSTEM
        for canary in (CANARY, ARG_CANARY, OUT_CANARY):
            assert canary not in wire(request)


async def test_inject_false_records_and_sends_the_apps_own(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine, inject=False)
        await engine.update_notebook("s-quiet", MARK)
        await _ask("run", agent, "cats?", "s-quiet")
        requests = server.requests
    assert all(r["messages"][0]["content"] == SYSTEM for r in requests)
    doc = await engine.get_session("s-quiet")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == ["cats?"]
    assert len(doc.session.model_usage) == 2
    assert len(doc.session.tool_state.tool_calls) == 1


async def test_augment_keeps_the_apps_messages_and_adds_the_context(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine, mode="augment")
        await engine.update_notebook("s-augment", MARK)
        await _ask("run", agent, "cats?", "s-augment")
        requests = server.requests
    for request in requests:
        messages = request["messages"]
        assert messages[0]["content"] == SYSTEM
        assert messages[1]["role"] == "system" and MARK in messages[1]["content"]
        assert_tool_pairs_intact(from_openai_messages(messages))
    assert requests[1]["messages"][-1]["role"] == "tool"


async def test_blocking_runs_on_an_event_loop_thread_share_their_session(
    engine: ContextEngine,
) -> None:
    """The app calls the blocking ``Agent.run`` from async code (on the loop's thread), twice,
    with the loop running in between: the writes of a blocking run are inline, so nothing of
    the first run holds the session when the second one starts."""
    failures: list[Any] = []
    engine.events.on("Degraded", failures.append)
    with ScriptedOpenAIServer(_script()) as server:
        agent = _agent(server)
        ce.haystack.install(engine)
        await _ask("run", agent, "first question", "s-loop-thread")
        await asyncio.to_thread(lambda: None)  # the loop runs whatever the first run queued
        await _ask("run", agent, "second question", "s-loop-thread")
        requests = server.requests
    assert failures == []
    assert "first question" in wire(requests[2]) and "first question" in wire(requests[3])
    doc = await engine.get_session("s-loop-thread")
    assert len(doc.session.model_usage) == 4
    assert len(doc.session.tool_state.tool_calls) == 2
