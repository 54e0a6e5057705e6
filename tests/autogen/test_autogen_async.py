"""The async engine on AutoGen's async paths (``run``, ``run_stream`` with a streaming client,
a team), with a blocking engine (``engine.sync``) that fails on any use; two users' runs at
once under ``asyncio.gather`` never see each other; a canary in the user input, the tool
arguments and the tool output reaches neither the wire nor the SQLite file; every call stays
within the budget with the tool schemas counted; memory text is sent once; usage once per call
with the provider's numbers, streaming included; a raising tool is stored as an error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_apps import client, wire
from autogen_core.memory import ListMemory, MemoryContent
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import AssistantMessage, UserMessage

import ce.autogen
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
MARK = "NOTEBOOK-MARK-ASYNC"
CANARY = "zed.canary@example.com"
ARG_CANARY = "arg.canary@example.com"
OUT_CANARY = "out.canary@example.com"
MEMORY = "The user prefers window seats on every flight."


def search_kb(query: str) -> str:
    """Search the knowledge base."""
    return f"Fact about {query}: write to {OUT_CANARY} for details."


def broken(query: str) -> str:
    """A tool that fails."""
    raise RuntimeError("the knowledge base is down")


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text="Here is what the knowledge base says.", prompt_tokens=123)
    args = json.dumps({"query": f"cats, cc {ARG_CANARY}"})
    return ScriptedResponse(
        tool_calls=[("call_kb", "search_kb", args)], prompt_tokens=77, completion_tokens=9
    )


def _agent(server: ScriptedOpenAIServer, stream: bool = False, **kwargs: Any) -> AssistantAgent:
    return AssistantAgent(
        "kb_agent",
        model_client=client(server),
        tools=[search_kb],
        system_message=SYSTEM,
        reflect_on_tool_use=True,
        model_client_stream=stream,
        **kwargs,
    )


async def _run(agent: Any, task: str, stream: bool) -> str:
    if not stream:
        return str((await agent.run(task=task)).messages[-1].content)
    result = None
    async for item in agent.run_stream(task=task):
        if isinstance(item, TaskResult):
            result = item
    assert result is not None
    return str(result.messages[-1].content)


@pytest.mark.parametrize("path", ["run", "run_stream", "team"])
async def test_the_async_path_awaits_the_engine_and_never_blocks(
    path: str, engine: ContextEngine
) -> None:
    stream = path == "run_stream"
    with ScriptedOpenAIServer(_script) as server:
        agent = _agent(server, stream)
        app: Any = agent
        if path == "team":
            app = RoundRobinGroupChat([agent], termination_condition=MaxMessageTermination(2))
        ce.autogen.install(engine)
        await engine.update_notebook("s-async", MARK)
        with no_blocking(engine) as blocking, engine.session("s-async"):
            answer = await _run(app, f"Tell me about cats, I am {CANARY}.", stream)
        requests = server.requests
    assert blocking.used == []
    assert answer == "Here is what the knowledge base says."
    assert len(requests) == 2
    assert [r.get("stream", False) for r in requests] == [stream, stream]
    if stream:  # the plugin asked for the usage chunk
        assert all(r["stream_options"] == {"include_usage": True} for r in requests)
    for request in requests:
        assert request["messages"][0]["content"].startswith(SYSTEM)
        assert MARK in request["messages"][0]["content"]
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
    assert (run.tool_call_id, run.status.value) == ("call_kb", "success")
    assert run.duration_ms is not None and run.duration_ms >= 0


async def test_two_users_at_once_never_see_each_other(engine: ContextEngine) -> None:
    """Two users, each with their own agent, two runs each, under ``asyncio.gather``: every
    request holds only its own user's words (their earlier turn included)."""

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        asked = body["messages"][-1]["content"]
        return ScriptedResponse(text=f"noted: {asked.split()[0]}")

    with ScriptedOpenAIServer(echo) as server:
        ce.autogen.install(engine)

        async def user(name: str) -> None:
            agent = AssistantAgent(f"agent_{name}", model_client=client(server))
            with engine.session(f"u-{name}"):
                for turn in range(2):
                    await agent.run(task=f"{name}word{turn} from {name}")

        with no_blocking(engine) as blocking:
            await asyncio.gather(user("alpha"), user("bravo"), user("charlie"))
        requests = server.requests
    assert blocking.used == []
    assert len(requests) == 6
    for request in requests:
        text = wire(request)
        owners = [n for n in ("alpha", "bravo", "charlie") if f"{n}word" in text]
        assert len(owners) == 1, text
        if f"{owners[0]}word1" in text:  # the second turn carries the first
            assert f"{owners[0]}word0" in text
    for name in ("alpha", "bravo", "charlie"):
        doc = await engine.get_session(f"u-{name}")
        words = [m.content for m in doc.session.messages if m.role is Role.USER]
        assert words == [f"{name}word0 from {name}", f"{name}word1 from {name}"]


