"""LangGraph apps that hand an agent messages of its own, on a thread: each such agent run is a
conversation of its own, as without the engine, never the thread's.

- The orchestrator-worker map step: ``Send("worker", {"messages": [HumanMessage(slice)]})`` to a
  ``create_agent`` node, once per slice. Each worker gets its own slice and its own tool loop,
  never a sibling's slice, tool call or result, nor the thread's earlier turns.
- LangGraph's "call a subgraph inside a node" with a different state: a node runs
  ``researcher.invoke({"messages": [HumanMessage(question)]})``. Each question's run gets that
  question only, not an earlier question's exchange nor a sibling node's.
- A node that hands the agent the thread's messages continues the thread.

Real graphs over ChatOpenAI on the scripted OpenAI server, sync and async: every request body
is the one plain LangGraph sends (tool results fenced), and the store holds each agent run in a
session of its own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import pytest

pytest.importorskip("langchain_openai")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Send
from wire import message_text, read, reads

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse


class _Answered:
    """The topics the workers answered, so that the worker of slice ``k`` looks its slice up
    only once the worker of slice ``k - 1`` answered (the workers of a map step interleave
    the same way on every run)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._topics: set[str] = set()

    def add(self, topic: str) -> None:
        with self._changed:
            self._topics.add(topic)
            self._changed.notify_all()

    def wait_for_slice_before(self, topic: str) -> None:
        head, _, index = topic.rpartition(" ")
        if not index.isdigit() or index == "0":
            return
        before = f"{head} {int(index) - 1}"
        with self._changed:
            assert self._changed.wait_for(lambda: before in self._topics, timeout=60)


_answered = [_Answered()]


@tool
def lookup(topic: str) -> str:
    """Look up a topic."""
    _answered[0].wait_for_slice_before(topic)
    return f"facts about {topic}"


def _script(body: dict[str, Any]) -> ScriptedResponse:
    """An agent (a worker, a researcher: a system prompt of "worker" or "researcher") looks
    its newest question up, then answers; anyone else answers with what it was given."""
    messages = body["messages"]
    system = message_text(messages[0])
    if "worker" in system or "researcher" in system:
        last = message_text(messages[-1])
        if messages[-1]["role"] == "user":
            call = f"call_{len(messages)}_{last.replace(' ', '_')}"
            return ScriptedResponse(tool_calls=[(call, "lookup", json.dumps({"topic": last}))])
        _answered[0].add(last.removeprefix("facts about "))
        return ScriptedResponse(text=f"found from {len(messages)} messages: {last}")
    return ScriptedResponse(text=f"answer from {len(messages)} messages")


async def _run(
    build: Callable[[ChatOpenAI], Any],
    inputs: Sequence[dict[str, Any]],
    path: str,
    engine: ContextEngine | None,
) -> list[dict[str, Any]]:
    """The request bodies of ``inputs`` run in turn on one thread of the graph ``build`` makes
    (with the plugin installed on ``engine``, when given)."""
    _answered[0] = _Answered()
    with ScriptedOpenAIServer(_script) as server:
        if engine is not None:
            ce.langchain.install(engine)
        try:
            model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
            graph = build(model)
            config: Any = {"configurable": {"thread_id": "t"}}
            for item in inputs:
                if path == "invoke":
                    graph.invoke(item, config)
                else:
                    await graph.ainvoke(item, config)
        finally:
            if engine is not None:
                ce.langchain.uninstall()
        return list(server.requests)


async def _own_runs(engine: ContextEngine) -> list[tuple[list[str], list[str]]]:
    """Each session under the thread's: its user messages and tool calls, sorted."""
    out: list[tuple[list[str], list[str]]] = []
    for session_id in await engine.list_sessions():
        if session_id == "t":
            continue
        assert session_id.startswith("t/")
        messages = (await engine.get_session(session_id)).session.messages
        asked = [m.content for m in messages if m.role is Role.USER]
        calls = [c.raw_arguments for m in messages for c in m.tool_calls or ()]
        out.append((asked, calls))
    return sorted(out)


