"""Teams on the real AutoGen: a team's agents share the team run's session, each call starts
with its own agent's system message, a peer's reply reaches an agent as a user message named
after the peer (never as the agent's own assistant turn) and is stored once with the peer as
author; an agent's own tool-call summary or handoff message never comes back to it (each
request is the one plain AutoGen sends), also after a resume in a new process; a handoff's
context (a part of its author's reply) reaches the peers as in AutoGen and is stored once, as
that reply; a SelectorGroupChat's speaker-selection prompts are recorded, never rewritten; a
model call nested in a tool call (an AgentTool) goes to a child scope."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat, Swarm
from autogen_agentchat.tools import AgentTool
from autogen_apps import client, expert_and_planner, outer_agent, wire

import ce.autogen
import ce.autogen._convert as convert
import ce.autogen._inject as inject
import ce.autogen._patch as patch
from ce.autogen._record import HandedParts
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.schema import AuthorKind, Message, ModelUsageStage, Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.testing.assertions import assert_tool_pairs_intact, unfenced

MARK = "NOTEBOOK-MARK-TEAM"
SYSTEMS = {"alice": "You are Alice, the researcher.", "bob": "You are Bob, the critic."}
TASK = "Plan a trip to Oslo."
SELECTOR_CANARY = "sel.canary@example.com"


def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _speaker(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"]
    return next(name for name, system in SYSTEMS.items() if system in first)


def _turn(body: dict[str, Any]) -> int:
    """How many replies the speaking agent has given in this request (its own turns)."""
    return sum(1 for m in body["messages"] if m["role"] == "assistant" and m.get("content"))


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if "role play game" in body["messages"][0]["content"]:  # the selector's prompt
        asked = body["messages"][0]["content"]
        return ScriptedResponse(text="bob" if "alice-says" in asked else "alice")
    speaker = _speaker(body)
    last = body["messages"][-1]
    if speaker == "alice" and last["role"] != "tool" and _turn(body) == 0:
        return ScriptedResponse(tool_calls=[("call_a1", "weather", json.dumps({"city": "Oslo"}))])
    return ScriptedResponse(text=f"{speaker}-says-{len(body['messages'])}")


def _agents(server: ScriptedOpenAIServer) -> list[AssistantAgent]:
    return [
        AssistantAgent(
            "alice",
            model_client=client(server),
            tools=[weather],
            system_message=SYSTEMS["alice"],
            reflect_on_tool_use=True,
        ),
        AssistantAgent("bob", model_client=client(server), system_message=SYSTEMS["bob"]),
    ]


async def test_round_robin_agents_share_the_session_each_with_its_own_view(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        team = RoundRobinGroupChat(_agents(server), termination_condition=MaxMessageTermination(4))
        ce.autogen.install(engine)
        await engine.update_notebook("s-team", MARK)
        with engine.session("s-team"):
            result = await team.run(task=TASK)
        requests = server.requests
    chat = [m for m in result.messages if isinstance(m, BaseChatMessage)]
    replies = [m.content for m in chat if m.source in SYSTEMS]
    assert [m.source for m in chat] == ["user", "alice", "bob", "alice"]
    assert len(requests) == 4  # alice: tool call + reflection; bob; alice
    for request in requests:
        speaker = _speaker(request)
        messages = request["messages"]
        assert messages[0]["role"] == "system"
        assert messages[0]["content"].startswith(SYSTEMS[speaker])
        assert MARK in messages[0]["content"]
        other = next(name for name in SYSTEMS if name != speaker)
        assert SYSTEMS[other] not in wire(request)
        assert next(m["content"] for m in messages if m["role"] == "user") == TASK
        assert_tool_pairs_intact(from_openai_messages(messages))
        for message in messages[1:]:
            text = message.get("content") or ""
            if message["role"] == "assistant":
                assert text == "" or text.startswith(f"{speaker}-says"), (speaker, message)
            if message["role"] == "user" and text.startswith(f"{other}-says"):
                assert message.get("name") == other
    bob = requests[2]["messages"]
    assert [(m["role"], m.get("name")) for m in bob[1:]] == [
        ("user", "user"),
        ("user", "alice"),
    ]  # alice's tool call is hers: AutoGen never shows it to bob, nor does the engine
    alice_again = requests[3]["messages"]
    assert ("user", "bob", replies[1]) in [
        (m["role"], m.get("name"), m.get("content")) for m in alice_again
    ]
    assert ("assistant", replies[0]) in [(m["role"], m.get("content")) for m in alice_again]

    doc = await engine.get_session("s-team")
    stored = doc.session.messages
    assert [m.content for m in stored if m.role is Role.USER] == [TASK]
    for reply, author in zip(replies, ["alice", "bob", "alice"], strict=True):
        (copy,) = [m for m in stored if m.content == reply]
        assert copy.role is Role.ASSISTANT
        assert copy.author is not None
        assert (copy.author.kind, copy.author.id) == (AuthorKind.AGENT, author)
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.tool, run.status.value) == ("call_a1", "weather", "success")
    assert len(doc.session.model_usage) == len(requests)


async def test_selector_prompts_are_recorded_and_never_rewritten_only_redacted(
    engine: ContextEngine,
) -> None:
    async def run(install: bool) -> tuple[list[dict[str, Any]], Any]:
        with ScriptedOpenAIServer(_script) as server:
            team = SelectorGroupChat(
                _agents(server),
                model_client=client(server),
                termination_condition=MaxMessageTermination(3),
            )
            if install:
                ce.autogen.install(engine)
                await engine.update_notebook("s-sel", MARK)
            with engine.session("s-sel"):
                result = await team.run(task=f"{TASK} Mail {SELECTOR_CANARY}.")
            return server.requests, result

    plain, _ = await run(install=False)
    requests, result = await run(install=True)
    selections = [r for r in requests if "role play game" in r["messages"][0]["content"]]
    own = [r for r in plain if "role play game" in r["messages"][0]["content"]]
    # with two agents and no repeated speaker only the first turn needs the model
    assert len(selections) == len(own) == 1
    # the selector's prompt goes as AutoGen wrote it (it is parsed for a name), only redacted
    # (it quotes the conversation)
    for sent, untouched in zip(selections, own, strict=True):
        assert MARK not in wire(sent)
        assert len(sent["messages"]) == len(untouched["messages"]) == 1
        assert SELECTOR_CANARY in untouched["messages"][0]["content"]
        assert sent["messages"][0]["content"] == untouched["messages"][0]["content"].replace(
            SELECTOR_CANARY, "[REDACTED:email]"
        )
    assert not any(SELECTOR_CANARY in wire(r) for r in requests)
    agents = [r for r in requests if r not in selections]
    assert agents and all(MARK in r["messages"][0]["content"] for r in agents)
    chat = [m for m in result.messages if isinstance(m, BaseChatMessage)]
    assert [m.source for m in chat] == ["user", "alice", "bob"]
    doc = await engine.get_session("s-sel")
    routes = [u for u in doc.session.model_usage if u.stage is ModelUsageStage.ROUTE]
    assert len(routes) == len(selections)
    assert all((u.prompt_tokens, u.completion_tokens) == (10, 5) for u in routes)
    assert not [m for m in doc.session.messages if m.content in ("alice", "bob")]


async def test_swarm_handoff_keeps_each_agents_own_system_message_first(
    engine: ContextEngine,
) -> None:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        speaker = _speaker(body)
        if speaker == "alice" and body["messages"][-1]["role"] != "tool":
            return ScriptedResponse(tool_calls=[("call_h", "transfer_to_bob", "{}")])
        return ScriptedResponse(text=f"{speaker}-done")

    with ScriptedOpenAIServer(script) as server:
        alice = AssistantAgent(
            "alice", model_client=client(server), system_message=SYSTEMS["alice"], handoffs=["bob"]
        )
        bob = AssistantAgent("bob", model_client=client(server), system_message=SYSTEMS["bob"])
        team = Swarm([alice, bob], termination_condition=MaxMessageTermination(3))
        ce.autogen.install(engine)
        with engine.session("s-swarm"):
            result = await team.run(task=TASK)
        requests = server.requests
    assert result.messages[-1].content == "bob-done"
    assert [_speaker(r) for r in requests] == ["alice", "bob"]
    for request in requests:
        assert request["messages"][0]["content"].startswith(SYSTEMS[_speaker(request)])
        assert_tool_pairs_intact(from_openai_messages(request["messages"]))
    doc = await engine.get_session("s-swarm")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [TASK]
    (handoff,) = doc.session.tool_state.tool_calls
    assert handoff.tool_call_id == "call_h"


async def test_a_sub_agent_in_a_tool_call_runs_in_a_child_scope(engine: ContextEngine) -> None:
    inner_system = "You are the inner expert."
    outer_system = "You are the outer planner."

    def script(body: dict[str, Any]) -> ScriptedResponse:
        first = body["messages"][0]["content"]
        if inner_system in first:
            return ScriptedResponse(text="inner-answer")
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="outer-answer")
        args = json.dumps({"task": "inner question"})
        return ScriptedResponse(tool_calls=[("call_sub", "expert", args)])

    with ScriptedOpenAIServer(script) as server:
        _, outer = expert_and_planner(server, inner_system, outer_system)
        ce.autogen.install(engine)
        await engine.update_notebook("s-outer", MARK)
        with engine.session("s-outer"):
            result = await outer.run(task="outer question with a secret plan")
        requests = server.requests
    assert result.messages[-1].content == "outer-answer"
    (inner,) = [r for r in requests if inner_system in r["messages"][0]["content"]]
    assert "outer question" not in wire(inner) and MARK not in wire(inner)
    assert outer_system not in wire(inner)
    assert inner["messages"][-1]["content"] == "inner question"
    last = requests[-1]["messages"]
    assert last[0]["content"].startswith(outer_system)
    assert last[-1]["role"] == "tool" and last[-1]["tool_call_id"] == "call_sub"
    outer_doc = await engine.get_session("s-outer")
    assert "inner question" not in [m.content for m in outer_doc.session.messages]
    child = await engine.get_session("s-outer/call_sub")
    assert [m.content for m in child.session.messages if m.role is Role.USER] == ["inner question"]
    assert [m.content for m in child.session.messages if m.role is Role.ASSISTANT] == [
        "inner-answer"
    ]


async def test_a_sync_tool_body_keeps_the_session_and_nests_its_runs(
    engine: ContextEngine,
) -> None:
    """AutoGen runs a sync tool's body in an executor thread, which does not get the caller's
    context variables; inside an instrumented tool call the body runs in a copy of the
    caller's context: ``engine.session`` is still the run's, and an agent the body runs (on a
    loop of its own) is nested in the tool call."""
    inner_system = "You are the sync helper."
    seen: list[str | None] = []

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if inner_system in body["messages"][0]["content"]:
            return ScriptedResponse(text="helper-answer")
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="outer-answer")
        return ScriptedResponse(tool_calls=[("call_sync", "ask_helper", '{"question": "q1"}')])

    with ScriptedOpenAIServer(script) as server:

        def ask_helper(question: str) -> str:
            """Ask the helper (a sync tool running an agent on a loop of its own)."""
            from ce.core.engine import current_session_id

            seen.append(current_session_id())
            helper = AssistantAgent(
                "helper", model_client=client(server), system_message=inner_system
            )
            result = asyncio.run(helper.run(task=f"helper {question}"))
            return str(result.messages[-1].content)

        outer = outer_agent(server, ask_helper)
        ce.autogen.install(engine)
        with engine.session("s-sync-tool"):
            result = await outer.run(task="outer words")
        requests = server.requests
    assert result.messages[-1].content == "outer-answer"
    assert seen == ["s-sync-tool"]
    (inner,) = [r for r in requests if inner_system in r["messages"][0]["content"]]
    assert "outer words" not in wire(inner)
    child = await engine.get_session("s-sync-tool/call_sync")
    assert [m.content for m in child.session.messages if m.role is Role.USER] == ["helper q1"]
    outer_doc = await engine.get_session("s-sync-tool")
    assert "helper q1" not in [m.content for m in outer_doc.session.messages]


async def test_augment_mode_keeps_autogens_list_and_adds_the_context(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        team = RoundRobinGroupChat(_agents(server), termination_condition=MaxMessageTermination(4))
        ce.autogen.install(engine, mode="augment")
        await engine.update_notebook("s-aug", MARK)
        with engine.session("s-aug"):
            await team.run(task=TASK)
        requests = server.requests
    assert len(requests) == 4
    for request in requests:
        messages = request["messages"]
        speaker = _speaker(request)
        assert messages[0]["content"] == SYSTEMS[speaker]  # AutoGen's own, unchanged
        assert messages[1]["role"] == "system" and MARK in messages[1]["content"]
        assert_tool_pairs_intact(from_openai_messages(messages))
    bob = requests[2]["messages"]
    assert [(m["role"], m.get("name")) for m in bob[2:]] == [("user", "user"), ("user", "alice")]


async def test_an_llm_backed_tool_calls_the_model_in_a_child_scope(
    engine: ContextEngine,
) -> None:
    """A tool body that calls a model client itself (not through an agent): the call gets the
    engine's input for its own messages in ``<outer session>/<tool call id>`` (redacted) and
    is recorded there, never in the outer conversation; the agent's own calls are injected
    once."""
    canary = "tool.canary@example.com"
    tool_system = "Summarize the text in five words."

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if tool_system in body["messages"][0]["content"]:
            return ScriptedResponse(text="a five word summary here", prompt_tokens=42)
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="outer-answer")
        return ScriptedResponse(tool_calls=[("call_llm_tool", "summarize", '{"text": "long"}')])

    with ScriptedOpenAIServer(script) as server:
        summarizer = client(server)

        async def summarize(text: str) -> str:
            """Summarize a text with a model."""
            from autogen_core.models import SystemMessage, UserMessage

            result = await summarizer.create(
                [
                    SystemMessage(content=tool_system),
                    UserMessage(content=f"{text} (reply to {canary})", source="tool"),
                ]
            )
            return str(result.content)

        outer = outer_agent(server, summarize)
        ce.autogen.install(engine)
        await engine.update_notebook("s-llm-tool", MARK)
        with engine.session("s-llm-tool"):
            result = await outer.run(task="outer words")
        # outside a tool call the client is left alone
        from autogen_core.models import UserMessage

        await summarizer.create([UserMessage(content=f"plain {canary}", source="user")])
        requests = server.requests
    assert result.messages[-1].content == "outer-answer"
    assert len(requests) == 4
    (tool_call,) = [r for r in requests if tool_system in r["messages"][0]["content"]]
    assert canary not in wire(tool_call) and "[REDACTED:email]" in wire(tool_call)
    assert "outer words" not in wire(tool_call) and MARK not in wire(tool_call)
    assert all(wire(r).count(MARK) == 1 for r in requests[:3] if r is not tool_call)
    assert canary in wire(requests[-1])  # the app's own call outside any tool: untouched
    child = await engine.get_session("s-llm-tool/call_llm_tool")
    assert [u.prompt_tokens for u in child.session.model_usage] == [42]
    assert [m.content for m in child.session.messages if m.role is Role.ASSISTANT] == [
        "a five word summary here"
    ]
    outer_doc = await engine.get_session("s-llm-tool")
    assert len(outer_doc.session.model_usage) == 2
    assert "a five word summary here" in [
        m.content for m in outer_doc.session.messages if m.role is Role.TOOL
    ]


async def test_a_tool_bodys_unrelated_model_calls_each_get_their_own_messages(
    engine: ContextEngine,
) -> None:
    """A tool body that prompts the model twice, for two documents, then once more
    continuing its first exchange: the second prompt gets its own messages only (a child
    scope of its own), the third continues the first in the tool call's scope; the outer
    agent gets the tool's result, not an error."""
    from autogen_core.models import AssistantMessage, SystemMessage, UserMessage

    tool_system = "Summarize the text in five words."

    def script(body: dict[str, Any]) -> ScriptedResponse:
        messages = body["messages"]
        if messages[0]["content"] == tool_system:
            return ScriptedResponse(text=f"summary of {messages[-1]['content']}")
        if messages[-1]["role"] == "tool":
            return ScriptedResponse(text="outer-answer")
        return ScriptedResponse(tool_calls=[("call_t", "compare", '{"a": "alpha", "b": "beta"}')])

    with ScriptedOpenAIServer(script) as server:
        summarizer = client(server)

        async def compare(a: str, b: str) -> str:
            """Summarize two documents independently, then refine the first summary."""
            first = [SystemMessage(content=tool_system), UserMessage(content=a, source="tool")]
            one = await summarizer.create(first)
            two = await summarizer.create(
                [SystemMessage(content=tool_system), UserMessage(content=b, source="tool")]
            )
            follow_up = UserMessage(content="shorter", source="tool")
            reply = AssistantMessage(content=str(one.content), source="summarizer")
            three = await summarizer.create([*first, reply, follow_up])
            return f"{one.content} | {two.content} | {three.content}"

        outer = outer_agent(server, compare)
        ce.autogen.install(engine)
        with engine.session("s-two"):
            result = await outer.run(task="compare them")
        requests = server.requests
    assert result.messages[-1].content == "outer-answer"
    tool_calls = [
        [(m["role"], m["content"]) for m in r["messages"][1:]]
        for r in requests
        if r["messages"][0]["content"] == tool_system
    ]
    assert tool_calls == [
        [("user", "alpha")],
        [("user", "beta")],
        [("user", "alpha"), ("assistant", "summary of alpha"), ("user", "shorter")],
    ]
    sessions = await engine.list_sessions()
    children = [s for s in sessions if s.startswith("s-two/call_t/call:")]
    assert len(children) == 1
    inner = (await engine.get_session(children[0])).session.messages
    assert [m.content for m in inner[1:]] == ["beta", "summary of beta"]
    first = (await engine.get_session("s-two/call_t")).session.messages
    assert [m.content for m in first[1:]] == [
        "alpha",
        "summary of alpha",
        "shorter",
        "summary of shorter",
    ]
    outer_doc = await engine.get_session("s-two")
    (tool_result,) = [m for m in outer_doc.session.messages if m.role is Role.TOOL]
    assert tool_result.content == "summary of alpha | summary of beta | summary of shorter"


