"""LangGraph nodes that run in one superstep on one ``thread_id`` (a fan-out ``START -> (a, b)``)
each get what the graph gives them: the thread's conversation as the state held it at the step,
plus their own tool loop, never a sibling's in-flight exchange. Real graphs over ChatOpenAI on
the scripted OpenAI server, sync and async: every request body is the one plain LangGraph sends
(tool results fenced), and the thread's session holds the conversation in the state's order,
with the nodes' names."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from scripted import ask_graph
from wire import Read, message_text, read, reads

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse


class _After:
    """The n-th :meth:`wait` returns once :meth:`done` was called n times: one side of a
    parallel step waits for the other's n-th answer, so that answer is made (and, with the
    plugin, recorded) first, on every run."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._done = 0
        self._waits = 0

    def done(self) -> None:
        with self._changed:
            self._done += 1
            self._changed.notify_all()

    def wait(self) -> None:
        with self._changed:
            self._waits += 1
            wanted = self._waits
            assert self._changed.wait_for(lambda: self._done >= wanted, timeout=60)


# the flight agent answers before the hotel search ends; the pessimist before the optimist
_order = {"flights": _After(), "pessimist": _After()}


def _state(messages: Sequence[BaseMessage]) -> list[Read]:
    """A graph state's messages read as a request holds them (a tool result goes unnamed)."""
    roles = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}
    out: list[Read] = []
    for m in messages:
        calls = [c["id"] for c in getattr(m, "tool_calls", None) or ()]
        name = None if m.type == "tool" else m.name
        out.append((roles[m.type], name, " ".join(calls) if calls else str(m.content)))
    return out


@tool
def find_flights(dest: str) -> str:
    """Find flights to a destination."""
    return f"flight AF1 to {dest}"


@tool
def find_hotels(dest: str) -> str:
    """Find hotels at a destination."""
    _order["flights"].wait()
    return f"hotel Ritz in {dest}"


def _agents_script(body: dict[str, Any]) -> ScriptedResponse:
    """The flight or hotel agent (by its system prompt): a question gets its search, a result
    the agent's answer."""
    messages = body["messages"]
    agent = "flights" if "flight" in message_text(messages[0]) else "hotels"
    if messages[-1]["role"] == "user":
        turn = sum(m["role"] == "user" for m in messages)
        dest = message_text(messages[-1]).split()[-1]
        args = json.dumps({"dest": dest})
        return ScriptedResponse(tool_calls=[(f"call_{agent}_{turn}", f"find_{agent}", args)])
    if agent == "flights":
        _order["flights"].done()
    return ScriptedResponse(text=f"{agent} agent done")


def _agents_graph(model: ChatOpenAI) -> Any:
    flights = create_agent(
        model, [find_flights], system_prompt="You are the flight agent.", name="flights"
    )
    hotels = create_agent(
        model, [find_hotels], system_prompt="You are the hotel agent.", name="hotels"
    )
    builder = StateGraph(MessagesState)
    builder.add_node("flights", flights)
    builder.add_node("hotels", hotels)
    builder.add_edge(START, "flights")
    builder.add_edge(START, "hotels")
    return builder.compile(checkpointer=InMemorySaver())


def _panel_script(body: dict[str, Any]) -> ScriptedResponse:
    """The optimist, the pessimist and the judge (by their system prompts); the optimist
    answers later than the pessimist."""
    messages = body["messages"]
    who = message_text(messages[0]).split()[-1].rstrip(".")
    if who == "optimist":
        _order["pessimist"].wait()
    reply = ScriptedResponse(text=f"{who} reply #{len(messages)}")
    if who == "pessimist":
        _order["pessimist"].done()
    return reply


def _panel_graph(model: ChatOpenAI, path: str) -> Any:
    """START -> (optimist, pessimist) -> judge: each node asks the model with its own system
    prompt and the state's messages, and answers in its own name."""

    def node(name: str) -> Callable[..., Any]:
        def ask(state: MessagesState) -> dict[str, Any]:
            reply = model.invoke([SystemMessage(f"You are the {name}."), *state["messages"]])
            return {"messages": [AIMessage(reply.content, name=name)]}

        async def aask(state: MessagesState) -> dict[str, Any]:
            reply = await model.ainvoke([SystemMessage(f"You are the {name}."), *state["messages"]])
            return {"messages": [AIMessage(reply.content, name=name)]}

        return ask if path == "invoke" else aask

    builder = StateGraph(MessagesState)
    for name in ("optimist", "pessimist", "judge"):
        builder.add_node(name, node(name))
    builder.add_edge(START, "optimist")
    builder.add_edge(START, "pessimist")
    builder.add_edge("optimist", "judge")
    builder.add_edge("pessimist", "judge")
    return builder.compile(checkpointer=InMemorySaver())


