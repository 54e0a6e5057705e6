"""Manual function calling (SK's ``FunctionChoiceBehavior.Auto(auto_invoke=False)``): the app
asks the chat service, runs the function calls of the reply itself
(``kernel.invoke_function_call(call, history)``, or ``kernel.invoke(...)`` and a
``FunctionResultContent`` it appends) and asks again, each user's turns in
``with engine.session(<user>)``. A function that calls the model itself (a native function
calling the chat service, a prompt function, an agent as a plugin) makes a model call of its
own: it receives its own messages only and never becomes a turn of the user's conversation,
as when SK runs the function in its own loop. The requests are those SK sends without the
plugin."""

from __future__ import annotations

import contextlib
import copy
import json
import re
from typing import Any

import pytest
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistory, FunctionCallContent, FunctionResultContent
from semantic_kernel.functions import kernel_function
from sk_apps import kernel_with

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.core.testing.assertions import unfenced

SUMMARIZE = "SUMMARIZE:"


class Notes:
    """A native function that asks the chat service itself."""

    def __init__(self) -> None:
        self.kernel: Kernel | None = None

    @kernel_function(name="summarize", description="Summarize the user's notes.")
    async def summarize(self, text: str) -> str:
        assert self.kernel is not None
        service = self.kernel.get_service(type=ChatCompletionClientBase)
        history = ChatHistory()
        history.add_system_message("You summarize notes.")
        history.add_user_message(f"{SUMMARIZE} {text}")
        reply = await service.get_chat_message_content(history, OpenAIChatPromptExecutionSettings())
        return str(reply.content if reply is not None else "")


def _inner(body: dict[str, Any]) -> bool:
    """Whether a request is the function's own model call (the native function's, the prompt
    function's, the agent's)."""
    return SUMMARIZE in json.dumps(body["messages"]) or "You summarize notes." in json.dumps(
        body["messages"]
    )


def _script(body: dict[str, Any]) -> ScriptedResponse:
    last = body["messages"][-1]
    content = str(last.get("content") or "")
    if last["role"] == "tool":  # a prompt function's result is SK's repr of its reply
        found = re.search(r"summary of [a-z]+'s notes", unfenced(content))
        return ScriptedResponse(text=f"answer: {found[0] if found else '?'}")
    if _inner(body):  # the function's own model call
        found = re.search(r"[a-z]+'s notes", content)
        return ScriptedResponse(text=f"summary of {found[0] if found else '?'}")
    if body.get("tools") and "notes" in content:
        user = content.split()[0]
        function = body["tools"][0]["function"]
        parameter = next(iter(function["parameters"]["properties"]))  # text; an agent's: messages
        arguments = json.dumps({parameter: f"{user}'s notes"})
        return ScriptedResponse(tool_calls=[(f"call_{user}", function["name"], arguments)])
    return ScriptedResponse(text=f"reply to {content}")


async def _chat(
    tool: str, api: str, engine: ContextEngine | None
) -> tuple[list[str], list[dict[str, Any]]]:
    """Two users' chats (three turns each), with the plugin on ``engine`` (``None``:
    without it); the answers and the requests."""
    with ScriptedOpenAIServer(_script) as server:
        if engine is not None:
            ce.semantic_kernel.install(engine)
        if tool == "native":
            notes = Notes()
            kernel = notes.kernel = kernel_with(server, (notes, "Notes"))
        elif tool == "agent":  # an agent as a plugin
            kernel = kernel_with(server)
            agent = ChatCompletionAgent(
                kernel=kernel_with(server),
                name="Notes",
                instructions="You summarize notes.",
                description="Summarize the user's notes.",
            )
            kernel.add_plugin(agent)
        else:
            kernel = kernel_with(server)
            kernel.add_function(
                plugin_name="Notes",
                function_name="summarize",
                description="Summarize the user's notes.",
                prompt=f"{SUMMARIZE} {{{{$text}}}}",
            )
        service = kernel.get_service(type=ChatCompletionClientBase)
        behavior = FunctionChoiceBehavior.Auto(auto_invoke=False)
        settings = OpenAIChatPromptExecutionSettings(function_choice_behavior=behavior)
        answers = []
        try:
            for user in ("alice", "bob"):
                history = ChatHistory()
                history.add_system_message(f"You help {user}.")
                for text in ("hello", "summarize my notes", "thanks"):
                    history.add_user_message(f"{user} {text}")
                    session = engine.session(f"s-{user}") if engine else contextlib.nullcontext()
                    with session:
                        for _ in range(3):  # a request, the function calls, a request
                            (reply,) = await service.get_chat_message_contents(
                                history, settings, kernel=kernel
                            )
                            history.add_message(reply)
                            calls = [i for i in reply.items if isinstance(i, FunctionCallContent)]
                            if not calls:
                                break
                            for call in calls:
                                if api == "invoke_function_call":
                                    await kernel.invoke_function_call(call, history)
                                    continue
                                result = await kernel.invoke(
                                    plugin_name=call.plugin_name,
                                    function_name=call.function_name,
                                    arguments=call.to_kernel_arguments(),
                                )
                                content = (
                                    FunctionResultContent.from_function_call_content_and_result(
                                        call, result
                                    )
                                )
                                history.add_message(content.to_chat_message_content())
                        else:
                            raise AssertionError(f"{user}: the model keeps calling functions")
                    answers.append(str(reply.content))
        finally:
            if engine is not None:
                ce.semantic_kernel.uninstall()
        return answers, server.requests


def _comparable(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests with the system messages' text left out (the plugin may add the
    engine's context) and each tool result unfenced (it may fence a function's result)."""
    bodies = copy.deepcopy(requests)
    for body in bodies:
        for message in body["messages"]:
            if message["role"] == "system":
                message.pop("content", None)
            elif message["role"] == "tool":  # a prompt function's: with its reply's time
                text = unfenced(message["content"])
                message["content"] = re.sub(r"(created'?[=:] ?)\d+", r"\1...", text)
    return bodies


@pytest.mark.parametrize(
    ("tool", "api"),
    [
        ("native", "invoke_function_call"),
        ("prompt", "invoke_function_call"),
        ("native", "kernel.invoke"),
        ("agent", "invoke_function_call"),
        ("agent", "kernel.invoke"),
    ],
)
async def test_a_function_the_app_runs_keeps_its_model_call_out_of_the_session(
    engine: ContextEngine, tool: str, api: str
) -> None:
    plain_answers, plain = await _chat(tool, api, None)
    answers, requests = await _chat(tool, api, engine)
    assert answers == plain_answers
    assert "answer: summary of alice's notes" in answers
    assert _comparable(requests) == _comparable(plain)
    inner = [r for r in requests if _inner(r)]
    assert len(inner) == 2
    for request in inner:  # the function's own call, and nothing else
        assert [m["role"] for m in request["messages"]][-1] == "user"
        assert len([m for m in request["messages"] if m["role"] != "system"]) == 1
    for user in ("alice", "bob"):
        doc = await engine.get_session(f"s-{user}")
        said = [m.content or "" for m in doc.session.messages if m.role is Role.USER]
        assert said == [f"{user} hello", f"{user} summarize my notes", f"{user} thanks"]
        assert [c.tool_call_id for c in doc.session.tool_state.tool_calls] == [f"call_{user}"]
