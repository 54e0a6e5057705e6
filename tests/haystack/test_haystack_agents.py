"""Several Agents in one Pipeline run share its session: every model call of each Agent's
tool loop starts with that Agent's own system prompt, keeps its tool pairs intact and has
the newest user input; each Agent's messages are stored with the Agent (its component name)
as author."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from haystack.tools import Tool
from hs_apps import LOOKUP, generator

import ce.haystack
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.events import Event
from ce.core.formats import from_openai_messages
from ce.core.integration import SESSION_KEY
from ce.core.schema import AuthorKind, Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator

PROMPTS = {"researcher": "You research facts.", "writer": "You write the answer."}


def script(body: dict[str, Any]) -> ScriptedResponse:
    system = body["messages"][0]["content"]
    agent = "researcher" if system.startswith(PROMPTS["researcher"]) else "writer"
    if body["messages"][-1]["role"] == "tool":
        return ScriptedResponse(text=f"{agent} is done.")
    args = json.dumps({"q": agent})
    return ScriptedResponse(tool_calls=[(f"call_{agent}", "lookup", args)])


def _pipeline(server: ScriptedOpenAIServer, session_id: str, tools: bool = True) -> Pipeline:
    """The researcher and the writer Agents (with the lookup tool, or none) in one pipeline
    whose runs share ``session_id``."""
    pipeline = Pipeline(metadata={SESSION_KEY: session_id})
    for name, prompt in PROMPTS.items():
        agent = Agent(
            chat_generator=generator(server),
            tools=[LOOKUP] if tools else None,
            system_prompt=prompt,
        )
        pipeline.add_component(name, agent)
    return pipeline


async def test_each_agent_gets_its_own_prompt_and_authors_its_messages(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(script) as server:
        pipeline = _pipeline(server, "s-team")
        ce.haystack.install(engine)
        question = [ChatMessage.from_user("Weather in Oslo?")]
        result = pipeline.run({name: {"messages": question} for name in PROMPTS})
        requests = server.requests
    assert {result[name]["last_message"].text for name in PROMPTS} == {
        "researcher is done.",
        "writer is done.",
    }
    assert len(requests) == 4
    for request in requests:
        first = request["messages"][0]["content"]
        own = [p for p in PROMPTS.values() if first.startswith(p)]
        assert len(own) == 1
        other = next(p for p in PROMPTS.values() if p not in own)
        assert other not in json.dumps(request["messages"])
        parts = from_openai_messages(request["messages"])
        assert [p.role for p in parts].count(Role.SYSTEM) == 1
        assert_tool_pairs_intact(parts)
        assert "Weather in Oslo?" in json.dumps(request["messages"])
    doc = await engine.get_session("s-team")
    replies = [m for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert replies and all(m.author is not None for m in replies)
    assert all(m.author.kind is AuthorKind.AGENT for m in replies if m.author)
    by_author = {m.author.id for m in replies if m.author}
    assert by_author == set(PROMPTS)
    for message in replies:
        assert message.author is not None
        if message.content:
            assert message.content == f"{message.author.id} is done."
    assert {c.tool_call_id for c in doc.session.tool_state.tool_calls} == {
        "call_researcher",
        "call_writer",
    }


async def test_each_agent_gets_the_others_turns_as_the_others_words(
    engine: ContextEngine,
) -> None:
    """Two Agents of a pipeline asked twice in one session: each call holds the other Agent's
    turns (the engine's history), each as one user message ``[<agent> wrote:]`` with its tool
    call and result as text and its answer, never as the caller's own assistant turn or tool
    call; the caller's own turns keep their native tool messages, pairs intact. The store
    keeps every message as it was written."""
    with ScriptedOpenAIServer(script) as server:
        pipeline = _pipeline(server, "s-peers")
        ce.haystack.install(engine)
        for question in ("Weather in Oslo?", "And tomorrow?"):
            pipeline.run(
                {name: {"messages": [ChatMessage.from_user(question)]} for name in PROMPTS}
            )
        requests = server.requests
    assert len(requests) == 8
    peers_seen = 0
    for request in requests:
        messages = request["messages"]
        own = next(n for n, p in PROMPTS.items() if messages[0]["content"].startswith(p))
        other = next(n for n in PROMPTS if n != own)
        for message in messages:
            text = str(message.get("content") or "")
            calls = [c["id"] for c in message.get("tool_calls") or ()]
            if message["role"] in ("assistant", "tool"):
                assert other not in text and not any(other in c for c in calls), (own, message)
                if message["role"] == "tool":
                    assert message["tool_call_id"].startswith(f"call_{own}")
            if text.startswith(f"[{other} wrote:]"):
                assert message["role"] == "user"
                assert f'[called lookup({{"q": "{other}"}})]' in text
                assert f"{other} is done." in text
                peers_seen += 1
        assert_tool_pairs_intact(from_openai_messages(messages))
    assert peers_seen >= 6  # every call after the other Agent's first turn holds it
    doc = await engine.get_session("s-peers")
    stored = [m for m in doc.session.messages if m.role is Role.ASSISTANT and m.content]
    assert {(m.author.id if m.author else None, m.content) for m in stored} == {
        (name, f"{name} is done.") for name in PROMPTS
    }


def plain_script(body: dict[str, Any]) -> ScriptedResponse:
    """Each Agent answers at once (no tool call), a few sentences long."""
    system = body["messages"][0]["content"]
    agent = "researcher" if system.startswith(PROMPTS["researcher"]) else "writer"
    return ScriptedResponse(text=f"{agent} says: " + "it is mild and dry today. " * 4)


async def test_the_other_agents_turns_are_counted_with_the_budget() -> None:
    """Two Agents that answer at once, asked eight times in one session under a small
    budget: every call of both is within it as sent, the ``[<agent> wrote:]`` headers of the
    other Agent's answers included (each answer a message of its own, the most headers a
    request of its size can hold)."""
    budget = BudgetConfig(max_input_tokens=410, reserved_reply_tokens=100)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))
    estimator = TiktokenEstimator()
    with ScriptedOpenAIServer(plain_script) as server:
        pipeline = _pipeline(server, "s-peer-budget", tools=False)
        ce.haystack.install(engine)
        for turn in range(8):
            question = [ChatMessage.from_user(f"Weather in city number {turn}?")]
            pipeline.run({name: {"messages": question} for name in PROMPTS})
        requests = server.requests
    await engine.close()
    assert len(requests) == 16
    peers = 0
    for request in requests:
        parts = from_openai_messages(request["messages"])
        assert sum(estimator.estimate_part(p, "gpt-4o") for p in parts) <= 310
        peers += sum(" wrote:]" in p.content for p in parts)
    assert peers >= 20  # the other Agent's answers were there to count


def _texts(request: dict[str, Any], role: str) -> list[str]:
    return [str(m.get("content") or "") for m in request["messages"] if m["role"] == role]


@pytest.mark.parametrize("tools", [False, True])
async def test_one_question_handed_to_two_agents_is_asked_once(
    engine: ContextEngine, tools: bool
) -> None:
    """A pipeline's input handed to both of its Agents (each Agent's ``messages`` input gets
    the user's question) is one question of the session: stored once per run, and the Agent
    asked second gets it where it was asked, before the first Agent's turn, not asked again
    after it (each of its model calls, tool loop included, holds it once)."""
    with ScriptedOpenAIServer(script if tools else plain_script) as server:
        pipeline = _pipeline(server, "s-fan-out", tools=tools)
        ce.haystack.install(engine)
        for question in ("Weather in Oslo?", "And tomorrow?"):
            pipeline.run(
                {name: {"messages": [ChatMessage.from_user(question)]} for name in PROMPTS}
            )
        requests = server.requests
    assert len(requests) == (8 if tools else 4)
    for request in requests:
        asked = _texts(request, "user")
        assert asked.count("Weather in Oslo?") == 1, asked
        assert asked.count("And tomorrow?") <= 1, asked
        assert_tool_pairs_intact(from_openai_messages(request["messages"]))
    writer_first = next(r for r in requests if _texts(r, "system") == [PROMPTS["writer"]])
    assert [m["role"] for m in writer_first["messages"]][:2] == ["system", "user"]
    assert writer_first["messages"][1]["content"] == "Weather in Oslo?"
    assert writer_first["messages"][-1]["content"].startswith("[researcher wrote:]")
    doc = await engine.get_session("s-fan-out")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "Weather in Oslo?",
        "And tomorrow?",
    ]


async def test_an_agent_continuing_another_agents_messages_keeps_its_own_prompt(
    engine: ContextEngine,
) -> None:
    """The researcher's ``messages`` output connected to the writer's ``messages`` input:
    the writer's model calls get the writer's system prompt as their instruction, never the
    researcher's that came with the researcher's conversation (Haystack's Agent puts its own
    prompt first and the other Agent's after it); the researcher's turns reach the writer as
    the researcher's words and are stored once, by the researcher."""
    with ScriptedOpenAIServer(script) as server:
        pipeline = _pipeline(server, "s-chain")
        pipeline.connect("researcher.messages", "writer.messages")
        ce.haystack.install(engine)
        for question in ("Weather in Oslo?", "And tomorrow?"):
            pipeline.run({"researcher": {"messages": [ChatMessage.from_user(question)]}})
        requests = server.requests
    assert len(requests) == 8
    writers = [r for r in requests if PROMPTS["researcher"] not in json.dumps(r["messages"][0])]
    assert len(writers) == 4
    for request in writers:
        assert _texts(request, "system") == [PROMPTS["writer"]]
        assert PROMPTS["researcher"] not in json.dumps(request["messages"])
        calls = [c["id"] for m in request["messages"] for c in m.get("tool_calls") or ()]
        assert all(c.startswith("call_writer") for c in calls), calls
        assert any(t.startswith("[researcher wrote:]") for t in _texts(request, "user"))
        assert_tool_pairs_intact(from_openai_messages(request["messages"]))
    doc = await engine.get_session("s-chain")
    said = [
        (m.author.id if m.author else None, m.content, [c.tool_call_id for c in m.tool_calls or ()])
        for m in doc.session.messages
        if m.role is Role.ASSISTANT
    ]
    assert len(said) == 8  # a tool call and an answer per Agent and run, none stored twice
    for author, content, calls in said:
        assert author in PROMPTS
        assert all(c.startswith(f"call_{author}") for c in calls)
        assert not content or content == f"{author} is done."


async def test_an_agent_whose_peer_answered_while_it_ran_its_tool_reads_its_results_last(
    engine: ContextEngine,
) -> None:
    """Two Agents of one pipeline running at once: the researcher answers while the writer's
    tool runs (the tool waits until the researcher's answer is stored). The writer's next
    model call reads the researcher's turn before its own tool call and ends with its tool's
    result, so it answers that result: two model calls for each Agent, pairs intact."""
    session_id = "s-peer-during-tool"
    persisted = asyncio.Event()

    def on_persisted(event: Event) -> None:
        persisted.set()

    async def researcher_answered() -> None:
        while True:
            doc = await engine.get_session(session_id)
            if any(m.content == "researcher is done." for m in doc.session.messages):
                return
            persisted.clear()
            await persisted.wait()

    async def slow_lookup(q: str) -> str:
        await asyncio.wait_for(researcher_answered(), timeout=30)
        return f"result for {q}"

    slow = Tool(
        name="lookup",
        description=LOOKUP.description,
        parameters=LOOKUP.parameters,
        async_function=slow_lookup,
    )
    engine.events.on("Persisted", on_persisted)
    with ScriptedOpenAIServer(script) as server:
        pipeline = Pipeline(metadata={SESSION_KEY: session_id})
        for name, tool in (("researcher", LOOKUP), ("writer", slow)):
            agent = Agent(
                chat_generator=generator(server), tools=[tool], system_prompt=PROMPTS[name]
            )
            pipeline.add_component(name, agent)
        ce.haystack.install(engine)
        result = await pipeline.run_async(
            {name: {"messages": [ChatMessage.from_user("Weather in Oslo?")]} for name in PROMPTS}
        )
        requests = server.requests
    assert result["writer"]["last_message"].text == "writer is done."
    assert len(requests) == 4
    (writer_last,) = [
        r
        for r in requests
        if r["messages"][0]["content"].startswith(PROMPTS["writer"]) and len(r["messages"]) > 2
    ]
    messages = writer_last["messages"]
    assert [m["role"] for m in messages[-2:]] == ["assistant", "tool"]
    assert "result for writer" in messages[-1]["content"]
    peer = [m for m in messages if str(m.get("content") or "").startswith("[researcher wrote:]")]
    assert any("researcher is done." in m["content"] for m in peer)
    assert_tool_pairs_intact(from_openai_messages(messages))


async def test_one_question_handed_to_two_agents_running_at_once_is_asked_once(
    engine: ContextEngine,
) -> None:
    """``run_async`` runs both Agents at once: whichever the engine prepares first is asked
    the question; the other gets it from the session, once, in every model call."""
    with ScriptedOpenAIServer(script) as server:
        pipeline = _pipeline(server, "s-fan-out-async")
        ce.haystack.install(engine)
        for question in ("Weather in Oslo?", "And tomorrow?"):
            await pipeline.run_async(
                {name: {"messages": [ChatMessage.from_user(question)]} for name in PROMPTS}
            )
        requests = server.requests
    assert len(requests) == 8
    for request in requests:
        asked = _texts(request, "user")
        assert asked.count("Weather in Oslo?") == 1, asked
        assert asked.count("And tomorrow?") <= 1, asked
        assert_tool_pairs_intact(from_openai_messages(request["messages"]))
    doc = await engine.get_session("s-fan-out-async")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "Weather in Oslo?",
        "And tomorrow?",
    ]