def _map_graph(model: ChatOpenAI, slices: int, path: str) -> Any:
    """plan -> Send("worker", {"messages": [HumanMessage(slice)]}) per slice -> reduce: the
    workers are one ``create_agent`` agent, the reducer answers from the thread's messages."""
    worker = create_agent(model, [lookup], system_prompt="You are a worker.")

    def fan(state: MessagesState) -> list[Send]:
        question = state["messages"][-1].content
        return [
            Send("worker", {"messages": [HumanMessage(f"{question} part {i}")]})
            for i in range(slices)
        ]

    def reduce(state: MessagesState) -> dict[str, Any]:
        reply = model.invoke([SystemMessage("You are the reducer."), *state["messages"]])
        return {"messages": [AIMessage(reply.content, name="reducer")]}

    async def areduce(state: MessagesState) -> dict[str, Any]:
        reply = await model.ainvoke([SystemMessage("You are the reducer."), *state["messages"]])
        return {"messages": [AIMessage(reply.content, name="reducer")]}

    builder = StateGraph(MessagesState)
    builder.add_node("plan", lambda state: {})
    builder.add_node("worker", worker)
    builder.add_node("reduce", reduce if path == "invoke" else areduce)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan, ["worker"])
    builder.add_edge("worker", "reduce")
    return builder.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("slices", [1, 3])
@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_workers_sent_their_own_messages_get_only_those(
    path: str, slices: int, engine: ContextEngine
) -> None:
    """A map step sends each worker agent a slice of the question as its messages, for two
    questions on one thread: each worker's requests hold its slice and its own tool exchange
    only (no sibling's slice, call or result, no earlier question), and the reducer gets the
    thread's messages as the state holds them; every request is the one plain LangGraph
    sends. Each worker's run is recorded in a session of its own."""
    questions = [{"messages": [HumanMessage(q)]} for q in ("Rome", "Paris")]

    def build(model: ChatOpenAI) -> Any:
        return _map_graph(model, slices, path)

    plain = await _run(build, questions, path, None)
    sent = await _run(build, questions, path, engine)

    assert reads(sent) == reads(plain)
    workers = [r for r in map(read, sent) if r[0][2] == "You are a worker."]
    assert len(workers) == 2 * 2 * slices
    for request in workers:
        assert [m for m in request if m[0] == "user"] == [request[1]]
    # the store: each worker's slice and call in a session of its own
    asked = [f"{q} part {i}" for q in ("Rome", "Paris") for i in range(slices)]
    assert await _own_runs(engine) == sorted(([a], [json.dumps({"topic": a})]) for a in asked)
    thread = (await engine.get_session("t")).session.messages
    assert [m.content for m in thread if m.role is Role.USER] == [
        q for q in ("Rome", "Paris") for q in (q, *(a for a in asked if a.startswith(q)))
    ]


class Research(TypedDict, total=False):
    question: str
    a: str
    b: str


def _research_graph(model: ChatOpenAI, nodes: Sequence[str], path: str) -> Any:
    """LangGraph's "call a subgraph inside a node" with another state: each of ``nodes``
    (side by side) asks the researcher agent the question with its own name appended."""
    researcher = create_agent(model, [lookup], system_prompt="You are a researcher.")

    def node(key: str) -> Callable[..., Any]:
        def ask(state: Research) -> dict[str, Any]:
            question = f"{state['question']} {key.upper()}"
            result = researcher.invoke({"messages": [HumanMessage(question)]})
            return {key: result["messages"][-1].content}

        async def aask(state: Research) -> dict[str, Any]:
            question = f"{state['question']} {key.upper()}"
            result = await researcher.ainvoke({"messages": [HumanMessage(question)]})
            return {key: result["messages"][-1].content}

        return ask if path == "invoke" else aask

    builder = StateGraph(Research)
    for key in nodes:
        builder.add_node(key, node(key))
        builder.add_edge(START, key)
    return builder.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("nodes", [("a",), ("a", "b")], ids=["one", "side-by-side"])
