"""An ``AgentGroupChat`` of two ``ChatCompletionAgent``\\ s with a
``KernelFunctionSelectionStrategy`` and a ``KernelFunctionTerminationStrategy`` on the same
service: the chat is one session for both agents (each agent's channel thread has its own
random id), each request starts with its own agent's instructions, the replies are stored once
with their agent as author and the researcher's reaches the writer once; the strategies'
prompts are recorded in child scopes and never rewritten (no engine context, not in the
conversation); a model call the app makes while it consumes the chat's replies is the app's
own."""

from __future__ import annotations

from typing import Any

from semantic_kernel.agents import AgentGroupChat, ChatCompletionAgent
from semantic_kernel.agents.strategies import (
    KernelFunctionSelectionStrategy,
    KernelFunctionTerminationStrategy,
)
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistory
from semantic_kernel.functions import KernelFunctionFromPrompt
from semantic_kernel.prompt_template import PromptTemplateConfig
from sk_apps import kernel_with, wire

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, no_blocking

RESEARCHER = "You are the researcher. Find facts."
WRITER = "You are the writer. Write the brief."
MARK = "NOTEBOOK-MARK-TEAM"
SELECT = "SELECT-NEXT-SPEAKER among {{$_agent_}}: {{$_history_}}"
DONE = "IS-IT-DONE? {{$_history_}}"
FACTS = "Facts: 9 C and light rain in Oslo."
BRIEF = "Brief: pack a rain jacket for Oslo."


def _script(body: dict[str, Any]) -> ScriptedResponse:
    text = wire(body)
    if "SELECT-NEXT-SPEAKER" in text:
        return ScriptedResponse(text="writer" if FACTS in text else "researcher", prompt_tokens=31)
    if "IS-IT-DONE?" in text:
        return ScriptedResponse(text="yes" if BRIEF in text else "no", prompt_tokens=21)
    first = body["messages"][0]["content"]
    if first.startswith(RESEARCHER):
        return ScriptedResponse(text=FACTS, prompt_tokens=50)
    return ScriptedResponse(text=BRIEF, prompt_tokens=60)


def _chat(server: ScriptedOpenAIServer) -> AgentGroupChat:
    kernel = kernel_with(server)
    researcher = ChatCompletionAgent(kernel=kernel, name="researcher", instructions=RESEARCHER)
    writer = ChatCompletionAgent(kernel=kernel, name="writer", instructions=WRITER)
    selection = KernelFunctionSelectionStrategy(
        function=KernelFunctionFromPrompt(
            function_name="select",
            prompt_template_config=PromptTemplateConfig(
                template=SELECT, allow_dangerously_set_content=True
            ),
        ),
        kernel=kernel,
        result_parser=lambda result: str(result.value[0]).strip(),
    )
    termination = KernelFunctionTerminationStrategy(
        function=KernelFunctionFromPrompt(
            function_name="done",
            prompt_template_config=PromptTemplateConfig(
                template=DONE, allow_dangerously_set_content=True
            ),
        ),
        kernel=kernel,
        result_parser=lambda result: "yes" in str(result.value[0]).lower(),
        maximum_iterations=4,
    )
    return AgentGroupChat(
        agents=[researcher, writer], selection_strategy=selection, termination_strategy=termination
    )


async def test_the_chat_is_one_session_each_agent_with_its_own_instructions(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        chat = _chat(server)
        ce.semantic_kernel.install(engine)
        await engine.update_notebook("s-team", MARK)
        with no_blocking(engine) as blocking, engine.session("s-team"):
            await chat.add_chat_message("Brief me on Oslo this weekend.")
            replies = [str(m.content) async for m in chat.invoke()]
        requests = server.requests
    assert blocking.used == []
    assert replies == [FACTS, BRIEF]
    selections = [r for r in requests if "SELECT-NEXT-SPEAKER" in wire(r)]
    checks = [r for r in requests if "IS-IT-DONE?" in wire(r)]
    agents = [r for r in requests if r not in selections and r not in checks]
    assert len(selections) == 2 and len(checks) == 2 and len(agents) == 2
    # the strategies' prompts are recorded only, never rewritten
    assert all(MARK not in wire(r) for r in selections + checks)
    researcher, writer = agents
    assert researcher["messages"][0]["content"].startswith(RESEARCHER)
    assert writer["messages"][0]["content"].startswith(WRITER)
    for request in agents:
        assert MARK in request["messages"][0]["content"]
        assert [m["role"] for m in request["messages"]].count("system") == 1
    assert RESEARCHER not in wire(writer) and WRITER not in wire(researcher)
    # SK's channel hands the writer the researcher's reply twice (its own behaviour, the same
    # without the plugin): the session holds it once and the writer gets it once
    assert wire(writer).count(FACTS) == 1
    doc = await engine.get_session("s-team")
    messages = doc.session.messages
    assert [m.content for m in messages if m.role is Role.USER] == [
        "Brief me on Oslo this weekend."
    ]
    authored = [
        (m.author.id if m.author else None, m.content) for m in messages if m.role is Role.ASSISTANT
    ]
    assert authored == [("researcher", FACTS), ("writer", BRIEF)]
    assert [u.prompt_tokens for u in doc.session.model_usage] == [50, 60]
    children = [s for s in await engine.list_sessions() if s.startswith("s-team/select:")]
    assert len(children) == 2
    for child in children:
        usage = (await engine.get_session(child)).session.model_usage
        assert [(u.prompt_tokens, u.stage.value) for u in usage] == [(31, "route")]
    done = [s for s in await engine.list_sessions() if s.startswith("s-team/terminate:")]
    assert len(done) == 2
    for child in done:
        usage = (await engine.get_session(child)).session.model_usage
        assert [(u.prompt_tokens, u.stage.value) for u in usage] == [(21, "route")]


async def test_a_chat_without_a_session_is_one_run_across_its_invocations(
    engine: ContextEngine,
) -> None:
    with ScriptedOpenAIServer(_script) as server:
        chat = _chat(server)
        ce.semantic_kernel.install(engine)
        await chat.add_chat_message("Brief me on Oslo.")
        async for _ in chat.invoke():
            pass
        chat.is_complete = False
        await chat.add_chat_message("And Bergen?")
        async for _ in chat.invoke():
            pass
    runs = [s for s in await engine.list_sessions() if s.startswith("run:") and "/" not in s]
    (run,) = runs
    doc = await engine.get_session(run)
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "Brief me on Oslo.",
        "And Bergen?",
    ]