async def _run(
    script: Callable[[dict[str, Any]], ScriptedResponse],
    build: Callable[[ChatOpenAI], Any],
    questions: Sequence[str],
    thread: str,
    path: str,
    engine: ContextEngine | None,
) -> tuple[list[dict[str, Any]], list[BaseMessage]]:
    """The request bodies of ``questions`` asked on ``thread`` of the graph ``build`` makes
    (with the plugin installed on ``engine``, when given) and the thread's final messages."""
    _order.update(flights=_After(), pessimist=_After())
    with ScriptedOpenAIServer(script) as server:
        if engine is not None:
            ce.langchain.install(engine)
        try:
            model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="sk-test")
            graph = build(model)
            config: Any = {"configurable": {"thread_id": thread}}
            await ask_graph(graph, questions, config, path)
            state = graph.get_state(config).values["messages"]
        finally:
            if engine is not None:
                ce.langchain.uninstall()
        return list(server.requests), state


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_parallel_agents_never_get_each_others_exchanges(
    path: str, engine: ContextEngine
) -> None:
    """Two ``create_agent`` agents run side by side on one thread: the hotel agent's call
    after its search holds its own exchange only (not the flight agent's call, result and
    answer, made meanwhile), and the next question's calls get the thread's conversation in
    the order the graph's state holds it; every request is the one plain LangGraph sends.
    Each agent's run is recorded apart from the other's."""
    questions = ["trip to Paris", "trip to Rome"]
    plain, _ = await _run(_agents_script, _agents_graph, questions, "trip", path, None)
    sent, state = await _run(_agents_script, _agents_graph, questions, "trip", path, engine)

    assert reads(sent) == reads(plain)
    hotel_results = [r for r in map(read, sent) if r[-1] == ("tool", None, "hotel Ritz in Paris")]
    # (the name on the agent's reply: create_agent sets it in later langchain releases only)
    assert [[(role, text) for role, _, text in r] for r in hotel_results] == [
        [
            ("system", "You are the hotel agent."),
            ("user", "trip to Paris"),
            ("assistant", "call_hotels_1"),
            ("tool", "hotel Ritz in Paris"),
        ]
    ]
    before_rome = _state(state)[: _state(state).index(("user", None, "trip to Rome")) + 1]
    rome = [r[1:] for r in map(read, sent) if r[-1] == ("user", None, "trip to Rome")]
    assert rome == [before_rome, before_rome]

    # each agent's turn is recorded in a branch of the thread: the state it was given, then
    # its own exchange only
    turns: list[tuple[str, list[str]]] = []
    for session_id in await engine.list_sessions():
        assert session_id.startswith("trip/")
        messages = (await engine.get_session(session_id)).session.messages
        asked = max(i for i, m in enumerate(messages) if m.role is Role.USER)
        own = [c.name for m in messages[asked:] for c in m.tool_calls or ()]
        turns.append((messages[asked].content, own))
    assert sorted(turns) == [
        ("trip to Paris", ["find_flights"]),
        ("trip to Paris", ["find_hotels"]),
        ("trip to Rome", ["find_flights"]),
        ("trip to Rome", ["find_hotels"]),
    ]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_parallel_nodes_replies_reach_the_judge_in_the_states_order(
    path: str, engine: ContextEngine
) -> None:
    """A fan-out of two nodes, then a judge, on one thread for two questions: the judge (and
    every later call) receives the nodes' replies in the graph state's order with their names,
    as without the engine, not in the order they finished with the first one unnamed; the
    thread's session holds the conversation so, without the nodes' own system prompts."""
    questions = ["Should I buy a boat?", "And a car?"]

    def build(model: ChatOpenAI) -> Any:
        return _panel_graph(model, path)

    plain, _ = await _run(_panel_script, build, questions, "t1", path, None)
    sent, state = await _run(_panel_script, build, questions, "t1", path, engine)

    assert reads(sent) == reads(plain)
    judge = [read(r) for r in sent if message_text(r["messages"][0]) == "You are the judge."]
    assert [r[1:] for r in judge] == [
        [
            ("user", None, "Should I buy a boat?"),
            ("assistant", "optimist", "optimist reply #2"),
            ("assistant", "pessimist", "pessimist reply #2"),
        ],
        _state(state)[:-1],
    ]
    doc = await engine.get_session("t1")
    stored = [(m.role.value, m.name, m.content) for m in doc.session.messages]
    # the judge's replies are the thread's own calls' replies, stored as the model made them
    assert [s for s in stored if s[0] != "system"] == [
        s if s[1] != "judge" else (s[0], None, s[2]) for s in _state(state)
    ]
    assert not any(m.role is Role.SYSTEM and "optimist" in m.content for m in doc.session.messages)


def _trimmed_graph(model: ChatOpenAI) -> Any:
    """START -> chat -> (trim, log): ``trim`` removes all but the newest two messages while
    ``log``, a node of no model call, runs beside it."""

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def trim(state: MessagesState) -> dict[str, Any]:
        return {"messages": [RemoveMessage(id=m.id or "") for m in state["messages"][:-2]]}

    def log(state: MessagesState) -> dict[str, Any]:
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_node("trim", trim)
    builder.add_node("log", log)
    builder.add_edge(START, "chat")
    builder.add_edge("chat", "trim")
    builder.add_edge("chat", "log")
    return builder.compile(checkpointer=InMemorySaver())


async def test_a_node_beside_another_that_removes_the_oldest_messages_cuts_the_thread(
    engine: ContextEngine,
) -> None:
    """A node that removes the oldest messages of the thread, run beside another node, cuts
    them from the thread's session as it does alone: the next question's call gets what the
    graph passes."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text=f"ANSWER to {message_text(body['messages'][-1])}")

    questions = ["q1", "q2", "q3"]
    sent, _ = await _run(script, _trimmed_graph, questions, "t", "invoke", engine)
    assert [r[2] for r in read(sent[-1])] == ["q2", "ANSWER to q2", "q3"]
