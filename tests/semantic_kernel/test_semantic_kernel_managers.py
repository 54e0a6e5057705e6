"""The managers of SK's orchestrations make model calls of their own: a
``GroupChatOrchestration``'s manager (the app's ``GroupChatManager`` subclass asking the model
whether to stop and who speaks next, as in SK's ``group_chat_with_chat_completion_manager``
sample) and the ``StandardMagenticManager`` (facts, plan, progress ledger, final answer). Each
of these calls sends its own prompt over a copy of the conversation; the plugin records them as
SK internal calls (stage ``route``, a child scope ``<scope>/manage:<id>``) and sends them as SK
wrote them. In a named scope (here the install default ``session_id="cli"`` of a one-user app)
they are not merged into one conversation: the requests are those SK sends without the
plugin."""

from __future__ import annotations

import copy
import json
from typing import Any

from semantic_kernel.agents import (
    BooleanResult,
    ChatCompletionAgent,
    GroupChatManager,
    GroupChatOrchestration,
    MagenticOrchestration,
    MessageResult,
    StandardMagenticManager,
    StringResult,
)
from semantic_kernel.agents.runtime import InProcessRuntime
from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import AuthorRole, ChatHistory, ChatMessageContent
from sk_apps import kernel_with

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.schema import ModelUsageStage
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

TASK = "A slogan for the eco bottle."
STOP = "MANAGER: should the chat stop? yes or no"
NEXT = "MANAGER: who speaks next?"
RESULT = "MANAGER: sum the chat up"


class ModelManager(GroupChatManager):
    """A group chat manager that asks the model (SK's sample, shortened)."""

    service: ChatCompletionClientBase

    async def _ask(self, chat_history: ChatHistory, system: str, question: str) -> str:
        chat_history.messages.insert(0, ChatMessageContent(role=AuthorRole.SYSTEM, content=system))
        chat_history.add_message(ChatMessageContent(role=AuthorRole.USER, content=question))
        settings = OpenAIChatPromptExecutionSettings()
        reply = await self.service.get_chat_message_content(chat_history, settings)
        return str(reply.content if reply is not None else "")

    async def should_request_user_input(self, chat_history: ChatHistory) -> BooleanResult:
        return BooleanResult(result=False, reason="never")

    async def should_terminate(self, chat_history: ChatHistory) -> BooleanResult:
        done = await super().should_terminate(chat_history)
        if done.result:
            return done
        answer = await self._ask(chat_history, "You moderate the chat.", STOP)
        return BooleanResult(result=answer == "yes", reason=answer)

    async def select_next_agent(
        self, chat_history: ChatHistory, participant_descriptions: dict[str, str]
    ) -> StringResult:
        answer = await self._ask(chat_history, "You pick the next speaker.", NEXT)
        return StringResult(result=answer, reason="asked")

    async def filter_results(self, chat_history: ChatHistory) -> MessageResult:
        answer = await self._ask(chat_history, "You sum chats up.", RESULT)
        message = ChatMessageContent(role=AuthorRole.ASSISTANT, content=answer)
        return MessageResult(result=message, reason="asked")


def _group_script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    last = str(messages[-1].get("content") or "")
    replies = sum(1 for m in messages if m["role"] == "assistant" and m.get("name"))
    if last == STOP:
        return ScriptedResponse(text="yes" if replies >= 2 else "no")
    if last == NEXT:
        return ScriptedResponse(text="writer" if replies % 2 == 0 else "critic")
    if last == RESULT:
        return ScriptedResponse(text=f"summed up {replies} replies")
    first = str(messages[0].get("content") or "")
    return ScriptedResponse(text=f"{first.split()[2]} reply #{len(messages)}")