@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_an_agent_a_node_asks_a_question_of_its_own_gets_that_question_only(
    path: str, nodes: tuple[str, ...], engine: ContextEngine
) -> None:
    """A node asks an agent a question of its own (a graph whose state holds no messages),
    for two questions on one thread, alone or beside another such node: each agent run's
    requests hold its question and its own tool exchange only, as plain LangGraph sends
    them; each run is recorded in a session of its own under the thread's."""
    questions = [{"question": q} for q in ("capital of France", "capital of Peru")]

    def build(model: ChatOpenAI) -> Any:
        return _research_graph(model, nodes, path)

    plain = await _run(build, questions, path, None)
    sent = await _run(build, questions, path, engine)

    assert reads(sent) == reads(plain)
    for request in map(read, sent):
        assert len([m for m in request if m[0] == "user"]) == 1
    asked = [f"{q['question']} {key.upper()}" for q in questions for key in nodes]
    assert await _own_runs(engine) == sorted(([a], [json.dumps({"topic": a})]) for a in asked)


def _chat_graph(model: ChatOpenAI, path: str) -> Any:
    """research -> chat: ``research`` asks the researcher agent about the newest question
    (messages of its own) and keeps its finding in a system message; ``chat`` hands the
    assistant agent the thread's messages."""
    researcher = create_agent(model, [lookup], system_prompt="You are a researcher.")
    assistant = create_agent(model, [], system_prompt="You are the assistant.")

    def research(state: MessagesState) -> dict[str, Any]:
        question = HumanMessage(f"about {state['messages'][-1].content}")
        found = researcher.invoke({"messages": [question]})["messages"][-1].content
        return {"messages": [AIMessage(f"noted: {found}", name="research")]}

    async def aresearch(state: MessagesState) -> dict[str, Any]:
        question = HumanMessage(f"about {state['messages'][-1].content}")
        found = (await researcher.ainvoke({"messages": [question]}))["messages"][-1].content
        return {"messages": [AIMessage(f"noted: {found}", name="research")]}

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": assistant.invoke({"messages": state["messages"]})["messages"]}

    async def achat(state: MessagesState) -> dict[str, Any]:
        return {"messages": (await assistant.ainvoke({"messages": state["messages"]}))["messages"]}

    builder = StateGraph(MessagesState)
    builder.add_node("research", research if path == "invoke" else aresearch)
    builder.add_node("chat", chat if path == "invoke" else achat)
    builder.add_edge(START, "research")
    builder.add_edge("research", "chat")
    return builder.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_an_agent_handed_the_threads_messages_continues_the_thread(
    path: str, engine: ContextEngine
) -> None:
    """On a thread of messages, a node asks a researcher agent a question of its own and the
    next node hands an assistant agent the thread's messages: the researcher's run is a
    conversation of its own, the assistant's continues the thread (its session holds every
    question and answer); every request is the one plain LangGraph sends."""
    questions = [{"messages": [HumanMessage(q)]} for q in ("Rome", "Paris")]

    def build(model: ChatOpenAI) -> Any:
        return _chat_graph(model, path)

    plain = await _run(build, questions, path, None)
    sent = await _run(build, questions, path, engine)

    assert reads(sent) == reads(plain)
    assert await _own_runs(engine) == [
        (["about Paris"], [json.dumps({"topic": "about Paris"})]),
        (["about Rome"], [json.dumps({"topic": "about Rome"})]),
    ]
    thread = (await engine.get_session("t")).session.messages
    assert [(m.role.value, m.content) for m in thread if m.role is not Role.SYSTEM] == [
        ("user", "Rome"),
        ("assistant", "noted: found from 4 messages: facts about about Rome"),
        ("assistant", "answer from 3 messages"),
        ("user", "Paris"),
        ("assistant", "noted: found from 4 messages: facts about about Paris"),
        ("assistant", "answer from 6 messages"),
    ]