async def test_a_memorys_own_model_call_in_an_agent_tool_is_no_turn_of_the_agent(
    engine: ContextEngine,
) -> None:
    """A memory whose ``update_context`` asks the model to rewrite the query, on an agent
    run as an ``AgentTool``: that call is a child of the agent's scope, and the agent's own
    call gets the user's question once, never the memory's exchange as its own turn."""
    from autogen_core.memory import (
        Memory,
        MemoryContent,
        MemoryQueryResult,
        UpdateContextResult,
    )
    from autogen_core.models import SystemMessage, UserMessage

    rewrite = "Rewrite the query for search."

    class RewritingMemory(Memory):  # type: ignore[misc]
        def __init__(self, model_client: Any) -> None:
            self._client = model_client

        async def update_context(self, model_context: Any) -> UpdateContextResult:
            messages = await model_context.get_messages()
            question = str(messages[-1].content)
            result = await self._client.create(
                [SystemMessage(content=rewrite), UserMessage(content=question, source="memory")]
            )
            await model_context.add_message(SystemMessage(content=f"Hit: {result.content}"))
            hit = MemoryContent(content=f"Hit: {result.content}", mime_type="text/plain")
            return UpdateContextResult(memories=MemoryQueryResult(results=[hit]))

        async def query(self, query: Any, cancellation_token: Any = None, **_: Any) -> Any:
            return MemoryQueryResult(results=[])

        async def add(self, content: Any, cancellation_token: Any = None) -> None:
            return None

        async def clear(self) -> None:
            return None

        async def close(self) -> None:
            return None

    def script(body: dict[str, Any]) -> ScriptedResponse:
        messages = body["messages"]
        first = messages[0]["content"]
        if first == rewrite:
            return ScriptedResponse(text=f"rewritten({messages[-1]['content']})")
        if first.startswith("You are the outer planner."):
            if messages[-1]["role"] == "tool":
                return ScriptedResponse(text="outer-answer")
            return ScriptedResponse(tool_calls=[("call_x", "expert", '{"task": "where is oslo"}')])
        return ScriptedResponse(text="Oslo is in Norway.")

    with ScriptedOpenAIServer(script) as server:
        inner = AssistantAgent(
            "expert",
            model_client=client(server),
            system_message="You are the inner expert.",
            memory=[RewritingMemory(client(server))],
            description="An expert.",
        )
        outer = AssistantAgent(
            "planner",
            model_client=client(server),
            system_message="You are the outer planner.",
            tools=[AgentTool(inner)],
            reflect_on_tool_use=True,
        )
        ce.autogen.install(engine)
        with engine.session("s-mem"):
            await outer.run(task="question")
        requests = server.requests
    (expert,) = [r for r in requests if "inner expert" in str(r["messages"][0]["content"])]
    turns = [(m["role"], m["content"]) for m in expert["messages"][1:] if m["role"] != "system"]
    assert turns == [("user", "where is oslo")]
    agent_doc = await engine.get_session("s-mem/call_x")
    assert [m.content for m in agent_doc.session.messages if m.role is not Role.SYSTEM] == [
        "where is oslo",
        "Oslo is in Norway.",
    ]
    children = [s for s in await engine.list_sessions() if s.startswith("s-mem/call_x/call:")]
    assert len(children) == 1
    memory_doc = await engine.get_session(children[0])
    assert [m.content for m in memory_doc.session.messages[1:]] == [
        "where is oslo",
        "rewritten(where is oslo)",
    ]


