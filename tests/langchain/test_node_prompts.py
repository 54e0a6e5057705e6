"""A LangGraph node that adds a prompt of its own after the conversation, or sends the
conversation rewritten, makes a call of its own: the two app shapes of LangGraph's docs.

- The "add summary of the conversation history" how-to: a ``summarize_conversation`` node
  sends the state's messages followed by "Create a summary of the conversation above:" and
  keeps the reply in a ``summary`` key. The prompt is no user turn of the thread: the later
  calls never get it, and the summarizer gets its request as the app sends it.
- The reflection tutorial: a ``reflect`` node sends the first message and then the
  conversation with its roles swapped (the drafts as user messages, the critiques as
  assistant ones). Each call gets each draft once, with the role the app chose for that call.

Driven over langchain-openai's ``ChatOpenAI`` on the scripted OpenAI-compatible server; each
graph runs once without the plugin and once with it, and the request bodies are compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from scripted import ask_graph

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

Body = list[tuple[str, str]]

CREATE = "Create a summary of the conversation above:"
EXTEND = "Extend the summary by taking into account the new messages above:"
QUESTIONS = [
    "hi! I'm bob",
    "what's my name?",
    "i like the celtics!",
    "who do I like?",
    "and what's my name again?",
    "bye",
]


def _bodies(requests: Sequence[dict[str, Any]]) -> list[Body]:
    return [[(m["role"], str(m.get("content"))) for m in r["messages"]] for r in requests]


def summary_script(body: dict[str, Any]) -> ScriptedResponse:
    last = str(body["messages"][-1]["content"])
    if last.endswith((CREATE, EXTEND)):
        asked = [str(m["content"]) for m in body["messages"] if m["role"] == "user"]
        return ScriptedResponse(text="SUMMARY of " + " | ".join(asked[:-1]))
    return ScriptedResponse(text=f"ANSWER to {last}")


class SummaryState(MessagesState):
    summary: str


def summary_graph(llm: ChatOpenAI, async_nodes: bool) -> Any:
    """LangGraph's "add summary of the conversation history" how-to: past four messages,
    a node summarizes the conversation (extending the summary it has) and removes all but
    the last two messages; the conversation node sends the summary as a system message."""

    def conversation(state: SummaryState) -> list[BaseMessage]:
        summary = state.get("summary", "")
        if not summary:
            return list(state["messages"])
        return [SystemMessage(f"Summary of conversation earlier: {summary}"), *state["messages"]]

    def summary_prompt(state: SummaryState) -> list[BaseMessage]:
        summary = state.get("summary", "")
        if summary:
            prompt = f"This is summary of the conversation to date: {summary}\n\n{EXTEND}"
        else:
            prompt = CREATE
        return [*state["messages"], HumanMessage(content=prompt)]

    def summarized(state: SummaryState, response: BaseMessage) -> dict[str, Any]:
        removed = [RemoveMessage(id=m.id) for m in state["messages"][:-2] if m.id]
        return {"summary": response.content, "messages": removed}

    def call_model(state: SummaryState) -> dict[str, Any]:
        return {"messages": [llm.invoke(conversation(state))]}

    def summarize_conversation(state: SummaryState) -> dict[str, Any]:
        return summarized(state, llm.invoke(summary_prompt(state)))

    async def acall_model(state: SummaryState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(conversation(state))]}

    async def asummarize_conversation(state: SummaryState) -> dict[str, Any]:
        return summarized(state, await llm.ainvoke(summary_prompt(state)))

    def should_continue(state: SummaryState) -> str:
        return "summarize_conversation" if len(state["messages"]) > 4 else END

    graph = StateGraph(SummaryState)
    graph.add_node("conversation", acall_model if async_nodes else call_model)
    graph.add_node(
        "summarize_conversation", asummarize_conversation if async_nodes else summarize_conversation
    )
    graph.add_edge(START, "conversation")
    graph.add_conditional_edges("conversation", should_continue)
    graph.add_edge("summarize_conversation", END)
    return graph.compile(checkpointer=InMemorySaver())


def _summarizes(body: Body) -> bool:
    return body[-1][1].endswith((CREATE, EXTEND))


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_summarizer_nodes_prompt_is_no_turn_of_the_thread(
    engine: ContextEngine, path: str
) -> None:
    config = {"configurable": {"thread_id": "bob"}}
    sent: dict[bool, list[Body]] = {}
    for installed in (False, True):
        with ScriptedOpenAIServer(summary_script) as server:
            llm = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="k", max_retries=0)
            graph = summary_graph(llm, async_nodes=path == "ainvoke")
            if installed:
                ce.langchain.install(engine)
            await ask_graph(graph, QUESTIONS, config, path)
            if installed:
                ce.langchain.uninstall()
            sent[installed] = _bodies(server.requests)
    assert len(sent[True]) == len(sent[False]) == 8
    summarizer = [i for i, body in enumerate(sent[False]) if _summarizes(body)]
    assert summarizer == [3, 6]
    for i in summarizer:  # a call of its own: the app's request as it is
        assert sent[True][i] == sent[False][i]
    for i, body in enumerate(sent[True]):  # the conversation never gets the node's prompt
        if i not in summarizer:
            assert not any(CREATE in text or EXTEND in text for _, text in body)
    # the turns the summarize node removed from the state are no longer sent: the app's
    # summary, the two messages it kept and the new question
    first = "SUMMARY of hi! I'm bob | what's my name? | i like the celtics!"
    assert sent[True][4] == [
        ("system", f"Summary of conversation earlier: {first}"),
        ("user", QUESTIONS[2]),
        ("assistant", f"ANSWER to {QUESTIONS[2]}"),
        ("user", QUESTIONS[3]),
    ]
    second = "SUMMARY of i like the celtics! | who do I like? | and what's my name again?"
    assert sent[True][7] == [
        ("system", f"Summary of conversation earlier: {second}"),
        ("user", QUESTIONS[4]),
        ("assistant", f"ANSWER to {QUESTIONS[4]}"),
        ("user", QUESTIONS[5]),
    ]
    for i, removed in ((4, QUESTIONS[:2]), (5, QUESTIONS[:2]), (7, QUESTIONS[:4])):
        texts = [text for _, text in sent[True][i]]
        assert not any(text.endswith(q) for text in texts[1:] for q in removed)
    assert sent[True] == sent[False]  # every call as the app sends it without the engine
    await engine.flush()
    assert await _user_texts(engine, "bob") == QUESTIONS  # the removed turns stay stored
    cut = (await engine.get_session("bob")).session.summary
    assert cut is not None and cut.source == "app"
    children = [s for s in await engine.list_sessions() if s.startswith("bob/")]
    assert sorted(c.split("/")[1].split(":")[0] for c in children) == ["summarize_conversation"] * 2


async def _user_texts(engine: ContextEngine, session_id: str) -> list[str]:
    doc = await engine.get_session(session_id)
    return [m.content for m in doc.session.messages if m.role is Role.USER]


WRITER = "You are an essay assistant tasked with writing excellent 5-paragraph essays."
TEACHER = "You are a teacher grading an essay submission. Generate critique for the essay."
REQUEST = "Write an essay on the topicality of The Little Prince."


def reflection_script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    if messages[0]["content"] == TEACHER:
        return ScriptedResponse(text=f"CRITIQUE {sum(m['role'] == 'user' for m in messages)}")
    return ScriptedResponse(text=f"DRAFT {sum(m['role'] == 'assistant' for m in messages) + 1}")


class Essay(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]


def reflection_graph(llm: ChatOpenAI, async_nodes: bool, checkpointer: bool) -> Any:
    """LangGraph's reflection tutorial: a writer drafts, a teacher critiques the drafts (the
    conversation sent with its roles swapped), and the critique goes back to the writer as
    a user message, until the state holds three drafts."""
    generate = (
        ChatPromptTemplate.from_messages([("system", WRITER), MessagesPlaceholder("messages")])
        | llm
    )
    reflect = (
        ChatPromptTemplate.from_messages([("system", TEACHER), MessagesPlaceholder("messages")])
        | llm
    )
    cls_map: dict[str, type[BaseMessage]] = {"ai": HumanMessage, "human": AIMessage}

    def swapped(state: Essay) -> list[BaseMessage]:
        first, *rest = state["messages"]
        return [first, *(cls_map[m.type](content=m.content) for m in rest)]

    def generation_node(state: Essay) -> dict[str, Any]:
        return {"messages": [generate.invoke({"messages": state["messages"]})]}

    def reflection_node(state: Essay) -> dict[str, Any]:
        critique = reflect.invoke({"messages": swapped(state)})
        return {"messages": [HumanMessage(content=critique.content)]}

    async def ageneration_node(state: Essay) -> dict[str, Any]:
        return {"messages": [await generate.ainvoke({"messages": state["messages"]})]}

    async def areflection_node(state: Essay) -> dict[str, Any]:
        critique = await reflect.ainvoke({"messages": swapped(state)})
        return {"messages": [HumanMessage(content=critique.content)]}

    def should_continue(state: Essay) -> str:
        return END if len(state["messages"]) > 5 else "reflect"

    builder = StateGraph(Essay)
    builder.add_node("generate", ageneration_node if async_nodes else generation_node)
    builder.add_node("reflect", areflection_node if async_nodes else reflection_node)
    builder.add_edge(START, "generate")
    builder.add_conditional_edges("generate", should_continue)
    builder.add_edge("reflect", "generate")
    return builder.compile(checkpointer=InMemorySaver() if checkpointer else None)


@pytest.mark.parametrize(("path", "named"), [("invoke", "thread"), ("ainvoke", "engine")])
async def test_a_reflection_step_gets_each_draft_once_with_the_role_the_app_chose(
    engine: ContextEngine, path: str, named: str
) -> None:
    sent: dict[bool, list[Body]] = {}
    for installed in (False, True):
        with ScriptedOpenAIServer(reflection_script) as server:
            llm = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="k", max_retries=0)
            graph = reflection_graph(llm, path == "ainvoke", checkpointer=named == "thread")
            if installed:
                ce.langchain.install(engine)
            inputs = {"messages": [HumanMessage(REQUEST)]}
            if named == "thread":
                graph.invoke(inputs, {"configurable": {"thread_id": "user-1"}})
            else:
                with engine.session("user-1"):
                    await graph.ainvoke(inputs)
            if installed:
                ce.langchain.uninstall()
            sent[installed] = _bodies(server.requests)
    assert len(sent[True]) == 5
    assert sent[True] == sent[False]
    critiques = [body for body in sent[True] if body[0][1] == TEACHER]
    assert critiques[-1][1:] == [
        ("user", REQUEST),
        ("user", "DRAFT 1"),
        ("assistant", "CRITIQUE 2"),
        ("user", "DRAFT 2"),
    ]
    await engine.flush()
    doc = await engine.get_session("user-1")
    held = [(m.role, m.content) for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert held == [  # the writer's conversation, as the graph's state holds it
        (Role.USER, REQUEST),
        (Role.ASSISTANT, "DRAFT 1"),
        (Role.USER, "CRITIQUE 2"),
        (Role.ASSISTANT, "DRAFT 2"),
        (Role.USER, "CRITIQUE 3"),
        (Role.ASSISTANT, "DRAFT 3"),
    ]