async def test_runs_without_a_session_are_scoped_to_themselves(engine: ContextEngine) -> None:
    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text="ok")

    with ScriptedOpenAIServer(echo) as server:
        ce.autogen.install(engine)
        await asyncio.gather(
            AssistantAgent("one", model_client=client(server)).run(task="first-run words"),
            AssistantAgent("two", model_client=client(server)).run(task="second-run words"),
        )
        requests = server.requests
    assert sorted("first-run" in wire(r) for r in requests) == [False, True]
    assert not any("first-run" in wire(r) and "second-run" in wire(r) for r in requests)
    sessions = await engine.list_sessions()
    assert len([s for s in sessions if s.startswith("run:")]) == 2


async def test_the_canary_is_in_neither_the_wire_nor_the_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    engine = ContextEngine(SQLiteStore(str(path)), config=RuntimeConfig(model_hint="gpt-4o"))
    with ScriptedOpenAIServer(_script) as server:
        ce.autogen.install(engine)
        with engine.session("s-canary"):
            await _agent(server).run(task=f"Find cats for {CANARY}.")
        requests = server.requests
    await engine.flush()
    doc = await engine.get_session("s-canary")
    await engine.close()
    assert len(requests) == 2 and len(doc.session.tool_state.tool_calls) == 1
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"cats" in raw  # the file holds the conversation
    for canary in (CANARY, ARG_CANARY, OUT_CANARY):
        assert all(canary not in wire(r) for r in requests)
        assert canary.encode() not in raw


@pytest.fixture
async def small_engine() -> AsyncIterator[ContextEngine]:
    budget = BudgetConfig(max_input_tokens=700, reserved_reply_tokens=100)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    yield engine
    await engine.close()


async def test_every_call_is_within_budget_with_tool_schemas_counted(
    small_engine: ContextEngine,
) -> None:
    engine = small_engine
    filler = "Background detail that matters little. " * 12
    history: list[Any] = []
    for turn in range(10):
        history.append(UserMessage(content=f"Old question {turn}. {filler}", source="user"))
        history.append(AssistantMessage(content=f"Old answer {turn}. {filler}", source="kb_agent"))
    with ScriptedOpenAIServer(_script) as server:
        agent = _agent(server, model_context=UnboundedChatCompletionContext(history))
        ce.autogen.install(engine)
        with engine.session("s-budget"):
            await agent.run(task="The newest question about cats.")
        requests = server.requests
    estimator = TiktokenEstimator()
    assert len(requests) == 2
    for request in requests:
        parts = from_openai_messages(request["messages"])
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        tools = estimator.estimate_tools(request.get("tools") or [], "gpt-4o")
        assert used + tools <= 600
        assert request["messages"][0]["content"].startswith(SYSTEM)
        assert "The newest question about cats." in wire(request)
        assert_tool_pairs_intact(parts)
    assert len(requests[0]["messages"]) < len(history) + 2  # the budget left history out
    assert requests[1]["messages"][-1]["role"] == "tool"


