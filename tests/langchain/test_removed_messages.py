"""A LangGraph node that removes the oldest messages of its state (``RemoveMessage``, in its
update or a ``Command``'s; ``REMOVE_ALL_MESSAGES`` with the newest ones re-added) tells the
engine: the thread's session no longer sends them. A removal that is not of the oldest
messages changes nothing (the engine is told of a prefix only).

Driven over langchain-openai's ``ChatOpenAI`` on the scripted OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.types import Command
from scripted import ask_graph

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

STATE = [
    HumanMessage("q1", id="1"),
    AIMessage("a1", id="2"),
    HumanMessage("q2", id="3"),
    AIMessage("a2", id="4"),
]
SUMMARY = HumanMessage("summary of q1", id="s", additional_kwargs={"lc_source": "summarization"})


def _texts(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages]


def test_only_a_removal_of_the_oldest_messages_is_a_cut() -> None:
    from ce.langchain._record import removed_prefix

    def remove(*ids: str) -> list[RemoveMessage]:
        return [RemoveMessage(id=i) for i in ids]

    assert _texts(removed_prefix(STATE, {"messages": remove("1", "2")})) == ["q1", "a1"]
    assert _texts(removed_prefix(STATE, Command(update={"messages": remove("1")}))) == ["q1"]
    pairs = Command(update=[("summary", "x"), ("messages", remove("2", "1"))])
    assert _texts(removed_prefix(STATE, pairs)) == ["q1", "a1"]
    assert _texts(removed_prefix(STATE, [{"messages": remove("1")}])) == ["q1"]
    assert removed_prefix(STATE, {"messages": remove("2")}) == []  # not the oldest
    assert removed_prefix(STATE, {"messages": remove("1", "3")}) == []
    assert removed_prefix(STATE, {"messages": [AIMessage("a3")]}) == []  # no removal
    assert removed_prefix(STATE, {"summary": "x"}) == []
    assert removed_prefix(STATE, None) == []
    # everything removed, the newest re-added: a prefix; one in the middle re-added: none
    readded = [RemoveMessage(id=REMOVE_ALL_MESSAGES), STATE[2], STATE[3]]
    assert _texts(removed_prefix(STATE, {"messages": readded})) == ["q1", "a1"]
    middle = [RemoveMessage(id=REMOVE_ALL_MESSAGES), STATE[1], STATE[3]]
    assert removed_prefix(STATE, {"messages": middle}) == []
    alone = [RemoveMessage(id=REMOVE_ALL_MESSAGES), AIMessage("a fresh start")]
    assert _texts(removed_prefix(STATE, {"messages": alone})) == _texts(STATE)
    # a SummarizationMiddleware summary is no turn of the conversation
    assert _texts(removed_prefix([SUMMARY, *STATE], {"messages": remove("s", "1")})) == ["q1"]


def _script(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text=f"ANSWER to {body['messages'][-1]['content']}")


def _graph(llm: ChatOpenAI, trim: Any, async_nodes: bool) -> Any:
    """A chat node, then a node that returns ``trim(state)`` (its removals) once the state
    holds four messages."""

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    async def achat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def trimmer(state: MessagesState) -> Any:
        return trim(state["messages"])

    def route(state: MessagesState) -> str:
        return "trim" if len(state["messages"]) >= 4 else END

    graph = StateGraph(MessagesState)
    graph.add_node("chat", achat if async_nodes else chat)
    graph.add_node("trim", trimmer)
    graph.add_edge(START, "chat")
    graph.add_conditional_edges("chat", route)
    graph.add_edge("trim", END)
    return graph.compile(checkpointer=InMemorySaver())


def _keep_last_two(messages: list[BaseMessage]) -> Any:
    return Command(update={"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages[-2:]]})


def _drop_second(messages: list[BaseMessage]) -> Any:
    return {"messages": [RemoveMessage(id=messages[1].id or "")]}


async def _run(engine: ContextEngine, trim: Any, path: str) -> list[list[str]]:
    with ScriptedOpenAIServer(_script) as server:
        llm = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="k", max_retries=0)
        graph = _graph(llm, trim, async_nodes=path == "ainvoke")
        ce.langchain.install(engine)
        config = {"configurable": {"thread_id": "t"}}
        await ask_graph(graph, ("q1", "q2", "q3"), config, path)
        ce.langchain.uninstall()
        return [[str(m["content"]) for m in r["messages"]] for r in server.requests]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_all_removed_but_the_newest_two_are_no_longer_sent(
    engine: ContextEngine, path: str
) -> None:
    sent = await _run(engine, _keep_last_two, path)
    assert sent[-1] == ["q2", "ANSWER to q2", "q3"]
    await engine.flush()
    doc = await engine.get_session("t")
    assert [m.content for m in doc.session.messages][:2] == ["q1", "ANSWER to q1"]  # stored


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_removal_in_the_middle_changes_nothing(engine: ContextEngine, path: str) -> None:
    sent = await _run(engine, _drop_second, path)
    assert sent[-1] == ["q1", "ANSWER to q1", "q2", "ANSWER to q2", "q3"]
    await engine.flush()
    assert (await engine.get_session("t")).session.summary is None