async def test_a_reused_tool_call_id_nests_each_turn_in_a_child_of_its_own(
    engine: ContextEngine,
) -> None:
    """A model that names its tool call ``call_0`` on every turn: the LLM-backed tool's call
    of the second turn goes to ``<outer>/call_0~2`` and receives nothing of the first
    turn's."""
    tool_system = "Summarize the topic in five words."

    def script(body: dict[str, Any]) -> ScriptedResponse:
        messages = body["messages"]
        if messages[0]["content"] == tool_system:
            return ScriptedResponse(text=f"summary of {messages[-1]['content']}")
        if messages[-1]["role"] == "tool":
            return ScriptedResponse(text="outer-answer")
        topic = json.dumps({"topic": messages[-1]["content"]})
        return ScriptedResponse(tool_calls=[("call_0", "summarize", topic)])

    with ScriptedOpenAIServer(script) as server:
        summarizer = client(server)

        async def summarize(topic: str) -> str:
            """Summarize a topic with a model."""
            from autogen_core.models import SystemMessage, UserMessage

            result = await summarizer.create(
                [SystemMessage(content=tool_system), UserMessage(content=topic, source="tool")]
            )
            return str(result.content)

        outer = AssistantAgent(
            "outer", model_client=client(server), tools=[summarize], reflect_on_tool_use=True
        )
        ce.autogen.install(engine)
        with engine.session("s-reused"):
            await outer.run(task="first topic")
            await outer.run(task="second topic")
        requests = server.requests
    nested = [r for r in requests if r["messages"][0]["content"] == tool_system]
    assert [[m["content"] for m in r["messages"]] for r in nested] == [
        [tool_system, "first topic"],
        [tool_system, "second topic"],
    ]
    for child_id, topic in (
        ("s-reused/call_0", "first topic"),
        ("s-reused/call_0~2", "second topic"),
    ):
        child = await engine.get_session(child_id)
        assert [m.content for m in child.session.messages if m.role is Role.USER] == [topic]