async def test_a_model_call_made_while_consuming_the_chat_is_the_apps_own(
    engine: ContextEngine,
) -> None:
    classifier = "SYS-MOD: classifier"
    with ScriptedOpenAIServer(_script) as server:
        chat = _chat(server)
        service = chat.agents[0].kernel.get_service(type=None)
        ce.semantic_kernel.install(engine)
        await chat.add_chat_message("Brief me on Oslo.")
        async for message in chat.invoke():
            history = ChatHistory(system_message=classifier)
            history.add_user_message(f"Classify: {message.content}")
            await service.get_chat_message_content(history, OpenAIChatPromptExecutionSettings())
        requests = server.requests
    classified = [r for r in requests if r["messages"][-1]["content"].startswith("Classify")]
    assert len(classified) == 2
    for request in classified:
        assert [m["role"] for m in request["messages"]] == ["system", "user"]
        assert "Brief me on Oslo." not in wire(request)
    agents = [r for r in requests if r not in classified and "SELECT" not in wire(r)]
    assert all(classifier not in wire(r) for r in agents)
    runs = [s for s in await engine.list_sessions() if s.startswith("run:") and "/" not in s]
    assert len(runs) == 3  # the chat's run and one of the app's own per call
    docs = [(await engine.get_session(run)).session for run in runs]
    (team,) = [d for d in docs if any(m.content == "Brief me on Oslo." for m in d.messages)]
    assert all("Classify" not in (m.content or "") for m in team.messages)
    assert [m.author.id for m in team.messages if m.role is Role.ASSISTANT and m.author] == [
        "researcher",
        "writer",
    ]


async def test_a_peers_reply_the_engine_rewrote_still_goes_as_the_peers(
    engine: ContextEngine,
) -> None:
    """The researcher's reply holds an e-mail address, so the engine sends it redacted: no
    longer the app's own message, it is built anew, and still named after the researcher (as
    SK names an agent's reply), never an anonymous assistant turn the writer would take for
    its own."""
    facts = "Facts: 9 C and light rain in Oslo; ask ops@example.com."

    def script(body: dict[str, Any]) -> ScriptedResponse:
        text = wire(body)
        if "SELECT-NEXT-SPEAKER" in text:
            return ScriptedResponse(text="writer" if "Facts:" in text else "researcher")
        if "IS-IT-DONE?" in text:
            return ScriptedResponse(text="yes" if BRIEF in text else "no")
        if body["messages"][0]["content"].startswith(RESEARCHER):
            return ScriptedResponse(text=facts)
        return ScriptedResponse(text=BRIEF)

    with ScriptedOpenAIServer(script) as server:
        chat = _chat(server)
        ce.semantic_kernel.install(engine)
        with engine.session("s-team-redacted"):
            await chat.add_chat_message("Brief me on Oslo this weekend.")
            replies = [str(m.content) async for m in chat.invoke()]
        requests = server.requests
    assert replies == [facts, BRIEF]
    agents = [r for r in requests if "SELECT-NEXT-SPEAKER" not in wire(r)]
    agents = [r for r in agents if "IS-IT-DONE?" not in wire(r)]
    writer = agents[-1]
    assert writer["messages"][0]["content"].startswith(WRITER)
    (reply,) = [m for m in writer["messages"] if m["role"] == "assistant"]
    assert reply["content"] == "Facts: 9 C and light rain in Oslo; ask [REDACTED:email]."
    assert reply["name"] == "researcher"
    assert "ops@example.com" not in wire(writer)
