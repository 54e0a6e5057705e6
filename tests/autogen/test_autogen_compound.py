"""Agents built from other agents, on the real AutoGen, each compared with plain AutoGen's
requests (system text aside: each call's instruction is the engine's): a
``SocietyOfMindAgent``'s inner team runs nested in each of its turns (a child session per
turn, never the outer conversation), and run on its own its turns are its session's; an
agent a ``MessageFilterAgent`` wraps in a ``GraphFlow`` is the team's agent and receives only
what its filter lets through; a structured reply (``output_content_type``) reaches a peer
once and is stored once."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from autogen_agentchat.agents import (
    AssistantAgent,
    MessageFilterAgent,
    MessageFilterConfig,
    PerSourceFilter,
)
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import StructuredMessage
from autogen_agentchat.teams import DiGraphBuilder, GraphFlow, RoundRobinGroupChat
from autogen_apps import STORY, client, society_of_mind, som_app, som_script
from pydantic import BaseModel

import ce.autogen
from ce.core.engine import ContextEngine
from ce.core.schema import AuthorKind, Message, Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

App = Callable[[ScriptedOpenAIServer], Awaitable[Any]]


def _view(request: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    """A request's messages but its system messages: role, name, text."""
    return [
        (m["role"], m.get("name"), m.get("content") or "")
        for m in request["messages"]
        if m["role"] != "system"
    ]