async def test_a_peers_reply_the_budget_shortened_is_still_the_peers() -> None:
    """A tight budget makes the engine render an older reply of a peer at a shorter level of
    detail (its text is no longer the one AutoGen holds): it still reaches the other agent as
    the peer's user message, never as that agent's own assistant turn."""
    from ce.core.config import BudgetConfig, RuntimeConfig
    from ce.core.testing import deterministic_engine

    filler = "Background detail that matters little. " * 40
    budget = BudgetConfig(max_input_tokens=700, reserved_reply_tokens=100)
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=budget))

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if _speaker(body) == "alice":
            return ScriptedResponse(text=f"alice-says {filler}")
        return ScriptedResponse(text="bob-says ok")

    with ScriptedOpenAIServer(script) as server:
        alice = AssistantAgent(
            "alice", model_client=client(server), system_message=SYSTEMS["alice"]
        )
        bob = AssistantAgent("bob", model_client=client(server), system_message=SYSTEMS["bob"])
        team = RoundRobinGroupChat([alice, bob], termination_condition=MaxMessageTermination(5))
        ce.autogen.install(engine)
        with engine.session("s-tight"):
            await team.run(task=f"task {filler}")
        requests = server.requests
    await engine.close()
    assert [_speaker(r) for r in requests] == ["alice", "bob", "alice", "bob"]
    for request in requests:
        speaker = _speaker(request)
        other = "bob" if speaker == "alice" else "alice"
        for message in request["messages"][1:]:
            text = message.get("content") or ""
            if text.startswith(f"{other}-says"):
                assert (message["role"], message.get("name")) == ("user", other), message
            if text.startswith(f"{speaker}-says"):
                assert message["role"] == "assistant", message
    shortened = [
        m
        for m in requests[3]["messages"]
        if (m.get("content") or "").startswith("alice-says")
        and m["content"] != f"alice-says {filler}"
    ]
    assert shortened  # the budget did shorten one of alice's replies


