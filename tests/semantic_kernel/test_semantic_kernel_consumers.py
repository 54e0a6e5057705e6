"""The app's own code between an agent's replies is the app's: a model call the app makes
while it consumes ``ChatCompletionAgent.invoke`` / ``invoke_stream`` (a classifier on each
reply through the service, a title through ``kernel.invoke_prompt``), or in the
``on_intermediate_message`` callback SK awaits inside the agent, goes as the app wrote it, in a
run of its own; the agent's thread session never holds it and the agent's next turn never
carries it. The frames are set for each step of a wrapped async generator only: the wrapped
generator sees them, its consumer does not, and a value sent in, an exception thrown in and
closing reach the wrapped generator."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Annotated, Any

import pytest
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistory, ChatMessageContent
from semantic_kernel.functions import kernel_function
from sk_apps import kernel_with, wire

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.semantic_kernel._scopes import Var, stepped

SYSTEM = "You are the Oslo guide."
MARK = "NOTEBOOK-MARK-CONSUMER"
QUESTION = "USER-SECRET-PLAN: a trip to Oslo"
FOLLOW_UP = "And what should I pack?"
CLASSIFIER = "SYS-MOD: classifier"
ANSWER = "Pack a rain jacket for Oslo."


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if str(body["messages"][-1]["content"]).startswith("Classify"):
        return ScriptedResponse(text="SAFE")
    return ScriptedResponse(text=ANSWER)


@pytest.mark.parametrize("own", ["service", "invoke_prompt"])
@pytest.mark.parametrize("path", ["invoke", "invoke_stream"])
async def test_a_model_call_made_while_consuming_an_agent_is_the_apps_own(
    path: str, own: str, engine: ContextEngine
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server)
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        await engine.update_notebook("t-user", MARK)
        agent = ChatCompletionAgent(kernel=kernel, name="guide", instructions=SYSTEM)
        thread = ChatHistoryAgentThread(thread_id="t-user")
        async for response in getattr(agent, path)(messages=QUESTION, thread=thread):
            text = f"Classify: {response.message.content}"
            if own == "service":
                history = ChatHistory(system_message=CLASSIFIER)
                history.add_user_message(text)
                await service.get_chat_message_content(history, OpenAIChatPromptExecutionSettings())
            else:
                await kernel.invoke_prompt(text)
        await agent.get_response(messages=FOLLOW_UP, thread=thread)
        requests = server.requests
    classified = [r for r in requests if "Classify" in r["messages"][-1]["content"]]
    first, second = [r for r in requests if r not in classified]
    assert classified
    for request in classified:  # only the app's own messages, as it wrote them
        sent = [(m["role"], m["content"]) for m in request["messages"]]
        assert sent[:-1] == ([("system", CLASSIFIER)] if own == "service" else [])
        assert sent[-1][0] == "user"
        for foreign in (QUESTION, SYSTEM, MARK):
            assert foreign not in wire(request)
    for request in (first, second):
        assert MARK in request["messages"][0]["content"]
    # the agent's next turn carries its own conversation only
    assert [(m["role"], m["content"]) for m in second["messages"][1:]] == [
        ("user", QUESTION),
        ("assistant", ANSWER),
        ("user", FOLLOW_UP),
    ]
    assert "SAFE" not in wire(second) and CLASSIFIER not in wire(second)
    doc = await engine.get_session("t-user")
    assert [(m.role, m.content) for m in doc.session.messages if m.role is not Role.SYSTEM] == [
        (Role.USER, QUESTION),
        (Role.ASSISTANT, ANSWER),
        (Role.USER, FOLLOW_UP),
        (Role.ASSISTANT, ANSWER),
    ]
    assert len(doc.session.model_usage) == 2
    # each of the app's own calls is a run of its own
    runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
    assert len(runs) == len(classified)
    for run in runs:
        held = (await engine.get_session(run)).session.messages
        assert [m.content for m in held if m.role is Role.ASSISTANT] == ["SAFE"]


class Weather:
    @kernel_function(name="weather", description="The weather in a city.")
    def weather(self, city: Annotated[str, "the city"]) -> str:
        return f"rain in {city}"


@pytest.mark.parametrize("path", ["invoke", "invoke_stream"])
async def test_a_model_call_made_in_the_agents_callback_is_the_apps_own(
    path: str, engine: ContextEngine
) -> None:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        last = body["messages"][-1]
        if str(last["content"]).startswith("Classify"):
            return ScriptedResponse(text="SAFE")
        if last["role"] == "tool":
            return ScriptedResponse(text=ANSWER)
        return ScriptedResponse(tool_calls=[("call_w", "W-weather", json.dumps({"city": "Oslo"}))])

    with ScriptedOpenAIServer(script) as server:
        kernel = kernel_with(server, (Weather(), "W"))
        service = kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        agent = ChatCompletionAgent(
            kernel=kernel,
            name="guide",
            instructions=SYSTEM,
            function_choice_behavior=FunctionChoiceBehavior.Auto(),
        )
        thread = ChatHistoryAgentThread(thread_id="t-callback")

        async def on_intermediate_message(message: ChatMessageContent) -> None:
            history = ChatHistory(system_message=CLASSIFIER)
            history.add_user_message(f"Classify: {message.role.value}")
            await service.get_chat_message_content(history, OpenAIChatPromptExecutionSettings())

        replies = getattr(agent, path)(
            messages=QUESTION, thread=thread, on_intermediate_message=on_intermediate_message
        )
        async for _ in replies:
            pass
        requests = server.requests
    classified = [r for r in requests if str(r["messages"][-1]["content"]).startswith("Classify")]
    assert classified
    for request in classified:
        assert [m["role"] for m in request["messages"]] == ["system", "user"]
        assert QUESTION not in wire(request)
    doc = await engine.get_session("t-callback")
    assert all("Classify" not in (m.content or "") for m in doc.session.messages)
    assert all(CLASSIFIER not in (m.content or "") for m in doc.session.messages)
    runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
    assert len(runs) == len(classified)


async def test_a_frame_is_set_for_the_wrapped_generators_steps_only() -> None:
    var: Var[str] = Var("ce_sk_test")
    seen: list[tuple[str, Any]] = []

    async def steps() -> AsyncGenerator[int, Any]:
        try:
            sent = yield 1
            seen.append(("sent", (sent, var.get())))
            try:
                yield 2
            except KeyError as exc:
                seen.append(("thrown", (exc.args[0], var.get())))
            yield 3
            yield 4
        finally:
            seen.append(("closed", var.get()))

    wrapped = stepped(var, lambda: "agent", steps())
    assert await wrapped.__anext__() == 1
    assert var.get() is None  # the consumer's code between the items
    assert await wrapped.asend("hello") == 2
    assert var.get() is None
    assert await wrapped.athrow(KeyError("boom")) == 3
    await wrapped.aclose()
    assert var.get() is None
    assert seen == [
        ("sent", ("hello", "agent")),
        ("thrown", ("boom", "agent")),
        ("closed", "agent"),
    ]
    with pytest.raises(StopAsyncIteration):
        await wrapped.__anext__()


async def test_an_exception_the_wrapped_generator_does_not_handle_reaches_the_consumer() -> None:
    var: Var[str] = Var("ce_sk_test")

    async def steps() -> AsyncGenerator[int, Any]:
        yield 1
        raise RuntimeError(f"inside with {var.get()}")

    wrapped = stepped(var, lambda: "agent", steps())
    with pytest.raises(RuntimeError, match="inside with agent"):
        async for _ in wrapped:
            assert var.get() is None
    assert var.get() is None
    unbound = stepped(var, lambda: None, steps())  # None: the variable is left as it is
    assert await unbound.__anext__() == 1
    with pytest.raises(RuntimeError, match="inside with None"):
        await unbound.__anext__()
