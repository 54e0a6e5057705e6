"""A ``SequentialOrchestration`` of two ``ChatCompletionAgent``\\ s on SK's
``InProcessRuntime``: each request starts with its own agent's instructions and holds no other
agent's, the orchestration's result is the last agent's scripted reply, and the requests are
those SK sends without the plugin (same roles, names and messages; only the system prompt's
text may carry the engine's context)."""

from __future__ import annotations

import copy
from typing import Any

from semantic_kernel.agents import ChatCompletionAgent, SequentialOrchestration
from semantic_kernel.agents.runtime import InProcessRuntime
from sk_apps import kernel_with, roles, wire

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, no_blocking

EXTRACTOR = "You are the extractor. List the product's key features."
WRITER = "You are the writer. Write the launch copy."
INSTRUCTIONS = {"extractor": EXTRACTOR, "writer": WRITER}
TASK = "Launch copy for the eco bottle."
FEATURES = "Features: recycled steel, keeps drinks cold 24 h."
COPY = "Copy: the eco bottle keeps it cold, and the planet too."


def _script(body: dict[str, Any]) -> ScriptedResponse:
    first = body["messages"][0]["content"]
    if first.startswith(EXTRACTOR):
        return ScriptedResponse(text=FEATURES, prompt_tokens=40)
    if first.startswith(WRITER):
        return ScriptedResponse(text=COPY, prompt_tokens=50)
    return ScriptedResponse(text="unexpected request")


async def _run(install: ContextEngine | None) -> tuple[str, list[dict[str, Any]]]:
    """The orchestration's result and the requests it sent (with the plugin on ``install``)."""
    with ScriptedOpenAIServer(_script) as server:
        kernel = kernel_with(server)
        if install is not None:
            ce.semantic_kernel.install(install)
        agents = [
            ChatCompletionAgent(kernel=kernel, name=name, instructions=text)
            for name, text in INSTRUCTIONS.items()
        ]
        orchestration = SequentialOrchestration(members=agents)
        runtime = InProcessRuntime()
        runtime.start()
        try:
            result = await orchestration.invoke(task=TASK, runtime=runtime)
            value = await result.get(timeout=20)
        finally:
            await runtime.stop_when_idle()
        if install is not None:
            ce.semantic_kernel.uninstall()
        return str(value.content), server.requests


def _modulo_system_text(request: dict[str, Any]) -> dict[str, Any]:
    """The request with its system messages' text left out (the plugin may add the engine's
    context to the instructions; everything else goes as SK wrote it)."""
    body = copy.deepcopy(request)
    for message in body["messages"]:
        if message["role"] == "system":
            message.pop("content", None)
    return body


async def test_each_agent_gets_its_own_instructions_and_the_run_is_sks(
    engine: ContextEngine,
) -> None:
    plain_result, plain = await _run(None)
    with no_blocking(engine) as blocking:
        result, requests = await _run(engine)
    assert blocking.used == []
    assert plain_result == result == COPY
    assert len(requests) == 2
    for request, (name, own) in zip(requests, INSTRUCTIONS.items(), strict=True):
        first = request["messages"][0]
        assert first["role"] == "system" and first["content"].startswith(own)
        assert roles(request).count("system") == 1
        others = [text for other, text in INSTRUCTIONS.items() if other != name]
        assert all(text not in wire(request) for text in others)
    extractor, writer = requests
    assert TASK in wire(extractor) and FEATURES in wire(writer)
    # the same run without the plugin: the same roles and, apart from the system prompt's text
    # (which keeps SK's instructions first), the same requests
    assert [roles(r) for r in requests] == [roles(r) for r in plain]
    assert [_modulo_system_text(r) for r in requests] == [_modulo_system_text(r) for r in plain]
    for request, original in zip(requests, plain, strict=True):
        assert request["messages"][0]["content"].startswith(original["messages"][0]["content"])
    # the plugin was on: each agent's reply is recorded with the agent as author
    authored = set()
    for session_id in await engine.list_sessions():
        doc = await engine.get_session(session_id)
        authored |= {
            (m.author.id, m.content)
            for m in doc.session.messages
            if m.role is Role.ASSISTANT and m.author
        }
    assert authored == {("extractor", FEATURES), ("writer", COPY)}