async def test_a_user_proxys_messages_stay_the_users(engine: ContextEngine) -> None:
    """A ``UserProxyAgent`` in a team speaks for the user: its message is stored as a user
    message (author kind user), not as an agent's reply."""
    from autogen_agentchat.agents import UserProxyAgent

    def echo(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text="alice-says noted")

    with ScriptedOpenAIServer(echo) as server:
        alice = AssistantAgent(
            "alice", model_client=client(server), system_message=SYSTEMS["alice"]
        )
        human = UserProxyAgent("human", input_func=lambda prompt: "the human's answer")
        team = RoundRobinGroupChat([alice, human], termination_condition=MaxMessageTermination(4))
        ce.autogen.install(engine)
        with engine.session("s-proxy"):
            await team.run(task=TASK)
        requests = server.requests
    assert len(requests) == 2
    assert ("user", "human", "the human's answer") in [
        (m["role"], m.get("name"), m.get("content")) for m in requests[1]["messages"]
    ]
    doc = await engine.get_session("s-proxy")
    (answer,) = [m for m in doc.session.messages if m.content == "the human's answer"]
    assert answer.role is Role.USER
    assert answer.author is not None
    assert (answer.author.kind, answer.author.id) == (AuthorKind.USER, "human")


def _shape(request: dict[str, Any]) -> list[tuple[Any, ...]]:
    """A request's messages as the model reads them: role, name, text (a tool result without
    the engine's evidence fence), tool call ids, the id a tool result answers."""
    return [
        (
            m["role"],
            m.get("name"),
            unfenced(m.get("content")),
            [c["id"] for c in m.get("tool_calls") or ()],
            m.get("tool_call_id"),
        )
        for m in request["messages"]
    ]


