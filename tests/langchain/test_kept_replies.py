"""A reply joins a named conversation when the app keeps it. In a LangGraph node whose state
holds messages, the node's update says so (a checker node keeps its verdict in another key);
in a ``RunnableWithMessageHistory`` run, the output the history keeps says so (the standalone
question a conversational RAG chain retrieves with is not its answer). A reply the app does
not keep is stored as its call's output only, never sent as a turn of the conversation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AnyMessage, BaseMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnablePassthrough
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from scripted import Scripted, ask_graph

import ce.langchain
from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import EvidenceType, Role
from ce.core.testing import deterministic_engine

CONTEXTUALIZE = "Given a chat history and the latest question, write a standalone question."
ANSWER = "Answer the question."
CHECK = "You check answers. Reply VERDICT: ok or VERDICT: bad."


@pytest.fixture
async def engine() -> AsyncIterator[ContextEngine]:
    engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o"))
    yield engine
    await engine.close()


def script(messages: list[BaseMessage]) -> str:
    system = str(messages[0].content) if messages and messages[0].type == "system" else ""
    if system == CONTEXTUALIZE:
        return f"STANDALONE({messages[-1].content})"
    if system == CHECK:
        return "VERDICT: ok"
    return f"ANSWER to {messages[-1].content}"


def _turns(seen: list[list[BaseMessage]]) -> list[list[tuple[str, str]]]:
    return [[(m.type, str(m.content)) for m in call if m.type != "system"] for call in seen]


def conversational_rag(model: Scripted) -> Any:
    """LangChain's conversational RAG: a history-aware call rewrites the question, the
    retrieval uses it, the answer call gets the history and the question."""
    contextualize = ChatPromptTemplate.from_messages(
        [("system", CONTEXTUALIZE), MessagesPlaceholder("chat_history"), ("human", "{input}")]
    )
    answer = ChatPromptTemplate.from_messages(
        [("system", ANSWER), MessagesPlaceholder("chat_history"), ("human", "{input}")]
    )

    def context(inputs: dict[str, Any]) -> str:
        if not inputs.get("chat_history"):
            return str(inputs["input"])
        return str((contextualize | model | StrOutputParser()).invoke(inputs))

    chain = RunnablePassthrough.assign(context=context).assign(
        answer=answer | model | StrOutputParser()
    )
    histories: dict[str, InMemoryChatMessageHistory] = {}
    return RunnableWithMessageHistory(
        chain,
        lambda session_id: histories.setdefault(session_id, InMemoryChatMessageHistory()),
        input_messages_key="input",
        history_messages_key="chat_history",
        output_messages_key="answer",
    )


QUESTIONS = ["What is task decomposition?", "How is it done?", "Any examples?"]


async def test_a_rewritten_question_is_no_turn_of_the_conversation(
    engine: ContextEngine,
) -> None:
    seen: dict[bool, list[list[tuple[str, str]]]] = {}
    for installed in (False, True):
        model = Scripted(script=script)
        chain = conversational_rag(model)
        if installed:
            ce.langchain.install(engine)
        for question in QUESTIONS:
            await chain.ainvoke({"input": question}, {"configurable": {"session_id": "u1"}})
        if installed:
            ce.langchain.uninstall()
        seen[installed] = _turns(model.seen)
    assert len(seen[True]) == 5
    assert seen[True] == seen[False]  # each call's turns as the app sent them
    await engine.flush()
    doc = await engine.get_session("u1")
    held = [(m.role, m.content) for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert held == [
        item
        for question in QUESTIONS
        for item in ((Role.USER, question), (Role.ASSISTANT, f"ANSWER to {question}"))
    ]
    outputs = [e.content for e in doc.evidences.values() if e.type is EvidenceType.LLM_OUTPUT]
    assert "STANDALONE(How is it done?)" in outputs  # the rewrite: its call's output only


class Checked(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    verdict: str


def checked_graph(model: Scripted) -> Any:
    """A node answers the conversation; a checker node asks the model about it and keeps
    its verdict in a key of its own."""

    def answer(state: Checked) -> dict[str, Any]:
        return {"messages": [model.invoke([SystemMessage(ANSWER), *state["messages"]])]}

    def check(state: Checked) -> dict[str, Any]:
        verdict = model.invoke([SystemMessage(CHECK), *state["messages"]])
        return {"verdict": str(verdict.content)}

    graph = StateGraph(Checked)
    graph.add_node("answer", answer)
    graph.add_node("check", check)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", "check")
    graph.add_edge("check", END)
    return graph.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_checkers_verdict_kept_outside_the_messages_is_no_turn(
    engine: ContextEngine, path: str
) -> None:
    config = {"configurable": {"thread_id": "t-check"}}
    seen: dict[bool, list[list[tuple[str, str]]]] = {}
    for installed in (False, True):
        model = Scripted(script=script)
        graph = checked_graph(model)
        if installed:
            ce.langchain.install(engine)
        await ask_graph(graph, ("What is 2+2?", "And 3+3?"), config, path)
        if installed:
            ce.langchain.uninstall()
        seen[installed] = _turns(model.seen)
    assert len(seen[True]) == 4
    assert seen[True] == seen[False]
    await engine.flush()
    doc = await engine.get_session("t-check")
    said = [m.content for m in doc.session.messages if m.role is Role.ASSISTANT]
    assert said == ["ANSWER to What is 2+2?", "ANSWER to And 3+3?"]
    outputs = [e.content for e in doc.evidences.values() if e.type is EvidenceType.LLM_OUTPUT]
    assert "VERDICT: ok" in outputs
