"""A LangGraph thread the app starts over — ``update_state`` with
``RemoveMessage(id=REMOVE_ALL_MESSAGES)`` (LangGraph's way to clear a thread's messages), or a
node that removes every message of the state — gets none of its earlier conversation back
from the thread's session: the model receives what the graph passes, as without the engine.
An update that keeps the newest messages is a cut of the older ones; other threads and
sessions are untouched; the session keeps every message stored.

Driven over langchain-openai's ``ChatOpenAI`` on the scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import BaseMessage, RemoveMessage
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.pregel import Pregel
from scripted import ask_graph, history_chain, replies, texts, user_texts

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

REMOVE_ALL = {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES)]}


def _script(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text=f"ANSWER to {body['messages'][-1]['content']}")


def _graph(llm: ChatOpenAI, path: str, reset_at: int | None = None) -> Any:
    """A chat node; with ``reset_at``, then a node that removes every message once the state
    holds that many."""

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    async def achat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        return "reset" if reset_at and len(state["messages"]) >= reset_at else END

    graph = StateGraph(MessagesState)
    graph.add_node("chat", achat if path == "ainvoke" else chat)
    graph.add_node("reset", lambda state: REMOVE_ALL)
    graph.add_edge(START, "chat")
    graph.add_conditional_edges("chat", route)
    graph.add_edge("reset", END)
    return graph.compile(checkpointer=InMemorySaver())


@contextmanager
def _installed(
    engine: ContextEngine, path: str, reset_at: int | None = None
) -> Iterator[tuple[Any, ScriptedOpenAIServer]]:
    """The graph of :func:`_graph` on the scripted server, the plugin installed."""
    with ScriptedOpenAIServer(_script) as server:
        llm = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="k", max_retries=0)
        graph = _graph(llm, path, reset_at)
        ce.langchain.install(engine)
        yield graph, server


def _sent(server: ScriptedOpenAIServer) -> list[list[str]]:
    return [[str(m["content"]) for m in r["messages"]] for r in server.requests]


async def _update(graph: Any, config: Any, values: Any, path: str) -> None:
    if path == "invoke":
        graph.update_state(config, values)
    else:
        await graph.aupdate_state(config, values)


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_thread_cleared_with_update_state_starts_over(
    engine: ContextEngine, path: str
) -> None:
    with _installed(engine, path) as (graph, server):
        mine, other = {"configurable": {"thread_id": "t"}}, {"configurable": {"thread_id": "u"}}
        await ask_graph(graph, ("secret q1", "q2"), mine, path)
        await ask_graph(graph, ("other q1",), other, path)

        await _update(graph, mine, REMOVE_ALL, path)
        await ask_graph(graph, ("fresh q",), mine, path)
        await ask_graph(graph, ("other q2",), other, path)

        sent = _sent(server)
    assert sent[-2] == ["fresh q"]
    assert sent[-1] == ["other q1", "ANSWER to other q1", "other q2"]  # its own thread kept
    await engine.flush()
    stored = [m.content for m in (await engine.get_session("t")).session.messages]
    assert stored[:2] == ["secret q1", "ANSWER to secret q1"]  # every message stays stored


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_an_update_keeping_the_newest_messages_cuts_the_older_ones(
    engine: ContextEngine, path: str
) -> None:
    with _installed(engine, path) as (graph, server):
        config = {"configurable": {"thread_id": "t"}}
        await ask_graph(graph, ("q1", "q2"), config, path)
        state: list[BaseMessage] = graph.get_state(config).values["messages"]
        kept = {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *state[-2:]]}
        await _update(graph, config, kept, path)
        await ask_graph(graph, ("q3",), config, path)
        sent = _sent(server)
    assert sent[-1] == ["q2", "ANSWER to q2", "q3"]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_node_that_removes_every_message_starts_the_thread_over(
    engine: ContextEngine, path: str
) -> None:
    # the second turn's run ends with a reset
    with _installed(engine, path, reset_at=4) as (graph, server):
        await ask_graph(graph, ("q1", "q2", "q3"), {"configurable": {"thread_id": "t"}}, path)
        sent = _sent(server)
    assert sent[-1] == ["q3"]  # nothing of the turns before the reset, its own run's included


async def test_a_named_session_is_cleared_by_an_update_of_its_config(
    engine: ContextEngine,
) -> None:
    with _installed(engine, "invoke") as (graph, server):
        config = {"configurable": {"thread_id": "t"}, "metadata": {"ce_session_id": "user-7"}}
        await ask_graph(graph, ("secret q1",), config, "invoke")
        graph.update_state(config, REMOVE_ALL)
        await ask_graph(graph, ("fresh q",), config, "invoke")
        sent = _sent(server)
    assert sent[-1] == ["fresh q"]
    assert await engine.store.get_session("t") is None  # the thread's session was never used


def test_uninstall_puts_langgraphs_state_updates_back(engine: ContextEngine) -> None:
    originals = (Pregel.__dict__["bulk_update_state"], Pregel.__dict__["abulk_update_state"])
    ce.langchain.install(engine)
    assert Pregel.__dict__["bulk_update_state"] is not originals[0]
    assert Pregel.__dict__["abulk_update_state"] is not originals[1]
    ce.langchain.uninstall()
    assert (Pregel.__dict__["bulk_update_state"], Pregel.__dict__["abulk_update_state"]) == (
        originals
    )


# -- RunnableWithMessageHistory: the app clears a user's history --------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # still shipped, deprecated
@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_cleared_message_history_starts_its_session_over(
    engine: ContextEngine, path: str
) -> None:
    model = replies("Hello Alice.", "Hello Bob.", "Hi again.", "Bob, ZEBRA.")
    histories: dict[str, InMemoryChatMessageHistory] = {}
    chain = history_chain(model, histories)
    ce.langchain.install(engine)

    async def ask(question: str, user: str) -> None:
        config = {"configurable": {"session_id": user}}
        if path == "invoke":
            await asyncio.to_thread(chain.invoke, {"question": question}, config)
        else:
            await chain.ainvoke({"question": question}, config)

    await ask("I am Alice, my word is ALPACA.", "alice")
    await ask("I am Bob, my word is ZEBRA.", "bob")
    if path == "invoke":
        histories["alice"].clear()
    else:
        await histories["alice"].aclear()
    await ask("Who am I?", "alice")
    await ask("What is my word?", "bob")

    after_clear, bobs = (texts(seen) for seen in model.seen[2:])
    assert "ALPACA" not in after_clear and "Hello Alice." not in after_clear
    assert "Who am I?" in after_clear
    assert "ZEBRA" in bobs and "Hello Bob." in bobs  # the other user's history goes on
    assert "I am Alice, my word is ALPACA." in await user_texts(engine, "alice")  # stored


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_uninstall_puts_a_used_history_classs_clear_back(engine: ContextEngine) -> None:
    originals = (InMemoryChatMessageHistory.clear, InMemoryChatMessageHistory.aclear)
    chain = history_chain(replies("ok"), {})
    ce.langchain.install(engine)
    await chain.ainvoke({"question": "hi"}, {"configurable": {"session_id": "u"}})
    assert InMemoryChatMessageHistory.clear is not originals[0]  # wrapped once a run used it
    ce.langchain.uninstall()
    assert (InMemoryChatMessageHistory.clear, InMemoryChatMessageHistory.aclear) == originals


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_thread_deleted_and_used_again_starts_over(
    engine: ContextEngine, path: str
) -> None:
    with _installed(engine, path) as (graph, server):
        mine, other = {"configurable": {"thread_id": "t"}}, {"configurable": {"thread_id": "u"}}
        await ask_graph(graph, ("secret q1",), mine, path)
        await ask_graph(graph, ("other q1",), other, path)
        if path == "invoke":
            graph.checkpointer.delete_thread("t")
        else:
            await graph.checkpointer.adelete_thread("t")
        await ask_graph(graph, ("fresh q",), mine, path)
        await ask_graph(graph, ("other q2",), other, path)
        sent = _sent(server)
    assert sent[-2] == ["fresh q"]
    assert sent[-1] == ["other q1", "ANSWER to other q1", "other q2"]


def test_uninstall_puts_the_checkpointers_deletes_back(engine: ContextEngine) -> None:
    originals = (InMemorySaver.delete_thread, InMemorySaver.adelete_thread)
    ce.langchain.install(engine)
    assert InMemorySaver.delete_thread is not originals[0]

    class OwnSaver(InMemorySaver):  # a saver defined after install is covered too
        def delete_thread(self, thread_id: str) -> None:
            super().delete_thread(thread_id)

    assert getattr(OwnSaver.delete_thread, "__wrapped__", None) is not None
    ce.langchain.uninstall()
    assert (InMemorySaver.delete_thread, InMemorySaver.adelete_thread) == originals
    assert getattr(OwnSaver.delete_thread, "__wrapped__", None) is None
