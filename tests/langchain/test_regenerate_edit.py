"""A chat app that goes back in its conversation — "regenerate" (it drops the answer it got and
asks the same question again), "edit" (it replaces a message and drops what followed), a
LangGraph thread resumed from an earlier checkpoint — gets the conversation it went back to:
the model receives what the app passes, not the turns it took back. The session keeps every
message stored; the next turns continue from where the app went.

What a RAG chat retrieved for the turns it took back goes with them: the model gets the
documents of the conversation the app went back to, each once.

Driven over langchain-openai's ``ChatOpenAI`` on the scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.retrievers import BaseRetriever
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.testing import CITY_GUIDES, ScriptedOpenAIServer, numbered_answer

SYSTEM = "You answer in one line."


@contextmanager
def _model(engine: ContextEngine) -> Iterator[tuple[ChatOpenAI, ScriptedOpenAIServer]]:
    with ScriptedOpenAIServer(numbered_answer) as server:
        llm = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="k", max_retries=0)
        ce.langchain.install(engine)
        yield llm, server


async def _ask(llm: ChatOpenAI, history: list[BaseMessage], path: str) -> BaseMessage:
    config: Any = {"metadata": {"ce_session_id": "user-1"}}
    messages = [SystemMessage(SYSTEM), *history]
    if path == "invoke":
        return await asyncio.to_thread(llm.invoke, messages, config)
    if path == "ainvoke":
        return await llm.ainvoke(messages, config)
    chunks = [chunk async for chunk in llm.astream(messages, config)]
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    return message


@pytest.mark.parametrize("path", ["invoke", "ainvoke", "astream"])
async def test_regenerate_and_edit_send_the_conversation_the_app_went_back_to(
    engine: ContextEngine, path: str
) -> None:
    with _model(engine) as (llm, server):
        history: list[BaseMessage] = []
        for question in ("Where is Paris?", "What is the plan?"):
            history.append(HumanMessage(question))
            history.append(await _ask(llm, history, path))
        bad = history.pop()  # regenerate the last answer

        await _ask(llm, history, path)
        assert str(bad.content) == "answer 1 to What is the plan?"
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is the plan?",
        ]

        # edit the second question: what followed it is dropped
        edited = [*history[:2], HumanMessage("What is the capital of Italy?")]
        edited.append(await _ask(llm, edited, path))
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is the capital of Italy?",
        ]
        edited.append(HumanMessage("And its population?"))
        await _ask(llm, edited, path)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "What is the capital of Italy?",
            "answer 1 to What is the capital of Italy?",
            "And its population?",
        ]
    await engine.flush()
    doc = await engine.get_session("user-1")
    stored = [m.content for m in doc.session.messages]
    # the answer taken back and the one asked for again: both stay stored
    assert stored.count("answer 1 to What is the plan?") == 2


def _graph(llm: ChatOpenAI) -> Any:
    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("chat", chat)
    graph.add_edge(START, "chat")
    graph.add_edge("chat", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_a_langgraph_thread_resumed_from_an_earlier_checkpoint(engine: ContextEngine) -> None:
    """LangGraph's time travel: the app invokes the graph on the checkpoint that ended the
    first turn with another question (a fork of the thread), then goes on in the thread."""
    with _model(engine) as (llm, server):
        graph = _graph(llm)
        config: Any = {"configurable": {"thread_id": "t-1"}}
        graph.invoke({"messages": [HumanMessage("Where is Paris?")]}, config)
        graph.invoke({"messages": [HumanMessage("Is it rainy?")]}, config)

        history = list(graph.get_state_history(config))
        first_turn = next(s for s in history if s.next == () and len(s.values["messages"]) == 2)
        graph.invoke({"messages": [HumanMessage("Is it sunny?")]}, first_turn.config)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "Is it sunny?",
        ]

        graph.invoke({"messages": [HumanMessage("And tomorrow?")]}, config)
        assert server.last_conversation() == [
            "Where is Paris?",
            "answer 0 to Where is Paris?",
            "Is it sunny?",
            "answer 1 to Is it sunny?",
            "And tomorrow?",
        ]
        assert len(server.requests) == 4


class CityGuides(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            Document(page_content=text, metadata={"source": f"kb://{city.lower()}"})
            for city, text in CITY_GUIDES.items()
            if city in query
        ]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_a_rag_chat_edited_gets_the_documents_of_the_edit(
    engine: ContextEngine, path: str
) -> None:
    """A RAG chain with the app's history (retriever | prompt with the documents in its
    system message and a history placeholder | ChatOpenAI): editing the second question
    sends the documents retrieved for the edit and the first question, not those of the
    question the user edited away."""
    with _model(engine) as (llm, server):
        prompt = ChatPromptTemplate.from_messages(
            [
                ("system", "Answer from the city guides below.\n\n{context}"),
                MessagesPlaceholder("history"),
                ("human", "{question}"),
            ]
        )
        retriever = CityGuides()

        async def turn(history: list[BaseMessage], question: str) -> list[BaseMessage]:
            config: Any = {"metadata": {"ce_session_id": "rag-user"}}
            if path == "invoke":
                docs = await asyncio.to_thread(retriever.invoke, question, config)
            else:
                docs = await retriever.ainvoke(question, config)
            context = "\n\n".join(d.page_content for d in docs)
            inputs = {"context": context, "history": history, "question": question}
            messages = (await prompt.ainvoke(inputs)).to_messages()
            if path == "invoke":
                answer = await asyncio.to_thread(llm.invoke, messages, config)
            else:
                answer = await llm.ainvoke(messages, config)
            return [*history, HumanMessage(question), AIMessage(str(answer.content))]

        first = await turn([], "Weather in Paris?")
        await turn(first, "And in Oslo?")
        assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Oslo": 1}

        edited = await turn(first, "And in Rome?")  # the user edits the second question
        assert server.last_conversation() == [
            "Weather in Paris?",
            "answer 0 to Weather in Paris?",
            "And in Rome?",
        ]
        assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Rome": 1}

        await turn(edited, "And in Oslo, after all?")  # the abandoned document, found again
        assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Oslo": 1, "Rome": 1}
        await turn(first, "And in Oslo, really?")  # back again: Rome goes, Oslo stays
        assert server.sent_counts(CITY_GUIDES) == {"Paris": 1, "Oslo": 1}
