"""Resets on the real AutoGen (``agent.on_reset``, ``team.reset()``: AutoGen's way to start a
new task with the same objects): the session of the object's last run is cleared, so the
next run's model calls receive only the new conversation (with a named session and with
``install(session_id=...)``); a team's reset clears the team's session once; a reset clears
only the session its object used (three users at once, one resets; an agent run as an
``AgentTool``); a ``SocietyOfMindAgent``'s inner team, which AutoGen resets after every
answer, clears its own turn's scope, never the outer conversation, and the agent's own reset
(run on its own) clears its session; ``save_state`` /
``load_state`` around a reset send what plain AutoGen sends; an engine failure never breaks
the app's reset."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat, Swarm
from autogen_apps import (
    SOM_SYSTEMS,
    STORY,
    client,
    expert_and_planner,
    society_of_mind,
    som_app,
    som_script,
    wire,
)
from autogen_core import CancellationToken

import ce.autogen
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.integration import suppressed
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, no_blocking

SYSTEMS = {"alice": "You are Alice, the researcher.", "bob": "You are Bob, the critic."}
FIRST = "Plan a trip to Oslo."
SECOND = "Plan a trip to Rome."


def _speaker(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"] or ""
    return next((name for name, system in SYSTEMS.items() if system in first), "other")


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if "role play game" in (body["messages"][0]["content"] or ""):  # a selector's prompt
        return ScriptedResponse(text="alice")
    asked = str(body["messages"][-1].get("content") or "").split()[-1]
    return ScriptedResponse(text=f"{_speaker(body)}-on-{asked}")


def _clears(engine: ContextEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sessions ``engine.clear_history`` is called for, in order."""
    calls: list[str] = []
    original = engine.clear_history

    async def clear_history(session_id: str) -> Any:
        calls.append(session_id)
        return await original(session_id)

    monkeypatch.setattr(engine, "clear_history", clear_history)
    return calls


@asynccontextmanager
async def _named(engine: ContextEngine, how: str, session_id: str) -> AsyncIterator[None]:
    """The plugin installed, its runs in ``session_id``: named by ``engine.session`` around
    them, or by ``install(session_id=...)``."""
    if how == "install":
        ce.autogen.install(engine, session_id=session_id)
        yield
        return
    ce.autogen.install(engine)
    with engine.session(session_id):
        yield


def _user_texts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


