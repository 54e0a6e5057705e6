"""A create_agent agent with two tools (one fails) and a retriever tool, driven sync, async
and streaming through the one-line install: what the model received on the first and the
post-tool call, and what the session document holds."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, SystemMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

import ce.langchain
from ce.core.engine import ContextEngine
from ce.core.schema import EvidenceType, Role, ToolCallStatus
from ce.core.testing.assertions import fenced, unfenced

SYSTEM = "You are the weather agent."
DOCS = [
    ("kb://paris", "Paris is mild in autumn.", 0.9),
    ("kb://oslo", "Oslo is cold in autumn.", 0.5),
]
CALLS = [
    {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_w"},
    {"name": "flaky", "args": {"x": 1}, "id": "call_f"},
    {"name": "search_docs", "args": {"query": "autumn"}, "id": "call_s"},
]


class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel with bind_tools (a no-op), a stream that keeps tool calls and
    usage, and a record of every message list the "provider" received."""

    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingFake:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        message = self._generate(messages, *args, **kwargs).generations[0].message
        assert isinstance(message, AIMessage)
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content=message.content,
                id=message.id,
                usage_metadata=message.usage_metadata,
                tool_call_chunks=[
                    {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
                    for i, c in enumerate(message.tool_calls)
                ],
                chunk_position="last",
            )
        )


class Docs(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            Document(page_content=text, metadata={"source": uri, "score": score}, id=uri)
            for uri, text, score in DOCS
        ]


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool
def flaky(x: int) -> str:
    """A tool that fails."""
    raise ToolException("kaboom")


flaky.handle_tool_error = True  # the failure becomes a ToolMessage(status="error")


@tool
def search_docs(query: str) -> str:
    """Search the knowledge base."""
    return "\n".join(d.page_content for d in Docs().invoke(query))


def make_model() -> ToolCallingFake:
    script = [
        AIMessage(
            content="",
            tool_calls=CALLS,
            usage_metadata={"input_tokens": 11, "output_tokens": 5, "total_tokens": 16},
        ),
        AIMessage(
            content="Paris is sunny.",
            usage_metadata={"input_tokens": 30, "output_tokens": 7, "total_tokens": 37},
        ),
    ]
    return ToolCallingFake(messages=iter(script), seen=[])


def _run(path: str, agent: Any, config: Any) -> str:
    inputs = {"messages": [("user", "weather in Paris?")]}
    if path == "sync":
        return str(agent.invoke(inputs, config)["messages"][-1].content)
    for _ in agent.stream(inputs, config, stream_mode="messages"):
        pass
    return str(agent.get_state(config).values["messages"][-1].content)


@pytest.mark.parametrize("path", ["sync", "async", "stream"])
async def test_agent_tool_loop_is_injected_and_recorded(path: str, engine: ContextEngine) -> None:
    import asyncio

    ce.langchain.install(engine)
    await engine.update_notebook("sess-1", "NOTEBOOK-MARK")
    model = make_model()
    agent = create_agent(
        model,
        tools=[get_weather, flaky, search_docs],
        system_prompt=SYSTEM,
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "sess-1"}}
    if path == "async":
        answer = str(
            (await agent.ainvoke({"messages": [("user", "weather in Paris?")]}, config))[
                "messages"
            ][-1].content
        )
    else:
        answer = await asyncio.to_thread(_run, path, agent, config)
    assert answer == "Paris is sunny."

    # what the model received: the engine's input on the first and on the post-tool call
    first, second = model.seen
    assert isinstance(first[0], SystemMessage)
    assert SYSTEM in str(first[0].content) and "NOTEBOOK-MARK" in str(first[0].content)
    assert [m.type for m in first] == ["system", "human"]
    assert first[-1].content == "weather in Paris?"
    assert [m.type for m in second] == ["system", "human", "ai", "tool", "tool", "tool"]
    assert "NOTEBOOK-MARK" in str(second[0].content)
    ai = second[2]
    assert isinstance(ai, AIMessage)
    assert [c["id"] for c in ai.tool_calls] == ["call_w", "call_f", "call_s"]
    tools = {m.tool_call_id: str(m.content) for m in second[3:]}  # type: ignore[attr-defined]
    # each tool result as the tool returned it, fenced with its tool and status
    assert unfenced(tools["call_w"]) == "sunny in Paris"
    assert (fenced(tools["call_w"]) or {}).get("tool") == "get_weather"
    assert (fenced(tools["call_w"]) or {}).get("status") == "success"
    assert "kaboom" in tools["call_f"] and (fenced(tools["call_f"]) or {}).get("status") == "error"

    # what the session document holds
    doc = await engine.get_session("sess-1")
    roles = [m.role for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.TOOL, Role.ASSISTANT]
    assert doc.session.messages[-1].content == "Paris is sunny."
    assert doc.session.messages[-1].invocation is not None
    records = {r.tool_call_id: r for r in doc.session.tool_state.tool_calls}
    assert set(records) == {"call_w", "call_f", "call_s"}
    assert records["call_w"].status is ToolCallStatus.SUCCESS
    assert records["call_f"].status is ToolCallStatus.ERROR
    assert records["call_s"].status is ToolCallStatus.SUCCESS
    assert all(r.duration_ms is not None and r.duration_ms >= 0 for r in records.values())
    assert records["call_w"].args_digest == {"city": "Paris"}
    rag = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert {e.source.uri for e in rag} == {"kb://paris", "kb://oslo"}
    assert all(e.links is not None and e.links.tool_call_id == "call_s" for e in rag)
    assert {e.source.uri: e.confidence for e in rag} == {"kb://paris": 0.9, "kb://oslo": 0.5}
    # the retrieved docs reach the post-tool call fenced with their evidence ids
    for evidence in rag:
        assert f'id="{evidence.evidence_id}"' in tools["call_s"]
    usage = doc.session.model_usage
    assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == [(11, 5), (30, 7)]
    assert len(await engine.list_turns("sess-1")) == 2