def _summarizing_script(body: dict[str, Any]) -> ScriptedResponse:
    """Alice calls the weather tool on every turn (AutoGen then answers with her
    ``ToolCallSummaryMessage``, ``reflect_on_tool_use=False``); bob replies."""
    speaker, n = _speaker(body), len(body["messages"])
    if speaker == "alice":
        return ScriptedResponse(tool_calls=[(f"call_a{n}", "weather", '{"city": "Oslo"}')])
    return ScriptedResponse(text=f"bob-says-{n}")


def _summarizing_agents(server: ScriptedOpenAIServer) -> list[AssistantAgent]:
    return [
        AssistantAgent(
            "alice", model_client=client(server), tools=[weather], system_message=SYSTEMS["alice"]
        ),
        AssistantAgent("bob", model_client=client(server), system_message=SYSTEMS["bob"]),
    ]


async def test_an_agents_own_tool_call_summary_never_comes_back_as_its_own_turn(
    engine: ContextEngine,
) -> None:
    """AutoGen shows an agent's ``ToolCallSummaryMessage`` to its peers only; its own next
    call holds its tool call and result, never the summary as its own assistant turn. Every
    request is the one plain AutoGen sends (tool results fenced as evidence), and the summary
    is stored once, when the team emits it, before bob's reply."""

    async def run(install: bool) -> list[dict[str, Any]]:
        with ScriptedOpenAIServer(_summarizing_script) as server:
            team = RoundRobinGroupChat(
                _summarizing_agents(server), termination_condition=MaxMessageTermination(5)
            )
            if install:
                ce.autogen.install(engine)
            with engine.session("s-summary"):
                await team.run(task=TASK)
            if install:
                ce.autogen.uninstall()
            return server.requests

    plain = await run(install=False)
    requests = await run(install=True)
    assert [_speaker(r) for r in requests] == ["alice", "bob", "alice", "bob"]
    assert [_shape(r) for r in requests] == [_shape(r) for r in plain]
    assert [m["role"] for m in requests[2]["messages"]] == [
        "system",
        "user",
        "assistant",  # alice's tool call, then its result; no summary of hers
        "tool",
        "user",
    ]
    doc = await engine.get_session("s-summary")
    stored = [m for m in doc.session.messages if m.role is not Role.SYSTEM]
    summaries = [m for m in stored if m.meta.get("autogen_emitted")]
    assert [(m.content, m.meta["autogen_emitted"]) for m in summaries] == [
        ("sunny in Oslo", "ToolCallSummaryMessage")
    ] * 2
    assert all(m.author is not None and m.author.id == "alice" for m in summaries)
    first = stored.index(summaries[0])
    assert stored[first - 1].tool_calls  # right after alice's tool call, in emitted order
    assert stored[first + 1].content.startswith("bob-says")


async def test_a_handoff_message_never_comes_back_to_the_agent_that_handed_off(
    engine: ContextEngine,
) -> None:
    """A ``Swarm``: each agent's ``HandoffMessage`` (and tool-call summary) reaches the other
    as its user message and never comes back to its author as its own assistant turn; every
    request is the one plain AutoGen sends, and the handoffs are stored in the order the
    team emits them."""
    travel, refunder = "You are a travel agent.", "You are the flights refunder."

    def refund_flight(flight_id: str) -> str:
        """Refund a flight."""
        return f"Flight {flight_id} refunded"

    def script(body: dict[str, Any]) -> ScriptedResponse:
        messages, n = body["messages"], len(body["messages"])
        calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()]
        if travel in messages[0]["content"]:
            if "transfer_to_flights_refunder" in calls:
                return ScriptedResponse(text="All set. TERMINATE")
            return ScriptedResponse(
                tool_calls=[(f"call_t{n}", "transfer_to_flights_refunder", "{}")]
            )
        if "refund_flight" not in calls:
            args = json.dumps({"flight_id": "ABC123"})
            return ScriptedResponse(tool_calls=[(f"call_r{n}", "refund_flight", args)])
        return ScriptedResponse(tool_calls=[(f"call_b{n}", "transfer_to_travel_agent", "{}")])

    async def run(install: bool) -> list[dict[str, Any]]:
        from autogen_agentchat.conditions import TextMentionTermination

        with ScriptedOpenAIServer(script) as server:
            agents = [
                AssistantAgent(
                    "travel_agent",
                    model_client=client(server),
                    handoffs=["flights_refunder"],
                    system_message=travel,
                ),
                AssistantAgent(
                    "flights_refunder",
                    model_client=client(server),
                    handoffs=["travel_agent"],
                    tools=[refund_flight],
                    system_message=refunder,
                ),
            ]
            stop = TextMentionTermination("TERMINATE") | MaxMessageTermination(12)
            team = Swarm(agents, termination_condition=stop)
            if install:
                ce.autogen.install(engine)
            with engine.session("s-handoff"):
                await team.run(task="Refund flight ABC123 please.")
            if install:
                ce.autogen.uninstall()
            return server.requests

    plain = await run(install=False)
    requests = await run(install=True)
    assert len(requests) == len(plain) == 4
    assert [_shape(r) for r in requests] == [_shape(r) for r in plain]
    back = requests[3]["messages"]  # the travel agent, after the refunder handed back
    assert [(m["role"], m.get("name")) for m in back[1:]] == [
        ("user", "user"),
        ("assistant", None),  # its own handoff call and its result, no handoff message
        ("tool", None),
        ("user", "flights_refunder"),
        ("user", "flights_refunder"),
    ]
    doc = await engine.get_session("s-handoff")
    emitted = [
        (m.author.id if m.author else None, m.meta["autogen_emitted"])
        for m in doc.session.messages
        if m.meta.get("autogen_emitted")
    ]
    assert emitted == [
        ("travel_agent", "HandoffMessage"),
        ("flights_refunder", "ToolCallSummaryMessage"),
        ("flights_refunder", "HandoffMessage"),
    ]