@pytest.mark.parametrize("how", ["session", "install"])
async def test_an_agents_reset_starts_the_sessions_conversation_over(
    how: str, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clears = _clears(engine, monkeypatch)
    with ScriptedOpenAIServer(_script) as server:
        agent = AssistantAgent("alice", model_client=client(server), system_message="Be brief.")
        async with _named(engine, how, "user-1"):
            with no_blocking(engine) as blocking:
                await agent.run(task=FIRST)
                await agent.on_reset(CancellationToken())
                await agent.on_reset(CancellationToken())  # no run since: nothing to clear
                await agent.run(task=SECOND)
        requests = server.requests
    assert blocking.used == []
    assert len(requests) == 2
    last = requests[1]["messages"]
    assert [m["role"] for m in last] == ["system", "user"]
    assert last[0]["content"].startswith("Be brief.")
    assert last[1]["content"] == SECOND
    assert "Oslo" not in wire(requests[1])
    doc = await engine.get_session("user-1")  # the messages stay stored
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [FIRST, SECOND]
    assert clears == ["user-1"]  # the second reset, with no run since, clears nothing


def _team(kind: str, server: ScriptedOpenAIServer) -> Any:
    alice, bob = (
        AssistantAgent(name, model_client=client(server), system_message=SYSTEMS[name])
        for name in ("alice", "bob")
    )
    done = MaxMessageTermination(3)
    if kind == "selector":
        return SelectorGroupChat(
            [alice, bob], model_client=client(server), termination_condition=done
        )
    if kind == "swarm":
        return Swarm([alice, bob], termination_condition=MaxMessageTermination(2))
    return RoundRobinGroupChat([alice, bob], termination_condition=done)


@pytest.mark.parametrize(
    ("kind", "how"),
    [
        ("round_robin", "session"),
        ("round_robin", "install"),
        ("selector", "session"),
        ("swarm", "session"),
    ],
)
async def test_a_teams_reset_clears_the_team_session_once(
    kind: str, how: str, engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``team.reset()`` resets every agent too (their own resets clear nothing: the team's
    agents share its session); no message of the first task reaches a later request."""
    clears = _clears(engine, monkeypatch)
    with ScriptedOpenAIServer(_script) as server:
        team = _team(kind, server)
        async with _named(engine, how, "s-team"):
            await team.run(task=FIRST)
            before = len(server.requests)
            await team.reset()
            await team.run(task=SECOND)
        requests = server.requests
    later = [r for r in requests[before:] if _speaker(r) != "other"]
    assert later
    for request in later:
        text = wire(request)
        assert "Oslo" not in text and "-on-Oslo" not in text, text
        assert _user_texts(request)[0] == SECOND
    doc = await engine.get_session("s-team")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [FIRST, SECOND]
    assert clears == ["s-team"]


async def test_a_target_resets_clear_only_what_the_plugin_records(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``install(target=agent)``: a team with that agent records into the team's session, so
    the team's reset clears it; a team without it, and an agent not targeted, record nothing
    and clear nothing."""
    clears = _clears(engine, monkeypatch)
    with ScriptedOpenAIServer(_script) as server:
        team, other = _team("round_robin", server), _team("round_robin", server)
        loner = AssistantAgent("loner", model_client=client(server))
        ce.autogen.install(engine, target=team._participants[0])
        with engine.session("s-target"):
            for runner in (team, other, loner):
                await runner.run(task=FIRST)
            await loner.on_reset(CancellationToken())
            await other.reset()
            await team.reset()
            before = len(server.requests)
            await team.run(task=SECOND)
        later = server.requests[before:]
    assert [_speaker(r) for r in later] == ["alice", "bob"]
    assert not any("Oslo" in wire(r) for r in later)
    assert clears == ["s-target"]


async def test_three_users_at_once_one_resets(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three users, each with their own agent and session, two turns each under
    ``asyncio.gather``; alpha resets between its turns: alpha's second request holds only its
    new words, bravo's and charlie's still hold their first turn."""
    clears = _clears(engine, monkeypatch)

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text=f"noted: {body['messages'][-1]['content'].split()[0]}")

    with ScriptedOpenAIServer(echo) as server:
        ce.autogen.install(engine)

        async def user(name: str) -> None:
            agent = AssistantAgent(f"agent_{name}", model_client=client(server))
            with engine.session(f"u-{name}"):
                await agent.run(task=f"{name}word0 from {name}")
                if name == "alpha":
                    await agent.on_reset(CancellationToken())
                await asyncio.sleep(0)
                await agent.run(task=f"{name}word1 from {name}")

        await asyncio.gather(user("alpha"), user("bravo"), user("charlie"))
        requests = server.requests
    second = {
        name: next(r for r in requests if f"{name}word1" in wire(r))
        for name in ("alpha", "bravo", "charlie")
    }
    assert _user_texts(second["alpha"]) == ["alphaword1 from alpha"]
    for name in ("bravo", "charlie"):
        assert _user_texts(second[name]) == [f"{name}word0 from {name}", f"{name}word1 from {name}"]
        assert "noted: " + f"{name}word0" in wire(second[name])
    assert clears == ["u-alpha"]


async def test_an_agent_tools_reset_clears_its_child_scope_only(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent run as an ``AgentTool`` records into the tool call's child scope: its reset
    clears that scope; the outer agent's next turn still receives the outer conversation.
    An agent that never ran clears nothing."""
    clears = _clears(engine, monkeypatch)
    inner_system = "You are the inner expert."

    def script(body: dict[str, Any]) -> ScriptedResponse:
        messages = body["messages"]
        if inner_system in messages[0]["content"]:
            return ScriptedResponse(text="inner-answer")
        if messages[-1]["role"] == "tool":
            return ScriptedResponse(text="outer-answer")
        if messages[-1]["content"] == "first":
            return ScriptedResponse(tool_calls=[("call_sub", "expert", '{"task": "inner q"}')])
        return ScriptedResponse(text="plain-answer")

    with ScriptedOpenAIServer(script) as server:
        expert, outer = expert_and_planner(server, inner_system)
        idle = AssistantAgent("idle", model_client=client(server))
        ce.autogen.install(engine)
        with engine.session("s-outer"):
            await outer.run(task="first")
            await idle.on_reset(CancellationToken())
            await expert.on_reset(CancellationToken())
            await outer.run(task="second")
        requests = server.requests
    assert clears == ["s-outer/call_sub"]
    assert _user_texts(requests[-1]) == ["first", "second"]
    assert "outer-answer" in wire(requests[-1])


async def test_a_reset_inside_suppressed_clears_nothing(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clears = _clears(engine, monkeypatch)
    with ScriptedOpenAIServer(_script) as server:
        agent = AssistantAgent("alice", model_client=client(server))
        team = _team("round_robin", server)
        ce.autogen.install(engine)
        with engine.session("s-quiet"):
            await agent.run(task=FIRST)
            await team.run(task=FIRST)
            with suppressed():
                await agent.on_reset(CancellationToken())
                await team.reset()
    assert clears == []
    assert await agent.model_context.get_messages() == []


def _view(request: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    return [
        (m["role"], m.get("name"), m.get("content") or "")
        for m in request["messages"]
        if m["role"] != "system"
    ]


async def test_society_of_mind_inner_resets_clear_only_their_own_turn(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AutoGen resets a ``SocietyOfMindAgent``'s inner team after every answer: that clears
    the scope of the turn's inner run, never the outer conversation (every request is plain
    AutoGen's); a new process continuing the named session (whose turns count from
    ``<name>`` again) gives the inner team none of the earlier process's inner
    conversation."""
    with ScriptedOpenAIServer(som_script) as server:
        await som_app(server)
        plain = server.requests
    clears = _clears(engine, monkeypatch)
    with ScriptedOpenAIServer(som_script) as server:
        ce.autogen.install(engine)
        with engine.session("story"):
            await som_app(server)
        ce.autogen.uninstall()
        requests = server.requests
        assert [_view(r) for r in requests] == [_view(r) for r in plain]
        outer = (await engine.get_session("story")).session.messages
        assert [m.content for m in outer if m.role is Role.USER] == [STORY]

        later = ContextEngine(engine.store, config=RuntimeConfig(model_hint="gpt-4o"))
        ce.autogen.install(later)
        with later.session("story"):
            await som_app(server)
        fresh = server.requests[len(requests) :]
    inner = [r for r in fresh if SOM_SYSTEMS["writer"] in (r["messages"][0]["content"] or "")]
    # the first turn's writer gets the task once, nothing of the earlier process's turn
    assert _view(inner[0]) == [("user", "user", STORY)]
    assert clears == ["story/society_of_mind", "story/society_of_mind~2"]  # never "story"
    await later.close()


async def test_a_standalone_society_of_mind_agents_reset_clears_its_session(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``SocietyOfMindAgent`` run on its own records its turns in the named session; its
    reset clears that session (after the inner turn's own scope), so an agent that takes up
    the session next receives only its own task."""

    clears = _clears(engine, monkeypatch)
    with ScriptedOpenAIServer(som_script) as server:
        ce.autogen.install(engine)
        som = society_of_mind(server)
        translator = AssistantAgent(
            "translator", model_client=client(server), system_message=SOM_SYSTEMS["translator"]
        )
        with engine.session("som-s"):
            await som.run(task=STORY)
            await som.on_reset(CancellationToken())
            await translator.run(task=SECOND)
        requests = server.requests
    assert clears == ["som-s/society_of_mind", "som-s"]
    assert _view(requests[-1]) == [("user", "user", SECOND)]


def _alice(kind: str, server: ScriptedOpenAIServer) -> Any:
    """Alice alone (``kind == "agent"``) or as a team of one (``"team"``)."""
    agent = AssistantAgent("alice", model_client=client(server), system_message=SYSTEMS["alice"])
    if kind == "agent":
        return agent
    return RoundRobinGroupChat([agent], termination_condition=MaxMessageTermination(2))


@pytest.mark.parametrize("kind", ["agent", "team"])
async def test_a_state_saved_after_a_reset_resumes_in_the_same_session(
    kind: str, engine: ContextEngine
) -> None:
    """A first task, a reset (of the agent, of the team), a second task, its state saved and
    loaded into a new object (a new process resuming the conversation), a third task: each
    request is the one plain AutoGen sends (the resumed one holds the second task and its
    reply, nothing of the first)."""

    async def app(server: ScriptedOpenAIServer) -> None:
        first = _alice(kind, server)
        await first.run(task=FIRST)
        if kind == "team":
            await first.reset()
        else:
            await first.on_reset(CancellationToken())
        await first.run(task=SECOND)
        state = await first.save_state()
        resumed = _alice(kind, server)
        await resumed.load_state(state)
        await resumed.run(task="Plan a trip to Bergen.")

    with ScriptedOpenAIServer(_script) as server:
        await app(server)
        plain = server.requests
    with ScriptedOpenAIServer(_script) as server:
        ce.autogen.install(engine)
        with engine.session("s-state"):
            await app(server)
        requests = server.requests
    assert len(requests) == 3
    assert [_view(r) for r in requests] == [_view(r) for r in plain]
    assert _user_texts(requests[2]) == [SECOND, "Plan a trip to Bergen."]
    assert "Oslo" not in wire(requests[2])


async def test_a_failing_clear_never_breaks_the_reset(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine fails to clear: AutoGen's reset completes all the same, and the failure is
    counted and reported as a ``Degraded`` event."""

    async def broken(session_id: str) -> Any:
        raise RuntimeError("clear_history failed on purpose")

    events: list[Any] = []
    engine.events.on("Degraded", events.append)
    with ScriptedOpenAIServer(_script) as server:
        agent = AssistantAgent("alice", model_client=client(server))
        plugin = ce.autogen.install(engine)
        with engine.session("s-broken"):
            await agent.run(task=FIRST)
            monkeypatch.setattr(engine, "clear_history", broken)
            failures = plugin.failures["integration_failed"]
            await agent.on_reset(CancellationToken())
        assert await agent.model_context.get_messages() == []
    assert plugin.failures["integration_failed"] == failures + 1
    assert [e.session_id for e in events if "on purpose" in e.payload.get("detail", "")] == [
        "s-broken"
    ]


@pytest.mark.parametrize("kind", ["agent", "team"])
async def test_a_state_saved_before_a_reset_and_loaded_after_it_is_sent_again(
    kind: str, engine: ContextEngine
) -> None:
    """A first task, its state saved, a reset, the state loaded back into the same object
    and a second task, all in one session: the second task's request holds the restored
    conversation, as plain AutoGen sends it (what the app passes after a clear is new)."""

    async def app(server: ScriptedOpenAIServer) -> None:
        runs = _alice(kind, server)
        await runs.run(task=FIRST)
        state = await runs.save_state()
        if kind == "team":
            await runs.reset()
        else:
            await runs.on_reset(CancellationToken())
        await runs.load_state(state)
        await runs.run(task=SECOND)

    with ScriptedOpenAIServer(_script) as server:
        await app(server)
        plain = server.requests
    with ScriptedOpenAIServer(_script) as server:
        ce.autogen.install(engine)
        with engine.session("s-restored"):
            await app(server)
        requests = server.requests
    assert [_view(r) for r in requests] == [_view(r) for r in plain]
    assert _user_texts(requests[1]) == [FIRST, SECOND]
