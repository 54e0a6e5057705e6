"""Several Agents in one Pipeline run share its session: every model call of each Agent's
tool loop starts with that Agent's own system prompt, keeps its tool pairs intact and has
the newest user input; each Agent's messages are stored with the Agent (its component name)
as author."""

from __future__ import annotations

import json
from typing import Any

from haystack import Pipeline
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from hs_apps import LOOKUP, generator

import ce.haystack
from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
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