async def _both(
    script: Callable[[dict[str, Any]], ScriptedResponse],
    app: App,
    engine: ContextEngine,
    session: str | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests of ``app`` without the plugin, then with it (in ``session`` when
    given)."""
    with ScriptedOpenAIServer(script) as server:
        await app(server)
        plain = server.requests
    with ScriptedOpenAIServer(script) as server:
        ce.autogen.install(engine)
        if session is None:
            await app(server)
        else:
            with engine.session(session):
                await app(server)
        ce.autogen.uninstall()
        return plain, server.requests


def _texts(messages: list[Message]) -> list[tuple[str, str | None, str]]:
    """The session's messages but its system messages: role, author, text."""
    return [
        (m.role.value, m.author.id if m.author else None, m.content)
        for m in messages
        if m.role is not Role.SYSTEM
    ]


# -- SocietyOfMindAgent -------------------------------------------------------------------


async def test_society_of_mind_inner_team_runs_nested_in_each_turn(
    engine: ContextEngine,
) -> None:
    plain, requests = await _both(som_script, som_app, engine, "story")
    assert len(requests) == len(plain) == 8  # two turns: writer, editor, summary, translator
    assert [_view(r) for r in requests] == [_view(r) for r in plain]
    translator = _view(requests[3])
    assert translator == [("user", "user", STORY), ("user", "society_of_mind", "som-says-4")]

    outer = (await engine.get_session("story")).session.messages
    assert _texts(outer) == [
        ("user", "user", STORY),
        ("assistant", "society_of_mind", "som-says-4"),
        ("assistant", "translator", "translator-says-3"),
        ("assistant", "society_of_mind", "som-says-4"),
        ("assistant", "translator", "translator-says-5"),
    ]
    first = (await engine.get_session("story/society_of_mind")).session.messages
    assert _texts(first) == [
        ("user", "user", STORY),
        ("assistant", "writer", "writer-says-2"),
        ("assistant", "editor", "APPROVE (editor saw 3)"),
    ]
    second = (await engine.get_session("story/society_of_mind~2")).session.messages
    assert [t for t in _texts(second) if t[0] == "assistant"] == [
        ("assistant", "writer", "writer-says-4"),
        ("assistant", "editor", "APPROVE (editor saw 5)"),
    ]


TOPICS = ("topic one", "topic two")


async def _som_alone_app(server: ScriptedOpenAIServer) -> None:
    """A ``SocietyOfMindAgent`` (a writer and an editor inside) run on its own, one task
    after another."""
    som = society_of_mind(server)
    for topic in TOPICS:
        await som.run(task=topic)


async def test_a_standalone_society_of_mind_agents_turns_are_its_sessions(
    engine: ContextEngine,
) -> None:
    """Run on its own in a named session, the agent's conversation with the app (each task
    and the agent's answer, by the agent) is that session's; the inner team's runs stay in
    their child scopes, and every request is plain AutoGen's."""
    plain, requests = await _both(som_script, _som_alone_app, engine, "som-s")
    assert [_view(r) for r in requests] == [_view(r) for r in plain]
    assert len(requests) == 6  # two turns: writer, editor, summary

    stored = (await engine.get_session("som-s")).session.messages
    assert _texts(stored) == [
        ("user", "user", TOPICS[0]),
        ("assistant", "society_of_mind", "som-says-4"),
        ("user", "user", TOPICS[1]),
        ("assistant", "society_of_mind", "som-says-4"),
    ]
    assert [m.author.kind for m in stored if m.author] == [
        AuthorKind.USER,
        AuthorKind.AGENT,
        AuthorKind.USER,
        AuthorKind.AGENT,
    ]
    first = (await engine.get_session("som-s/society_of_mind")).session.messages
    assert [t for t in _texts(first) if t[0] == "assistant"] == [
        ("assistant", "writer", "writer-says-2"),
        ("assistant", "editor", "APPROVE (editor saw 3)"),
    ]
    assert sorted(await engine.list_sessions()) == [
        "som-s",
        "som-s/society_of_mind",
        "som-s/society_of_mind~2",
    ]


# -- GraphFlow with MessageFilterAgent ----------------------------------------------------

FLOW_SYSTEMS = {
    "generator": "You generate ideas.",
    "reviewer": "You review ideas.",
    "summarizer": "You summarize.",
}
BRIEF = "Brainstorm a product name."


def _flow_script(body: dict[str, Any]) -> ScriptedResponse:
    first = body["messages"][0]["content"] or ""
    speaker = next(k for k, v in FLOW_SYSTEMS.items() if v in first)
    return ScriptedResponse(text=f"{speaker}-says-{len(body['messages'])}")


async def _flow_app(server: ScriptedOpenAIServer) -> None:
    def agent(name: str, *sources: tuple[str, str]) -> MessageFilterAgent:
        inner = AssistantAgent(name, model_client=client(server), system_message=FLOW_SYSTEMS[name])
        config = MessageFilterConfig(
            per_source=[PerSourceFilter(source=s, position=p, count=1) for s, p in sources]
        )
        return MessageFilterAgent(name, inner, config)

    generator = agent("generator", ("user", "first"))
    reviewer = agent("reviewer", ("generator", "last"))
    summarizer = agent("summarizer", ("user", "first"), ("reviewer", "last"))
    builder = DiGraphBuilder()
    builder.add_node(generator).add_node(reviewer).add_node(summarizer)
    builder.add_edge(generator, reviewer).add_edge(reviewer, summarizer)
    flow = GraphFlow(participants=builder.get_participants(), graph=builder.build())
    await flow.run(task=BRIEF)


async def test_filtered_agents_are_the_teams_and_receive_only_what_passes_the_filter(
    engine: ContextEngine,
) -> None:
    plain, requests = await _both(_flow_script, _flow_app, engine, "s-graph")
    assert [_view(r) for r in requests] == [_view(r) for r in plain]
    assert _view(requests[1]) == [("user", "generator", "generator-says-2")]
    stored = (await engine.get_session("s-graph")).session.messages
    assert _texts(stored) == [
        ("user", "user", BRIEF),
        ("assistant", "generator", "generator-says-2"),
        ("assistant", "reviewer", "reviewer-says-2"),
        ("assistant", "summarizer", "summarizer-says-3"),
    ]


async def test_filtered_agents_run_in_the_team_runs_one_session(engine: ContextEngine) -> None:
    plain, requests = await _both(_flow_script, _flow_app, engine, None)
    assert [_view(r) for r in requests] == [_view(r) for r in plain]
    (session,) = await engine.list_sessions()
    assert session.startswith("run:")
    stored = (await engine.get_session(session)).session.messages
    assert [a for _, a, _ in _texts(stored)] == ["user", "generator", "reviewer", "summarizer"]


# -- structured output in a team ----------------------------------------------------------


class Verdict(BaseModel):
    verdict: str
    score: int


JUDGES = {"alice": "You are Alice.", "bob": "You are Bob."}


def _judge_script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    speaker = next(k for k, v in JUDGES.items() if v in (messages[0]["content"] or ""))
    if body.get("response_format"):  # as a model writes JSON: not pydantic's compact form
        verdict = {"verdict": f"{speaker}-ok-{len(messages)}", "score": len(messages)}
        return ScriptedResponse(text=json.dumps(verdict))
    return ScriptedResponse(text=f"{speaker}-says-{len(messages)}")


async def _judge_app(server: ScriptedOpenAIServer) -> None:
    alice = AssistantAgent(
        "alice",
        model_client=client(server),
        system_message=JUDGES["alice"],
        output_content_type=Verdict,
    )
    bob = AssistantAgent("bob", model_client=client(server), system_message=JUDGES["bob"])
    team = RoundRobinGroupChat(
        [alice, bob],
        termination_condition=MaxMessageTermination(5),
        custom_message_types=[StructuredMessage[Verdict]],
    )
    await team.run(task="judge this")


async def test_structured_reply_reaches_a_peer_once_and_is_stored_once(
    engine: ContextEngine,
) -> None:
    plain, requests = await _both(_judge_script, _judge_app, engine, "s-judge")
    assert len(requests) == len(plain) == 4
    assert [_view(r) for r in requests] == [_view(r) for r in plain]
    assert _view(requests[1]) == [
        ("user", "user", "judge this"),
        ("user", "alice", '{"verdict":"alice-ok-2","score":2}'),  # AutoGen's compact JSON
    ]
    stored = (await engine.get_session("s-judge")).session.messages
    assert _texts(stored) == [
        ("user", "user", "judge this"),
        ("assistant", "alice", '{"verdict": "alice-ok-2", "score": 2}'),
        ("assistant", "bob", "bob-says-3"),
        ("assistant", "alice", '{"verdict": "alice-ok-4", "score": 4}'),
        ("assistant", "bob", "bob-says-5"),
    ]
