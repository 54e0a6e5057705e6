"""A team's session written by two worker processes in turn (each with its own engine on the
shared store, as behind a load balancer): the engine's input for an agent holds the other
worker's messages, which this process never saw. Every such message still reaches each agent
as its author's (a peer's as a user message named after the peer, never as the agent's own
turn), however many times the other worker wrote since, and finding their authors reads the
newest part of the session, not all of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_apps import client

import ce.autogen
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Author, AuthorKind, Message, Role
from ce.core.stores import SQLiteStore
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SYSTEMS = {"alice": "You are Alice, the researcher.", "bob": "You are Bob, the critic."}
SESSION = "s-two-workers"


def _speaker(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"]
    return next(name for name, system in SYSTEMS.items() if system in first)


def _script(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text=f"{_speaker(body)}-says-{len(body['messages'])}")


def _team(server: ScriptedOpenAIServer) -> RoundRobinGroupChat:
    agents = [
        AssistantAgent(name, model_client=client(server), system_message=system)
        for name, system in SYSTEMS.items()
    ]
    return RoundRobinGroupChat(agents, termination_condition=MaxMessageTermination(3))


async def _other_worker_writes(path: Path, text: str) -> None:
    """The other worker's engine, on its own connection to the file, records alice's reply
    (its plugin writes it so)."""
    other = ContextEngine(SQLiteStore(str(path)), config=RuntimeConfig(model_hint="gpt-4o"))
    reply = Message(
        role=Role.ASSISTANT, content=text, author=Author(kind=AuthorKind.AGENT, id="alice")
    )
    await other.commit_assistant_message(SESSION, reply)
    await other.close()
    await other.store.close()


async def test_the_other_workers_messages_keep_their_author_every_time(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SQLiteStore(str(path))
    engine = ContextEngine(store, config=RuntimeConfig(model_hint="gpt-4o"))
    whole_reads: list[str] = []
    read_whole = store.get_session

    async def counted(session_id: str) -> Any:
        whole_reads.append(session_id)
        return await read_whole(session_id)

    store.get_session = counted  # type: ignore[method-assign]
    with ScriptedOpenAIServer(_script) as server:
        ce.autogen.install(engine)
        seen: dict[str, list[dict[str, Any]]] = {}
        for run in range(4):
            if run:  # the other worker served the conversation in between
                text = f"alice-on-worker-b-{run}"
                await _other_worker_writes(path, text)
                before = len(server.requests)
            with engine.session(SESSION):
                await _team(server).run(task=f"Question {run}?")
            if run:
                seen[text] = server.requests[before:]
        ce.autogen.uninstall()
    await engine.close()
    await store.close()
    for text, requests in seen.items():
        assert [_speaker(r) for r in requests] == ["alice", "bob"]
        for request in requests:
            (copy,) = [m for m in request["messages"] if m.get("content") == text]
            if _speaker(request) == "bob":
                assert (copy["role"], copy.get("name")) == ("user", "alice"), text
            else:
                assert copy["role"] == "assistant", text
    assert whole_reads == []  # the authors came from the session's newest part