async def test_memory_text_is_sent_once_and_recorded_as_evidence(engine: ContextEngine) -> None:
    memory = ListMemory(
        memory_contents=[
            MemoryContent(
                content=MEMORY,
                mime_type="text/plain",
                metadata={"source": "kb://prefs", "score": 0.8},
            )
        ]
    )
    with ScriptedOpenAIServer(_script) as server:
        agent = _agent(server, memory=[memory])
        ce.autogen.install(engine)
        with engine.session("s-mem"):
            await agent.run(task="Book me a flight.")
            await agent.run(task="And the way back.")
        requests = server.requests
    assert len(requests) == 4
    for request in requests:
        assert wire(request).count(MEMORY) == 1
        assert [m["role"] for m in request["messages"]].count("system") == 1
    doc = await engine.get_session("s-mem")
    (hit,) = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert (hit.content, hit.source.uri, hit.confidence) == (MEMORY, "kb://prefs", 0.8)


async def test_a_raising_tool_is_stored_as_an_error(engine: ContextEngine) -> None:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="The tool failed.")
        return ScriptedResponse(tool_calls=[("call_bad", "broken", '{"query": "x"}')])

    with ScriptedOpenAIServer(script) as server:
        agent = AssistantAgent(
            "kb_agent",
            model_client=client(server),
            tools=[broken],
            system_message=SYSTEM,
            reflect_on_tool_use=True,
        )
        ce.autogen.install(engine)
        with engine.session("s-err"):
            await agent.run(task="Use the broken tool.")
        requests = server.requests
    assert "the knowledge base is down" in wire(requests[-1])
    doc = await engine.get_session("s-err")
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.tool, run.status.value) == ("call_bad", "broken", "error")
    (evidence_id,) = run.result_evidence_ids
    assert "the knowledge base is down" in doc.evidences[evidence_id].content


async def test_without_reflection_the_last_tool_results_are_recorded(
    engine: ContextEngine,
) -> None:
    """With ``reflect_on_tool_use=False`` the tool results never reach a model: they are
    recorded from the tool side."""
    with ScriptedOpenAIServer(_script) as server:
        agent = AssistantAgent(
            "kb_agent", model_client=client(server), tools=[search_kb], system_message=SYSTEM
        )
        ce.autogen.install(engine)
        with engine.session("s-noreflect"):
            await agent.run(task="Cats?")
        assert len(server.requests) == 1
    doc = await engine.get_session("s-noreflect")
    (run,) = doc.session.tool_state.tool_calls
    (evidence_id,) = run.result_evidence_ids
    assert doc.evidences[evidence_id].content.startswith("Fact about cats")
    assert OUT_CANARY not in doc.evidences[evidence_id].content