async def test_uninstall_restores_langchain_and_the_apps_own_messages(
    engine: ContextEngine,
) -> None:
    from langchain_core.tracers import context as tracer_context

    names = ("_convert_input", "ainvoke", "astream")
    originals = [BaseChatModel.__dict__[name] for name in names]
    hooks = list(tracer_context._configure_hooks)
    plugin = ce.langchain.install(engine)
    assert all(BaseChatModel.__dict__[n] is not o for n, o in zip(names, originals, strict=True))
    assert len(tracer_context._configure_hooks) == len(hooks) + 1
    plugin.uninstall()
    assert all(BaseChatModel.__dict__[n] is o for n, o in zip(names, originals, strict=True))
    assert tracer_context._configure_hooks == hooks
    assert all(a is b for a, b in zip(tracer_context._configure_hooks, hooks, strict=True))
    model = make_model()
    model.invoke([SystemMessage("app system"), ("user", "hi")])
    assert [(m.type, m.content) for m in model.seen[0]] == [
        ("system", "app system"),
        ("human", "hi"),
    ]
    assert await engine.store.list_sessions() == []  # nothing recorded anywhere


async def test_skip_tag_and_helper_nodes_are_left_alone(engine: ContextEngine) -> None:
    ce.langchain.install(engine, session_id="s-skip")
    await engine.update_notebook("s-skip", "NOTEBOOK-MARK")
    tagged = make_model()
    tagged.tags = ["ce:skip"]
    tagged.invoke([("user", "tagged model")])
    assert [m.type for m in tagged.seen[0]] == ["human"]
    plain = make_model()
    plain.invoke([("user", "app call")])
    assert "NOTEBOOK-MARK" in str(plain.seen[0][0].content)
    doc = await engine.get_session("s-skip")
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == ["app call"]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
async def test_the_agents_prompt_and_the_apps_system_message_both_reach_the_model(
    path: str, engine: ContextEngine
) -> None:
    """``create_agent(system_prompt=...)`` invoked with the app's own ``SystemMessage`` among
    its messages: LangChain sends both; so does the plugin, as the one instruction (before,
    the engine kept the last system message only and the agent's prompt was lost)."""
    model = make_model()
    agent = create_agent(model, tools=[get_weather, flaky, search_docs], system_prompt=SYSTEM)
    ce.langchain.install(engine, session_id="s-two-systems")
    note = "The user is Bob, premium tier."
    state = {"messages": [SystemMessage(note), ("user", "Weather in Paris?")]}
    if path == "invoke":
        agent.invoke(state)
    else:
        await agent.ainvoke(state)
    assert len(model.seen) == 2
    for seen in model.seen:
        systems = [m for m in seen if m.type == "system"]
        assert len(systems) == 1 and seen[0] is systems[0]
        assert SYSTEM in str(systems[0].content) and note in str(systems[0].content)
        assert str(systems[0].content).index(SYSTEM) < str(systems[0].content).index(note)
    doc = await engine.get_session("s-two-systems")
    assert [m.content for m in doc.session.messages if m.role is Role.SYSTEM] == [
        f"{SYSTEM}\n\n{note}"
    ]
