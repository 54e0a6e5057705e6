"""An agent runtime shared by the orchestrations of several users: an app starts SK's
``InProcessRuntime`` once, lazily, inside the first request it serves (here inside
``with engine.session("s-alice")``, or inside a function alice's agent called) and runs every
later user's orchestration on it. asyncio copies the context of the code that started the
runtime into its message loop, and so into every agent call of every later orchestration: the
plugin starts the loop detached, so bob's orchestration never receives alice's conversation
and its agents are recorded in their own sessions, as when the runtime is started outside any
session. The requests are those SK sends without the plugin."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from semantic_kernel import Kernel
from semantic_kernel.agents import (
    ChatCompletionAgent,
    ChatHistoryAgentThread,
    GroupChatOrchestration,
    RoundRobinGroupChatManager,
    SequentialOrchestration,
)
from semantic_kernel.agents.runtime import InProcessRuntime
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.functions import kernel_function
from sk_apps import kernel_with, wire

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, deterministic_engine

WRITER = "You are the writer. Draft the text."
REVIEWER = "You are the reviewer. Improve the draft."
FRONT = "You are the front desk. Hand writing jobs to the team."
USERS = ("alice", "bob")


def _task(user: str) -> str:
    return f"{user.upper()}-TASK: a haiku about {user}'s cat"


def _script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    first = str(messages[0].get("content") or "")
    last = messages[-1]
    if first.startswith(FRONT):
        if last["role"] == "tool":
            return ScriptedResponse(text="The team wrote it.")
        task = str(last.get("content") or "")
        return ScriptedResponse(tool_calls=[("call_0", "Team-write", json.dumps({"task": task}))])
    user = next(u for u in USERS if u in wire(body))
    who = "writer" if first.startswith(WRITER) else "reviewer"
    return ScriptedResponse(text=f"{who} #{len(messages)} for {user}")


def _agents(kernel: Kernel) -> list[ChatCompletionAgent]:
    return [
        ChatCompletionAgent(kernel=kernel, name="writer", instructions=WRITER, description="w"),
        ChatCompletionAgent(kernel=kernel, name="reviewer", instructions=REVIEWER, description="r"),
    ]


def _orchestration(shape: str, kernel: Kernel) -> Any:
    if shape == "group chat":
        manager = RoundRobinGroupChatManager(max_rounds=3)
        return GroupChatOrchestration(members=_agents(kernel), manager=manager)
    return SequentialOrchestration(members=_agents(kernel))


def _without_system_text(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests with their system messages' text left out (the plugin may add the
    engine's context to an agent's instructions)."""
    bodies = copy.deepcopy(requests)
    for body in bodies:
        for message in body["messages"]:
            if message["role"] == "system":
                message.pop("content", None)
    return bodies


async def _served_in_sessions(shape: str, engine: ContextEngine | None) -> list[dict[str, Any]]:
    """Alice's request, then bob's, each handled in ``engine.session(<user>)``; the runtime is
    started inside alice's (``engine=None``: without the plugin)."""
    with ScriptedOpenAIServer(_script) as server:
        if engine is not None:
            ce.semantic_kernel.install(engine)
        kernel = kernel_with(server)
        runtime = InProcessRuntime()
        started = False
        try:
            for user in USERS:
                session = deterministic_engine().session if engine is None else engine.session
                with session(f"s-{user}"):
                    if not started:
                        runtime.start()
                        started = True
                    result = await _orchestration(shape, kernel).invoke(
                        task=_task(user), runtime=runtime
                    )
                    await result.get(timeout=20)
        finally:
            await runtime.stop_when_idle()
            if engine is not None:
                ce.semantic_kernel.uninstall()
        return server.requests


@pytest.mark.parametrize("shape", ["group chat", "sequential"])
async def test_a_runtime_started_in_a_session_does_not_lend_it_to_later_orchestrations(
    engine: ContextEngine, shape: str
) -> None:
    plain = await _served_in_sessions(shape, None)
    requests = await _served_in_sessions(shape, engine)
    for request in requests:
        text = wire(request)
        assert not (_task("alice") in text and _task("bob") in text), text
    assert _without_system_text(requests) == _without_system_text(plain)
    # no stored session mixes the two users' orchestrations
    for session_id in await engine.list_sessions():
        doc = (await engine.get_session(session_id)).model_dump_json()
        assert not ("ALICE-TASK" in doc and "BOB-TASK" in doc), session_id


class Team:
    """A kernel function running an orchestration on the app's one runtime, started by the
    first call."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.runtime = InProcessRuntime()
        self.started = False

    @kernel_function(name="write", description="Have the writing team write a text.")
    async def write(self, task: str) -> str:
        if not self.started:
            self.runtime.start()
            self.started = True
        result = await _orchestration("group chat", self.kernel).invoke(
            task=task, runtime=self.runtime
        )
        return str((await result.get(timeout=20)).content)


async def test_a_runtime_started_inside_a_function_call_is_not_nested_in_it(
    engine: ContextEngine,
) -> None:
    """Alice's front-desk agent calls a function that starts the runtime; bob's call of the
    function runs its orchestration on the same runtime: it is not recorded inside alice's
    function call (nor alice's inside bob's)."""
    with ScriptedOpenAIServer(_script) as server:
        ce.semantic_kernel.install(engine)
        team = Team(kernel_with(server))
        front = ChatCompletionAgent(
            kernel=kernel_with(server, (team, "Team")),
            name="front",
            instructions=FRONT,
            function_choice_behavior=FunctionChoiceBehavior.Auto(),
        )
        try:
            for user in USERS:
                thread = ChatHistoryAgentThread(thread_id=f"t-{user}")
                await front.get_response(messages=_task(user), thread=thread)
        finally:
            await team.runtime.stop_when_idle()
        requests = server.requests
    for request in requests:
        text = wire(request)
        assert not (_task("alice") in text and _task("bob") in text), text
    sessions = await engine.list_sessions()
    for session_id in sessions:
        doc = (await engine.get_session(session_id)).model_dump_json()
        assert not ("ALICE-TASK" in doc and "BOB-TASK" in doc), session_id
        if session_id.startswith("t-alice/"):
            assert "BOB-TASK" not in doc, session_id