@pytest.mark.parametrize("failure", ["engine", "conversion"])
async def test_fail_open_is_still_redacted(
    failure: str, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine (or the conversion of AutoGen's messages) fails: the agent's own messages
    go through, redacted (user text, tool arguments, tool output), and the run completes."""
    if failure == "engine":

        async def broken_prepare(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("prepare_call failed on purpose")

        monkeypatch.setattr(engine, "prepare_call", broken_prepare)
    else:
        import ce.autogen._inject as inject

        def broken_convert(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("conversion failed on purpose")

        monkeypatch.setattr(inject, "to_pending", broken_convert)
    events: list[Any] = []
    engine.events.on("Degraded", events.append)
    with ScriptedOpenAIServer(_script) as server:
        plugin = ce.autogen.install(engine)
        with engine.session("s-open"):
            answer = await _run(_agent(server), f"Cats for {CANARY}?", stream=False)
        requests = server.requests
    assert answer == "Here is what the knowledge base says."
    assert len(requests) == 2
    for request in requests:
        assert request["messages"][0]["content"] == SYSTEM  # the agent's own, no engine context
        for canary in (CANARY, ARG_CANARY, OUT_CANARY):
            assert canary not in wire(request)
    assert "[REDACTED:email]" in wire(requests[1])
    assert plugin.failures["integration_failed"] >= 2
    assert any("on purpose" in e.payload.get("detail", "") for e in events)


async def test_a_team_run_without_a_session_is_one_scope_and_install_names_one(
    engine: ContextEngine,
) -> None:
    """A team's run names no session: all its agents record into one ``run:`` session; with
    ``install(session_id=...)`` that session instead (``engine.session`` still wins)."""

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text=f"reply {len(body['messages'])}")

    def team(server: ScriptedOpenAIServer) -> RoundRobinGroupChat:
        agents = [
            AssistantAgent(name, model_client=client(server), system_message=f"You are {name}.")
            for name in ("alice", "bob")
        ]
        return RoundRobinGroupChat(agents, termination_condition=MaxMessageTermination(3))

    with ScriptedOpenAIServer(echo) as server:
        plugin = ce.autogen.install(engine)
        await team(server).run(task="unnamed team task")
        plugin.uninstall()
        ce.autogen.install(engine, session_id="s-default")
        await team(server).run(task="default team task")
        with engine.session("s-named"):
            await team(server).run(task="named team task")
    runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
    assert len(runs) == 1
    doc = await engine.get_session(runs[0])
    authors = {m.author.id for m in doc.session.messages if m.author and m.role is Role.ASSISTANT}
    assert authors == {"alice", "bob"}
    for session_id, task in (("s-default", "default team task"), ("s-named", "named team task")):
        doc = await engine.get_session(session_id)
        assert [m.content for m in doc.session.messages if m.role is Role.USER] == [task]
        assert len(doc.session.model_usage) == 2


async def test_an_image_of_the_users_message_reaches_the_wire(engine: ContextEngine) -> None:
    """The engine reads text only: a multimodal user message goes as a copy with the engine's
    (redacted) text and the app's image kept."""
    from autogen_agentchat.messages import MultiModalMessage
    from autogen_core import Image
    from PIL import Image as PILImage

    image = Image(PILImage.new("RGB", (1, 1), (255, 0, 0)))
    png = image.to_base64()

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text="a pixel")

    with ScriptedOpenAIServer(echo) as server:
        agent = AssistantAgent("viewer", model_client=client(server), system_message=SYSTEM)
        ce.autogen.install(engine)
        await engine.update_notebook("s-image", MARK)
        task = MultiModalMessage(
            content=[f"What is this? Reply to {CANARY}.", image], source="user"
        )
        with engine.session("s-image"):
            await agent.run(task=task)
        (request,) = server.requests
    last = request["messages"][-1]
    assert last["role"] == "user" and isinstance(last["content"], list)
    kinds = [part["type"] for part in last["content"]]
    assert kinds == ["text", "image_url"]
    assert "[REDACTED:email]" in last["content"][0]["text"] and CANARY not in wire(request)
    assert png[:40] in last["content"][1]["image_url"]["url"]
    assert MARK in request["messages"][0]["content"]


async def test_head_and_tail_context_placeholder_is_not_recorded(engine: ContextEngine) -> None:
    """AutoGen's ``HeadAndTailChatCompletionContext`` replaces the middle of the history with a
    "Skipped N messages." user message: the session holds those messages, so the placeholder is
    neither stored nor sent, and the model gets the session's history instead."""
    from autogen_core.model_context import HeadAndTailChatCompletionContext

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text=f"answer {len(body['messages'])}")

    with ScriptedOpenAIServer(echo) as server:
        agent = AssistantAgent(
            "kb_agent",
            model_client=client(server),
            system_message=SYSTEM,
            model_context=HeadAndTailChatCompletionContext(head_size=1, tail_size=1),
        )
        ce.autogen.install(engine)
        with engine.session("s-head-tail"):
            for turn in range(4):
                await agent.run(task=f"question {turn}")
        requests = server.requests
    assert all("Skipped" not in wire(r) for r in requests)
    assert "question 1" in wire(requests[-1])  # AutoGen's context cut it; the session has it
    doc = await engine.get_session("s-head-tail")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        f"question {turn}" for turn in range(4)
    ]
