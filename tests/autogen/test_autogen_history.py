"""A history an agent continues is converted only for its new messages (each agent of a team
keeps its own view of the session), and an old message the app changed in place after a call
never reaches the model as it now is: the model gets the engine's version of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_apps import client, wire
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import AssistantMessage, LLMMessage, SystemMessage, UserMessage

import ce.autogen
import ce.autogen._inject as inject
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SYSTEM = "You are terse."
CANARY = "edit.canary@example.com"


def _numbered(body: dict[str, Any]) -> ScriptedResponse:
    """Replies "reply-<n>", n counting the assistant turns the request already holds."""
    turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return ScriptedResponse(text=f"reply-{turns}")


def _spy(agent: AssistantAgent) -> list[list[LLMMessage]]:
    """The lists the agent's own model client receives, one per call."""
    seen: list[list[LLMMessage]] = []
    model = agent._model_client
    create = model.create

    async def spy(messages: Sequence[LLMMessage], **kwargs: Any) -> Any:
        seen.append(list(messages))
        return await create(messages, **kwargs)

    model.create = spy  # type: ignore[method-assign]
    return seen


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages each conversion of the plugin converts, one entry per call."""
    sizes: list[int] = []
    convert = inject.to_openai

    def counting(units: Sequence[Any], *args: Any) -> list[dict[str, Any]]:
        sizes.append(len(units))
        return convert(units, *args)

    monkeypatch.setattr(inject, "to_openai", counting)
    return sizes


@pytest.mark.parametrize("edited", ["user", "assistant"])
async def test_a_message_changed_in_place_after_a_call_never_goes_as_it_now_is(
    edited: str, engine: ContextEngine
) -> None:
    # a continued history is not converted again (its cost grows with what is new); an old
    # message the app changed in place after a call passed it must then not reach the model
    # as the app's object (the engine never read its new text)
    with ScriptedOpenAIServer(_numbered) as server:
        agent = AssistantAgent("helper", model_client=client(server), system_message=SYSTEM)
        seen = _spy(agent)
        ce.autogen.install(engine)
        with engine.session("edited"):
            await agent.run(task="Hi!")
            await agent.run(task="And now?")  # passes "Hi!" and the reply "reply-0"
            context = await agent.model_context.get_messages()
            old = context[0] if edited == "user" else context[1]
            assert isinstance(old, UserMessage if edited == "user" else AssistantMessage)
            old.content = f"{old.content} Mail {CANARY}"  # changed in place, after the calls
            await agent.run(task="Last?")
        requests = server.requests
    assert len(requests) == 3
    last = requests[-1]
    assert CANARY not in wire(last)
    assert [m["content"] for m in last["messages"][1:]] == [
        "Hi!",
        "reply-0",
        "And now?",
        "reply-1",
        "Last?",
    ]
    sent = seen[-1]
    assert isinstance(sent[0], SystemMessage) and sent[0].content.startswith(SYSTEM)
    changed = 1 if edited == "user" else 2
    assert sent[changed] is not old  # the engine's version, not the changed object
    context = await agent.model_context.get_messages()
    unchanged = [i for i in range(1, 6) if i != changed]
    assert all(sent[i] is context[i - 1] for i in unchanged)  # the app's own objects
    doc = await engine.get_session("edited")
    assert all(CANARY not in m.content for m in doc.session.messages)


async def test_a_continued_history_is_converted_only_for_its_new_messages(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _counting(monkeypatch)
    with ScriptedOpenAIServer(_numbered) as server:
        agent = AssistantAgent("helper", model_client=client(server), system_message=SYSTEM)
        ce.autogen.install(engine)
        with engine.session("continued"):
            for turn in range(3):
                await agent.run(task=f"Question {turn}?")
        requests = server.requests
    # the system message and the question; then the reply and the next question each time
    assert sizes == [2, 2, 2]
    assert [m["content"] for m in requests[2]["messages"][1:]] == [
        "Question 0?",
        "reply-0",
        "Question 1?",
        "reply-1",
        "Question 2?",
    ]
    doc = await engine.get_session("continued")
    assert [m.content for m in doc.session.messages if m.role.value != "system"] == [
        "Question 0?",
        "reply-0",
        "Question 1?",
        "reply-1",
        "Question 2?",
        "reply-2",
    ]
    assert {m.author.id for m in doc.session.messages if m.author is not None} == {
        "user",
        "helper",
    }


async def test_an_agent_built_anew_on_messages_met_before_converts_only_the_others(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a fresh agent per request on a model context restored from the same message objects,
    # the plugin installed again in between (it lets go of each session's history): the
    # messages its view converted before are not converted again
    sizes = _counting(monkeypatch)
    earlier: list[LLMMessage] = [
        UserMessage(content=f"Question {i}?", source="user")
        if i % 2 == 0
        else AssistantMessage(content=f"Answer {i}.", source="helper")
        for i in range(8)
    ]
    with ScriptedOpenAIServer(_numbered) as server:
        for run in range(2):
            ce.autogen.install(engine)
            try:
                agent = AssistantAgent(
                    "helper",
                    model_client=client(server),
                    system_message=SYSTEM,
                    model_context=UnboundedChatCompletionContext(list(earlier)),
                )
                with engine.session("restored"):
                    await agent.run(task=f"Now {run}?")
            finally:
                ce.autogen.uninstall()
        requests = server.requests
    # all ten the first time; then the agent's system message (a new object of the new
    # agent's) and the new question: the earlier messages are the objects met before
    assert sizes == [10, 2]
    second = requests[1]["messages"]
    assert second[0]["role"] == "system" and second[0]["content"].startswith(SYSTEM)
    assert [m["content"] for m in second[-3:]] == ["Now 0?", "reply-4", "Now 1?"]


async def test_each_agent_of_a_team_continues_its_own_view(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two agents take turns in one session, each passing its own messages (the other's
    replies as user messages): each converts only what is new to it."""
    sizes = _counting(monkeypatch)

    def script(body: dict[str, Any]) -> ScriptedResponse:
        speaker = "alice" if "Alice" in body["messages"][0]["content"] else "bob"
        return ScriptedResponse(text=f"{speaker}-says-{len(body['messages'])}")

    with ScriptedOpenAIServer(script) as server:
        agents = [
            AssistantAgent(name, model_client=client(server), system_message=f"You are {title}.")
            for name, title in (("alice", "Alice"), ("bob", "Bob"))
        ]
        team = RoundRobinGroupChat(agents, termination_condition=MaxMessageTermination(5))
        ce.autogen.install(engine)
        with engine.session("team-views"):
            await team.run(task="Plan a trip.")
        requests = server.requests
    assert len(requests) == 4
    # alice: system + task; bob: system + task + alice's reply; then two new messages each
    assert sizes == [2, 3, 2, 2]
    last = requests[-1]["messages"]
    assert last[0]["content"].startswith("You are Bob.")
    assert [m["role"] for m in last[1:]] == ["user", "user", "assistant", "user"]