PLANNER, BOOKER = "You are the planner.", "You are the booker."


def lookup(q: str) -> str:
    """Find flights."""
    return f"found {q}: SK1, SK2"


def _handing_script(thought: bool) -> Callable[[dict[str, Any]], ScriptedResponse]:
    """The planner answers the user's task by handing off to the booker in the same reply
    as a ``lookup`` call (``thought``: with a thought instead of the tool call), and ends the
    run when the booker hands back; the booker always hands back. Call ids are numbered by
    request."""
    count = itertools.count(1)

    def script(body: dict[str, Any]) -> ScriptedResponse:
        n, messages = next(count), body["messages"]
        if PLANNER not in messages[0]["content"]:
            return ScriptedResponse(tool_calls=[(f"call_b{n}", "transfer_to_planner", "{}")])
        if messages[-1].get("name") != "user":
            return ScriptedResponse(text=f"Booked {n}. TERMINATE")
        handoff = (f"call_h{n}", "transfer_to_booker", "{}")
        if thought:
            return ScriptedResponse(text=f"Handing over {n}.", tool_calls=[handoff])
        search = (f"call_l{n}", "lookup", json.dumps({"q": "flights"}))
        return ScriptedResponse(tool_calls=[search, handoff])

    return script


def _handing_team(server: ScriptedOpenAIServer, thought: bool) -> Swarm:
    """The planner (with the ``lookup`` tool unless ``thought``) and the booker, each able
    to hand off to the other (see :func:`_handing_script`)."""
    from autogen_agentchat.conditions import TextMentionTermination

    agents = [
        AssistantAgent(
            "planner",
            model_client=client(server),
            tools=[] if thought else [lookup],
            handoffs=["booker"],
            system_message=PLANNER,
        ),
        AssistantAgent(
            "booker", model_client=client(server), handoffs=["planner"], system_message=BOOKER
        ),
    ]
    stop = TextMentionTermination("TERMINATE") | MaxMessageTermination(12)
    return Swarm(agents, termination_condition=stop)


def _calls(request: dict[str, Any]) -> list[str]:
    return [c["id"] for m in request["messages"] for c in m.get("tool_calls") or ()]


def _assert_stored_once(stored: list[Message], calls: list[str]) -> None:
    """The session holds exactly ``calls`` (under the model's own ids), each result once and
    each reply once (a handoff message may be emitted again, in a later run)."""
    assert [c.tool_call_id for m in stored for c in m.tool_calls or ()] == calls
    results = [m.tool_call_id for m in stored if m.role is Role.TOOL]
    assert len(results) == len(set(results))
    replies = [
        m.content
        for m in stored
        if m.role is Role.ASSISTANT and m.content and not m.meta.get("autogen_emitted")
    ]
    assert len(replies) == len(set(replies))


@pytest.mark.parametrize("thought", [False, True], ids=["tool-call", "thought"])
async def test_a_handoffs_context_reaches_the_peers_as_in_autogen_and_is_stored_once(
    engine: ContextEngine, thought: bool
) -> None:
    """A ``Swarm`` whose planner calls a tool and hands off in one reply (or hands off with a
    thought): AutoGen passes the tool call and its result (or the thought) to the booker as
    the handoff's context, a part of the planner's reply. That part is the planner's stored
    reply, not a new message: the session stores each call and each reply once, the planner
    never gets it back as a second turn of its own, and the booker keeps receiving it in the
    team's next run in the same session. Every request is the one plain AutoGen sends."""

    async def run(install: bool) -> list[dict[str, Any]]:
        with ScriptedOpenAIServer(_handing_script(thought)) as server:
            team = _handing_team(server, thought)
            if install:
                ce.autogen.install(engine)
            with engine.session("s-handoff-context"):
                await team.run(task="Find and book a flight.")
                await team.run(task="Again, please.")
            if install:
                ce.autogen.uninstall()
            return server.requests

    plain = await run(install=False)
    requests = await run(install=True)
    assert len(requests) == len(plain) == 6
    assert [_shape(r) for r in requests] == [_shape(r) for r in plain]
    looked = [] if thought else ["call_l1"], [] if thought else ["call_l4"]
    assert _calls(requests[2]) == [*looked[0], "call_h1"]  # the planner's reply, once
    assert _calls(requests[4]) == [*looked[0], "call_b2", *looked[1]]  # the booker, next run
    if thought:  # the first run's handoff context, kept for the booker
        assert requests[4]["messages"][2] == {"role": "assistant", "content": "Handing over 1."}
    doc = await engine.get_session("s-handoff-context")
    calls = [*looked[0], "call_h1", "call_b2", *looked[1], "call_h4", "call_b5"]
    _assert_stored_once(doc.session.messages, calls)