def _magentic_script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    last = str(messages[-1].get("content") or "")
    if body.get("response_format"):  # the progress ledger
        done = any(m.get("name") == "researcher" for m in messages)

        def item(answer: Any) -> dict[str, Any]:
            return {"reason": "scripted", "answer": answer}

        ledger = {
            "is_request_satisfied": item(done),
            "is_in_loop": item(False),
            "is_progress_being_made": item(True),
            "next_speaker": item("researcher"),
            "instruction_or_question": item("Find the facts."),
        }
        return ScriptedResponse(text=json.dumps(ledger))
    if str(messages[0].get("content") or "").startswith("You are the researcher"):
        return ScriptedResponse(text=f"research reply #{len(messages)}")
    if last.startswith("Below I will present you a request"):
        return ScriptedResponse(text="FACTS: steel, 24 h cold")
    if last.startswith("Fantastic."):
        return ScriptedResponse(text="PLAN: ask the researcher")
    return ScriptedResponse(text="FINAL: Cold for a day, kind for a lifetime.")


async def _run(shape: str, engine: ContextEngine | None) -> tuple[str, list[dict[str, Any]]]:
    """The orchestration's result and its requests (``engine=None``: without the plugin)."""
    script = _group_script if shape == "group chat" else _magentic_script
    with ScriptedOpenAIServer(script) as server:
        if engine is not None:
            ce.semantic_kernel.install(engine, session_id="cli")
        kernel = kernel_with(server)
        service = kernel.get_service(type=ChatCompletionClientBase)
        orchestration: Any
        if shape == "group chat":
            agents = [
                ChatCompletionAgent(
                    kernel=kernel, name=name, instructions=f"You are {name}.", description=name
                )
                for name in ("writer", "critic")
            ]
            manager = ModelManager(service=service, max_rounds=6)
            orchestration = GroupChatOrchestration(members=agents, manager=manager)
        else:
            researcher = ChatCompletionAgent(
                kernel=kernel,
                name="researcher",
                instructions="You are the researcher.",
                description="finds facts",
            )
            magentic = StandardMagenticManager(chat_completion_service=service, max_round_count=4)
            orchestration = MagenticOrchestration(members=[researcher], manager=magentic)
        runtime = InProcessRuntime()
        runtime.start()
        try:
            result = await orchestration.invoke(task=TASK, runtime=runtime)
            value = await result.get(timeout=20)
        finally:
            await runtime.stop_when_idle()
            if engine is not None:
                ce.semantic_kernel.uninstall()
        return str(value.content), server.requests


def _agent_system_text_left_out(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests with an agent's instructions' text left out (the plugin may add the
    engine's context to them; an agent's system message carries its name)."""
    bodies = copy.deepcopy(requests)
    for body in bodies:
        for message in body["messages"]:
            if message["role"] == "system" and message.get("name"):
                message.pop("content", None)
    return bodies


async def _check(shape: str, engine: ContextEngine, prompts: tuple[str, ...]) -> None:
    plain_result, plain = await _run(shape, None)
    result, requests = await _run(shape, engine)
    assert result == plain_result
    assert _agent_system_text_left_out(requests) == _agent_system_text_left_out(plain)
    # the manager's calls: recorded as internal calls in child scopes of the install default
    sessions = await engine.list_sessions()
    managed = [s for s in sessions if s.startswith("cli/manage:")]
    manager_requests = [
        r
        for r in requests
        if r["messages"][0]["role"] != "system" or not r["messages"][0].get("name")
    ]
    assert len(managed) == len(manager_requests) > 0
    for session_id in managed:
        doc = await engine.get_session(session_id)
        assert [u.stage for u in doc.session.model_usage] == [ModelUsageStage.ROUTE]
        assert doc.session.messages == []
    if "cli" in sessions:
        held = (await engine.get_session("cli")).model_dump_json()
        assert not any(prompt in held for prompt in prompts)


async def test_a_group_chat_managers_model_calls_are_internal(engine: ContextEngine) -> None:
    await _check("group chat", engine, (STOP, NEXT, RESULT))


async def test_a_magentic_managers_model_calls_are_internal(engine: ContextEngine) -> None:
    await _check("magentic", engine, ("Below I will present you a request", "Fantastic."))
