"""Unrelated model calls inside one run that no session names: a native function prompting for
a summary, then for its translation (``kernel.invoke``), a prompt whose template calls another
prompt function (``{{Writer.summarize $input}}``), the same inside a function the model calls.
SK sends each call its own messages only; so does the engine: the first call of the scope is
recorded in the scope, a call that continues none of its calls in a child
``<scope>/call:<id>``, and a call that continues one (the function-calling loop's next round,
the app's next turn on the same ``ChatHistory``) in that one's session."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistory
from semantic_kernel.functions import KernelArguments, kernel_function
from sk_apps import kernel_with

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

CHILD = re.compile(r"/call:[0-9a-f]{12}$")


class Pipeline:
    """A native function orchestrating two prompt calls that share nothing but a value."""

    def __init__(self) -> None:
        self.kernel: Kernel | None = None

    @kernel_function(name="process", description="Summarize a text, then translate it.")
    async def process(self, text: str) -> str:
        assert self.kernel is not None
        summary = await self.kernel.invoke_prompt(f"SUMMARIZE: {text}")
        return str(await self.kernel.invoke_prompt(f"TRANSLATE to French: {summary}"))


def _script(body: dict[str, Any]) -> ScriptedResponse:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return ScriptedResponse(text="done")
    content = str(last.get("content") or "")
    if content.startswith("SUMMARIZE"):
        return ScriptedResponse(text="short summary")
    if content.startswith("TRANSLATE"):
        return ScriptedResponse(text="resume court")
    if body.get("tools"):
        arguments = json.dumps({"text": "SECRET-DOC"})
        return ScriptedResponse(tool_calls=[("call_p", "Pipeline-process", arguments)])
    return ScriptedResponse(text=f"reply to {content}")


def _sent(requests: list[dict[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Each request's messages as (role, content), system messages left out."""
    return [
        [(m["role"], m.get("content")) for m in r["messages"] if m["role"] != "system"]
        for r in requests
    ]


async def _held(engine: ContextEngine) -> dict[str, list[tuple[str, str | None, str]]]:
    """Each stored session's messages as (role, author, content), by session id."""
    held = {}
    for session_id in await engine.list_sessions():
        doc = await engine.get_session(session_id)
        held[session_id] = [
            (m.role.value, m.author.id if m.author else None, m.content or "")
            for m in doc.session.messages
        ]
    return held