@pytest.mark.parametrize("thought", [False, True], ids=["tool-call", "thought"])
async def test_a_handoffs_context_from_before_a_resume_is_the_stored_reply(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch, thought: bool
) -> None:
    """The handoff team saved with ``save_state`` and loaded into new agents by a new process
    (a new engine on the same store, the plugin installed anew, nothing noted of the first
    process's handoffs): the booker's model context holds the first run's handoff context,
    which the new process finds as the planner's reply the session stores. Every request is
    the one plain AutoGen sends, and nothing is stored twice."""

    async def run(install: bool) -> list[dict[str, Any]]:
        with ScriptedOpenAIServer(_handing_script(thought)) as server:
            team = _handing_team(server, thought)
            if install:
                ce.autogen.install(engine)
            with engine.session("s-handoff-resumed"):
                await team.run(task="Find and book a flight.")
            state = await team.save_state()
            if install:
                ce.autogen.uninstall()
            before = len(server.requests)
            # the new process: new agents, a new engine on the same store, a new install,
            # nothing noted of the handoffs
            handed = HandedParts()
            for module in (convert, inject, patch):
                monkeypatch.setattr(module, "HANDED", handed)
            later = ContextEngine(engine.store, config=RuntimeConfig(model_hint="gpt-4o"))
            team = _handing_team(server, thought)
            await team.load_state(state)
            if install:
                ce.autogen.install(later)
            with later.session("s-handoff-resumed"):
                await team.run(task="Again, please.")
            if install:
                ce.autogen.uninstall()
            await later.flush()
            return server.requests[before:]

    plain = await run(install=False)
    requests = await run(install=True)
    assert len(requests) == len(plain) == 3
    assert [_shape(r) for r in requests] == [_shape(r) for r in plain]
    looked = [] if thought else ["call_l1"], [] if thought else ["call_l4"]
    assert _calls(requests[1]) == [*looked[0], "call_b2", *looked[1]]  # the booker
    doc = await engine.get_session("s-handoff-resumed")
    calls = [*looked[0], "call_h1", "call_b2", *looked[1], "call_h4", "call_b5"]
    _assert_stored_once(doc.session.messages, calls)


async def test_a_team_resumed_in_a_new_process_tells_its_agents_messages_apart(
    engine: ContextEngine,
) -> None:
    """A team saved with ``save_state`` and loaded into new agents by a new process (a new
    engine on the same store, the plugin installed anew): the engine's input holds messages
    written before (a peer's tool calls, an agent's own summaries) that the new process never
    saw; their authors are read from the session, so each request is the one plain AutoGen
    sends: bob never gets alice's tool call as his own, alice never her summary."""

    async def run(install: bool) -> list[dict[str, Any]]:
        with ScriptedOpenAIServer(_summarizing_script) as server:
            team = RoundRobinGroupChat(
                _summarizing_agents(server), termination_condition=MaxMessageTermination(4)
            )
            if install:
                ce.autogen.install(engine)
            with engine.session("s-resumed"):
                await team.run(task=TASK)
            state = await team.save_state()
            if install:
                ce.autogen.uninstall()
            before = len(server.requests)
            # the new process: new agents, a new engine on the same store, a new install
            later = ContextEngine(engine.store, config=RuntimeConfig(model_hint="gpt-4o"))
            team = RoundRobinGroupChat(
                _summarizing_agents(server), termination_condition=MaxMessageTermination(3)
            )
            await team.load_state(state)
            if install:
                ce.autogen.install(later)
            with later.session("s-resumed"):
                await team.run(task="And tomorrow?")
            if install:
                ce.autogen.uninstall()
            await later.flush()
            return server.requests[before:]

    plain = await run(install=False)
    requests = await run(install=True)
    assert [_speaker(r) for r in requests] == ["bob", "alice"]
    assert [_shape(r) for r in requests] == [_shape(r) for r in plain]
    bob = requests[0]["messages"]
    assert not any(m.get("tool_calls") or m["role"] == "tool" for m in bob)


async def test_a_teams_next_run_in_a_new_session_keeps_each_agents_view(
    engine: ContextEngine,
) -> None:
    """Two runs of one team that name no session: each run is its own session, and the
    second one receives the first run's messages from the agents' model contexts. An
    agent's summary and tool calls from the first run are still told apart: every request
    holds the messages plain AutoGen sends (alice never her summary as her own turn, bob
    never her tool calls); the second session stores the carried-over messages in the order
    the agents first pass them, so bob's last request has alice's first summary later."""

    async def run(install: bool) -> list[dict[str, Any]]:
        with ScriptedOpenAIServer(_summarizing_script) as server:
            team = RoundRobinGroupChat(
                _summarizing_agents(server), termination_condition=MaxMessageTermination(3)
            )
            if install:
                ce.autogen.install(engine)
            await team.run(task=TASK)
            await team.run(task="And tomorrow?")
            if install:
                ce.autogen.uninstall()
            return server.requests

    plain = await run(install=False)
    requests = await run(install=True)
    assert [_speaker(r) for r in requests] == ["alice", "bob", "alice", "bob"]
    assert [_shape(r) for r in requests[:3]] == [_shape(r) for r in plain[:3]]
    assert sorted(map(repr, _shape(requests[3]))) == sorted(map(repr, _shape(plain[3])))
    assert len([s for s in await engine.list_sessions() if s.startswith("run:")]) == 2
