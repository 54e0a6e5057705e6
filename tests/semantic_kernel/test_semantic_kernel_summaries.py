"""Beside SK's ``ChatHistorySummarizationReducer`` (reduced after every turn, as SK documents):
the summary SK puts in place of older turns is neither stored as an assistant turn nor sent
beside the turns it summarizes (the session holds them, the engine assembles each request from
it); the summarizer's own request is recorded in a child scope of the conversation's session,
a thread's ``reduce()`` under the thread's session."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistorySummarizationReducer
from semantic_kernel.functions import KernelArguments
from semantic_kernel.prompt_template import InputVariable, PromptTemplateConfig
from sk_apps import kernel_with, wire

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

SYSTEM = "You are the friendly assistant."
SUMMARY = "SUMMARY-OF-EARLIER-TURNS"
TURNS = 5


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if "concise and complete summarization" in wire(body):
        return ScriptedResponse(text=SUMMARY, prompt_tokens=40)
    return ScriptedResponse(text=f"answer to {body['messages'][-1]['content']}")


def _summarizer(request: dict[str, Any]) -> bool:
    return "concise and complete summarization" in wire(request)


async def _children(engine: ContextEngine, session_id: str) -> list[str]:
    return [s for s in await engine.list_sessions() if s.startswith(f"{session_id}/summarize:")]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_summary_is_neither_stored_nor_sent_beside_what_it_summarizes(
    stream: bool, engine: ContextEngine
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server)
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        history = ChatHistorySummarizationReducer(
            service=service, target_count=3, threshold_count=1
        )
        history.add_system_message(SYSTEM)
        settings = OpenAIChatPromptExecutionSettings()
        for turn in range(TURNS):
            history.add_user_message(f"question {turn}")
            with engine.session("s-sum"):
                await history.reduce()
                if stream:
                    reply = None
                    async for chunk in service.get_streaming_chat_message_content(
                        history, settings
                    ):
                        reply = chunk if reply is None else reply + chunk
                else:
                    reply = await service.get_chat_message_content(history, settings)
            assert reply is not None
            history.add_message(reply)
        requests = server.requests
    summarizers = [r for r in requests if _summarizer(r)]
    turns = [r for r in requests if not _summarizer(r)]
    assert summarizers and len(turns) == TURNS
    assert any(m.content == SUMMARY for m in history.messages)  # SK's history, as SK made it
    for turn, request in enumerate(turns):
        assert SUMMARY not in wire(request)
        assert request["messages"][0]["content"].startswith(SYSTEM)
        # every earlier turn, from the session, once
        sent = [m["content"] for m in request["messages"][1:]]
        asked = [f"question {t}" for t in range(turn + 1)]
        assert [c for c in sent if c.startswith("question")] == asked
        assert [c for c in sent if c.startswith("answer")] == [f"answer to {q}" for q in asked[:-1]]
    doc = await engine.get_session("s-sum")
    held = [(m.role, m.content) for m in doc.session.messages if m.role is not Role.SYSTEM]
    assert held == [
        item
        for t in range(TURNS)
        for item in ((Role.USER, f"question {t}"), (Role.ASSISTANT, f"answer to question {t}"))
    ]
    assert len(doc.session.model_usage) == TURNS
    children = await _children(engine, "s-sum")
    assert len(children) == len(summarizers)
    for child in children:
        usage = (await engine.get_session(child)).session.model_usage
        assert [(u.prompt_tokens, u.stage.value) for u in usage] == [(40, "summarize")]


@pytest.mark.parametrize("named", ["engine.session", "install(session_id=)"])
async def test_a_summary_rendered_by_a_prompt_template_is_neither_stored_nor_sent(
    named: str, engine: ContextEngine
) -> None:
    """SK's chatbot sample with a summarization reducer: the reducer goes to a prompt
    function as ``{{$chat_history}}``, so SK renders it to prompt text and parses it back,
    and the summary reaches the request without its ``__summary__`` mark. It is still the
    summary the reducer made: neither stored as an assistant turn nor sent beside the turns
    it summarizes (each its own text: the reducer summarizes anew on every reduce)."""
    made: list[str] = []

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if _summarizer(body):
            made.append(f"SUMMARY-{len(made) + 1} of the earlier turns")
            return ScriptedResponse(text=made[-1])
        return ScriptedResponse(text=f"answer to {body['messages'][-1]['content']}")

    with ScriptedOpenAIServer(script) as server:
        kernel = kernel_with(server)
        service = kernel.get_service(type=None)
        if named == "engine.session":
            ce.semantic_kernel.install(engine)
            scope: Any = functools.partial(engine.session, "s-chatbot")
        else:
            ce.semantic_kernel.install(engine, session_id="s-chatbot")
            scope = contextlib.nullcontext
        reducer = ChatHistorySummarizationReducer(
            service=service, threshold_count=2, target_count=3
        )
        chat = kernel.add_function(
            plugin_name="ChatBot",
            function_name="Chat",
            prompt_template_config=PromptTemplateConfig(
                template="{{$chat_history}}{{$user_input}}",
                input_variables=[
                    InputVariable(name="user_input", allow_dangerously_set_content=True),
                    InputVariable(name="chat_history", allow_dangerously_set_content=True),
                ],
            ),
        )
        for turn in range(TURNS + 1):
            question = f"question {turn}"
            with scope():
                await reducer.reduce()
                answer = await kernel.invoke(
                    chat, KernelArguments(chat_history=reducer, user_input=question)
                )
            assert answer is not None
            reducer.add_user_message(question)
            reducer.add_message(answer.value[0])
        requests = server.requests
    turns = [r for r in requests if not _summarizer(r)]
    assert len(made) >= 2 and len(turns) == TURNS + 1
    assert any(m.content == made[-1] for m in reducer.messages)  # SK's history, as SK made it
    for turn, request in enumerate(turns):
        assert "SUMMARY-" not in wire(request)
        sent = [m["content"] for m in request["messages"]]
        asked = [f"question {t}" for t in range(turn + 1)]
        assert [c for c in sent if c.startswith("question")] == asked
        assert [c for c in sent if c.startswith("answer")] == [f"answer to {q}" for q in asked[:-1]]
    doc = await engine.get_session("s-chatbot")
    assert [(m.role, m.content) for m in doc.session.messages] == [
        item
        for t in range(TURNS + 1)
        for item in ((Role.USER, f"question {t}"), (Role.ASSISTANT, f"answer to question {t}"))
    ]


async def test_an_agent_threads_summary_is_neither_stored_nor_sent_and_its_reduce_is_the_threads(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server)
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        agent = ChatCompletionAgent(kernel=kernel, name="bot", instructions=SYSTEM)
        reducer = ChatHistorySummarizationReducer(
            service=service, target_count=2, threshold_count=1
        )
        thread = ChatHistoryAgentThread(chat_history=reducer, thread_id="t-sum")
        for turn in range(4):
            await agent.get_response(messages=f"question {turn}", thread=thread)
            await thread.reduce()
        requests = server.requests
    summarizers = [r for r in requests if _summarizer(r)]
    turns = [r for r in requests if not _summarizer(r)]
    assert summarizers and len(turns) == 4
    assert any(m.content == SUMMARY for m in reducer.messages)
    last = turns[-1]
    assert SUMMARY not in wire(last)
    assert [m["content"] for m in last["messages"] if m["role"] == "user"] == [
        f"question {t}" for t in range(4)
    ]
    doc = await engine.get_session("t-sum")
    assert SUMMARY not in [m.content for m in doc.session.messages]
    assert [m.content for m in doc.session.messages if m.role is Role.ASSISTANT] == [
        f"answer to question {t}" for t in range(4)
    ]
    # the reducer's requests are the thread's internal calls, not runs of their own
    assert len(await _children(engine, "t-sum")) == len(summarizers)
    assert not [s for s in await engine.list_sessions() if s.startswith("run:")]


async def test_a_summary_goes_as_sk_sends_it_where_no_session_holds_the_turns(
    engine: ContextEngine,
) -> None:
    """The same chatbot naming no session: each service call is a run of its own, whose
    session never held the turns the summary replaces, so the summary is the only copy of
    what they said and the request carries it as SK sends it (the fact it holds reaches the
    model)."""
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server)
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        history = ChatHistorySummarizationReducer(
            service=service, target_count=2, threshold_count=0
        )
        history.add_system_message(SYSTEM)
        settings = OpenAIChatPromptExecutionSettings()
        for turn in range(TURNS):
            await history.reduce()
            history.add_user_message(f"question {turn}")
            reply = await service.get_chat_message_content(history, settings, kernel=kernel)
            assert reply is not None
            history.add_message(reply)
        requests = server.requests
    turns = [r for r in requests if not _summarizer(r)]
    assert len(turns) == TURNS
    summarized = [r for r in turns if SUMMARY in wire(r)]
    assert summarized  # once SK summarised, every request carries the summary, once
    for request in summarized:
        assert wire(request).count(SUMMARY) == 1
        assert [m["content"] for m in request["messages"] if m["role"] == "user"][-1].startswith(
            "question"
        )