@pytest.mark.parametrize("shape", ["native function", "nested prompt"])
async def test_unrelated_calls_of_one_run_get_their_own_messages_and_session(
    engine: ContextEngine, shape: str
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        pipeline = Pipeline()
        kernel = pipeline.kernel = kernel_with(server, (pipeline, "Pipeline"))
        kernel.add_function(
            plugin_name="Writer", function_name="summarize", prompt="SUMMARIZE: {{$input}}"
        )
        ce.semantic_kernel.install(engine)
        if shape == "native function":
            await kernel.invoke(
                plugin_name="Pipeline",
                function_name="process",
                arguments=KernelArguments(text="SECRET-DOC"),
            )
            second = "TRANSLATE to French: short summary"
        else:
            await kernel.invoke_prompt(
                "Tweet about: {{Writer.summarize $input}}",
                arguments=KernelArguments(input="SECRET-DOC"),
            )
            second = "Tweet about: short summary"
        requests = server.requests
    assert _sent(requests) == [[("user", "SUMMARIZE: SECRET-DOC")], [("user", second)]]
    # each call in a session of its own under the run: a function invoked inside the run
    # (by the native function, by the template) is its own work, `<run>/<function>:<id>`
    held = {k: v for k, v in (await _held(engine)).items() if v}
    assert len(held) == 2
    (run,) = {s.split("/")[0] for s in held}
    assert all(s.startswith("run:") for s in held)
    asked = sorted(messages[0][2] for messages in held.values())
    assert asked == sorted(["SUMMARIZE: SECRET-DOC", second])
    for messages in held.values():
        assert [m[:2] for m in messages] == [("user", None), ("assistant", None)]
    (summary,) = [s for s, m in held.items() if m[0][2].startswith("SUMMARIZE")]
    assert summary.startswith(f"{run}/")  # the inner function's call is nested in the run


async def test_a_call_continuing_an_earlier_one_stays_in_its_session(
    engine: ContextEngine,
) -> None:
    """A native function holding a chat of its own: its second call continues the first."""

    class Chat:
        def __init__(self) -> None:
            self.kernel: Kernel | None = None

        @kernel_function(name="talk", description="Two turns on one chat history.")
        async def talk(self) -> str:
            assert self.kernel is not None
            service = self.kernel.get_service(type=None)
            history = ChatHistory()
            for question in ("FIRST", "SECOND"):
                history.add_user_message(question)
                settings = OpenAIChatPromptExecutionSettings()
                history.add_message(
                    await service.get_chat_message_content(history, settings, kernel=self.kernel)
                )
            return str(history.messages[-1])

    with ScriptedOpenAIServer(_script) as server:
        chat = Chat()
        kernel = chat.kernel = kernel_with(server, (chat, "Chat"))
        ce.semantic_kernel.install(engine)
        await kernel.invoke(plugin_name="Chat", function_name="talk")
        requests = server.requests
    assert _sent(requests) == [
        [("user", "FIRST")],
        [("user", "FIRST"), ("assistant", "reply to FIRST"), ("user", "SECOND")],
    ]
    held = await _held(engine)
    (run,) = held
    assert run.startswith("run:")
    assert [m[2] for m in held[run]] == ["FIRST", "reply to FIRST", "SECOND", "reply to SECOND"]


@pytest.mark.parametrize("outer", ["agent thread", "prompt"])
async def test_unrelated_calls_inside_a_function_call_get_their_own_session(
    engine: ContextEngine, outer: str
) -> None:
    """The model calls ``Pipeline.process``: its two prompt calls go to
    ``<outer>/call_p`` and ``<outer>/call_p/call:<id>``, each with its own messages and no
    agent as author; the outer function-calling loop's two rounds stay in one session."""
    with ScriptedOpenAIServer(_script) as server:
        pipeline = Pipeline()
        kernel = pipeline.kernel = kernel_with(server, (pipeline, "Pipeline"))
        ce.semantic_kernel.install(engine)
        if outer == "agent thread":
            agent = ChatCompletionAgent(
                kernel=kernel,
                name="a",
                instructions="You process documents.",
                function_choice_behavior=FunctionChoiceBehavior.Auto(),
            )
            thread = ChatHistoryAgentThread(thread_id="t-pipe")
            await agent.get_response(messages="process my doc", thread=thread)
        else:
            settings = OpenAIChatPromptExecutionSettings(
                function_choice_behavior=FunctionChoiceBehavior.Auto()
            )
            await kernel.invoke_prompt(
                "process my doc", arguments=KernelArguments(settings=settings)
            )
        requests = server.requests
    sent = _sent(requests)
    assert sent[1:3] == [
        [("user", "SUMMARIZE: SECRET-DOC")],
        [("user", "TRANSLATE to French: short summary")],
    ]
    assert [m for m in requests[1]["messages"] + requests[2]["messages"] if "name" in m] == []
    held = await _held(engine)
    (top,) = [s for s in held if "/" not in s]
    if outer == "agent thread":
        assert top == "t-pipe"
    else:
        assert top.startswith("run:")
    assert [m[0] for m in held[top] if m[0] != "system"] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert held[top][-1][2] == "done"
    inner = f"{top}/call_p"
    assert held[inner] == [
        ("user", None, "SUMMARIZE: SECRET-DOC"),
        ("assistant", None, "short summary"),
    ]
    (child,) = [s for s in held if s not in (top, inner)]
    assert child.startswith(inner + "/") and CHILD.search(child), child
    assert held[child] == [
        ("user", None, "TRANSLATE to French: short summary"),
        ("assistant", None, "resume court"),
    ]


async def test_a_prompt_function_an_agents_instructions_call_is_no_turn_of_its_thread(
    engine: ContextEngine,
) -> None:
    """A ``ChatCompletionAgent`` whose instructions template calls a prompt function, on a
    named thread, two turns: the function's call is its own work (``<thread>/<function>:<id>``,
    its own messages), so every request is what SK sends (the thread's turns, never the
    function's prompt) and the thread holds the user's turns and the agent's answers only."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        last = str(body["messages"][-1]["content"])
        if last.startswith("SUMMARIZE"):
            return ScriptedResponse(text="SUMMARY-OF-DOC")
        return ScriptedResponse(text=f"answer to {last}")

    questions = ["What is in it?", "And the date?"]

    async def bodies(install: bool) -> list[list[tuple[str, Any]]]:
        with ScriptedOpenAIServer(script) as server:
            kernel = kernel_with(server)
            kernel.add_function(
                plugin_name="Writer", function_name="summarize", prompt="SUMMARIZE: {{$doc}}"
            )
            agent = ChatCompletionAgent(
                kernel=kernel,
                name="helper",
                instructions="You help with the document: {{Writer.summarize $doc}}",
                arguments=KernelArguments(doc="DOC-X"),
            )
            thread = ChatHistoryAgentThread(thread_id="t-doc")
            if install:
                ce.semantic_kernel.install(engine)
            for question in questions:
                await agent.get_response(messages=question, thread=thread)
            if install:
                ce.semantic_kernel.uninstall()
            return _sent(server.requests)

    native = await bodies(False)
    assert await bodies(True) == native
    held = await _held(engine)
    assert [(role, text) for role, _, text in held["t-doc"] if role != "system"] == [
        ("user", questions[0]),
        ("assistant", f"answer to {questions[0]}"),
        ("user", questions[1]),
        ("assistant", f"answer to {questions[1]}"),
    ]
    children = [s for s in held if s.startswith("t-doc/summarize:")]
    assert len(children) == 2
