"""One invocation that names no session, several unrelated model calls: each call gets its
own messages, as without the plugin. A map-reduce summary (the map calls batched, then the
reduce call) and a chain that prompts for a draft and then for its critique; an agent's tool
loop in the same kind of run still continues its own conversation."""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from scripted import Scripted

import ce.langchain
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.integration import RUN_SESSION_PREFIX
from ce.core.schema import Role
from ce.core.testing import deterministic_engine


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    yield engine
    await engine.close()


def answer(messages: list[BaseMessage]) -> str:
    return f"About {str(messages[-1].content)[:24]}"


def map_reduce(model: Scripted) -> Any:
    system = ("system", "You summarise.")
    map_chain = (
        ChatPromptTemplate.from_messages([system, ("user", "Summarize: {chunk}")])
        | model
        | StrOutputParser()
    )
    reduce_chain = (
        ChatPromptTemplate.from_messages([system, ("user", "Combine: {summaries}")])
        | model
        | StrOutputParser()
    )

    def run(chunks: list[str]) -> str:
        summaries = map_chain.batch([{"chunk": chunk} for chunk in chunks])
        return str(reduce_chain.invoke({"summaries": "\n".join(summaries)}))

    return RunnableLambda(run)


def draft_then_critique(model: Scripted) -> Any:
    draft = ChatPromptTemplate.from_messages([("user", "Write a haiku about {topic}.")])
    critique = ChatPromptTemplate.from_messages(
        [("system", "You are a strict critic."), ("user", "Critique: {draft}")]
    )
    return draft | model | StrOutputParser() | (lambda text: {"draft": text}) | critique | model


def _seen(app: Any, inputs: Any, engine: ContextEngine | None) -> list[list[tuple[str, str]]]:
    model = Scripted(script=answer)
    runnable = app(model)
    if engine is not None:
        ce.langchain.install(engine)
    runnable.invoke(inputs)
    if engine is not None:
        ce.langchain.uninstall()
    return [[(m.type, str(m.content)) for m in seen] for seen in model.seen]


@pytest.mark.parametrize(
    ("app", "inputs", "calls"),
    [
        (map_reduce, ["chunk one text", "chunk two text", "chunk three text"], 4),
        (draft_then_critique, {"topic": "cats"}, 2),
    ],
)
async def test_unrelated_calls_of_one_run_each_get_their_own_messages(
    engine: ContextEngine, app: Any, inputs: Any, calls: int
) -> None:
    native = _seen(app, inputs, None)
    sent = _seen(app, inputs, engine)
    assert len(sent) == len(native) == calls
    assert sorted(sent) == sorted(native)  # batched map calls may run in any order
    # one session for the run's first call, one child per unrelated call, each holding
    # its own question and answer only
    sessions = [s for s in await engine.list_sessions() if s.startswith(RUN_SESSION_PREFIX)]
    assert len(sessions) == calls
    for session in sessions:
        doc = await engine.get_session(session)
        assert [m.role for m in doc.session.messages if m.role is not Role.SYSTEM] == [
            Role.USER,
            Role.ASSISTANT,
        ]


async def test_map_calls_batched_on_the_event_loop_each_get_their_own(
    engine: ContextEngine,
) -> None:
    """``abatch`` starts the map calls within the same millisecond on one loop: each still
    gets a scope of its own (named by the random part of its run id, not the time part)."""
    model = Scripted(script=answer)
    prompt = ChatPromptTemplate.from_messages([("user", "Summarize: {chunk}")])
    map_chain = prompt | model | StrOutputParser()

    async def run(chunks: list[str]) -> list[str]:
        return await map_chain.abatch([{"chunk": chunk} for chunk in chunks])

    ce.langchain.install(engine)
    chunks = [f"chunk {n} text" for n in range(8)]
    await RunnableLambda(run).ainvoke(chunks)
    await engine.flush()
    assert sorted(str(seen[-1].content) for seen in model.seen) == [
        f"Summarize: {c}" for c in chunks
    ]
    assert all(len(seen) == 1 for seen in model.seen)
    sessions = [s for s in await engine.list_sessions() if s.startswith(RUN_SESSION_PREFIX)]
    assert len(sessions) == len(chunks)


class Jokes(TypedDict):
    topic: str
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]
    best: str


def joke_graph(model: Scripted) -> Any:
    """LangGraph's map-reduce: a topic node, one joke node per subject (``Send``), a node that
    picks the best; the state holds fields, no messages."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    def subjects(state: Jokes) -> dict[str, Any]:
        reply = model.invoke(f"Generate 3 subjects related to {state['topic']}")
        return {"subjects": str(reply.content).split(", ")}

    def joke(state: dict[str, Any]) -> dict[str, Any]:
        return {"jokes": [str(model.invoke(f"Write a joke about {state['subject']}").content)]}

    def best(state: Jokes) -> dict[str, Any]:
        return {"best": str(model.invoke("Pick the best:\n" + "\n".join(state["jokes"])).content)}

    graph = StateGraph(Jokes)
    graph.add_node("subjects", subjects)
    graph.add_node("joke", joke)
    graph.add_node("best", best)
    graph.add_edge(START, "subjects")
    graph.add_conditional_edges(
        "subjects", lambda s: [Send("joke", {"subject": x}) for x in s["subjects"]], ["joke"]
    )
    graph.add_edge("joke", "best")
    graph.add_edge("best", END)
    return graph.compile(checkpointer=InMemorySaver())


def jokes_script(messages: list[BaseMessage]) -> str:
    prompt = str(messages[-1].content)
    if prompt.startswith("Generate"):
        return "lions, owls, bees"
    if prompt.startswith("Write a joke"):
        return "JOKE about " + prompt.split()[-1]
    return "the first"


async def test_a_graph_of_prompts_on_a_thread_sends_each_prompt_alone(
    engine: ContextEngine,
) -> None:
    """A LangGraph graph whose state holds no messages (map-reduce with ``Send``), compiled
    with a checkpointer and invoked twice on one ``thread_id``: every model call gets its own
    prompt alone, as without the plugin (each is its node's own work, in a child scope of the
    thread), never the other nodes' prompts and answers nor the first invocation's."""
    config = {"configurable": {"thread_id": "jokes-1"}}
    sent: dict[bool, list[list[tuple[str, str]]]] = {}
    for installed in (False, True):
        model = Scripted(script=jokes_script)
        graph = joke_graph(model)
        if installed:
            ce.langchain.install(engine)
        for _ in range(2):
            await graph.ainvoke({"topic": "animals", "jokes": []}, config)
        if installed:
            ce.langchain.uninstall()
        sent[installed] = [[(m.type, str(m.content)) for m in seen] for seen in model.seen]
    assert len(sent[True]) == 10
    assert sorted(sent[True]) == sorted(sent[False])  # the Send calls run in any order
    assert all(len(seen) == 1 for seen in sent[True])
    await engine.flush()
    sessions = await engine.list_sessions()
    assert "jokes-1" not in sessions  # no call was a turn of the thread's conversation
    children = [s for s in sessions if s.startswith("jokes-1/")]
    assert len(children) == 10
    for child in children:
        doc = await engine.get_session(child)
        assert [m.role for m in doc.session.messages] == [Role.USER, Role.ASSISTANT]
