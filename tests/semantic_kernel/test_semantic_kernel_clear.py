"""An app that ends its conversation and starts a new one in the same session: an agent
thread deleted (``await thread.delete()``), an app's ``ChatHistory`` cleared
(``chat_history.clear()``). The next request holds only the new conversation, as SK sends it
without the plugin: none of the earlier turns comes back from the session. Only the sessions
the thread's or the history's own calls were recorded in are cleared: another user's
conversation goes on; a history no model call sent clears nothing; after ``uninstall()``
SK's own methods are back and clear nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import ChatHistory
from semantic_kernel.functions import kernel_function
from sk_apps import kernel_with, wire

import ce.semantic_kernel
from ce.core.engine import ContextEngine
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, no_blocking
from ce.semantic_kernel._patch import patched_targets

SYSTEM = "You are the clearing test agent."
EARLIER = ["OLD-ONE from {user}", "OLD-TWO from {user}"]
LATER = "NEW-ONE from {user}"


def _echo(body: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(text=f"noted {body['messages'][-1]['content']}")


def _sent(request: dict[str, Any]) -> list[tuple[str, Any]]:
    """A request's messages as (role, content), system messages left out."""
    return [(m["role"], m.get("content")) for m in request["messages"] if m["role"] != "system"]


def _agent(server: ScriptedOpenAIServer, name: str = "helper") -> ChatCompletionAgent:
    return ChatCompletionAgent(kernel=kernel_with(server), name=name, instructions=SYSTEM)


async def _ask(service: Any, history: ChatHistory, text: str, stream: bool) -> None:
    """One turn of the app's own chat loop on ``history`` (the reply appended)."""
    history.add_user_message(text)
    settings = OpenAIChatPromptExecutionSettings()
    if stream:
        reply = None
        async for chunk in service.get_streaming_chat_message_content(history, settings):
            reply = chunk if reply is None else reply + chunk
    else:
        reply = await service.get_chat_message_content(history, settings)
    assert reply is not None
    history.add_message(reply)


@pytest.mark.parametrize("named", ["thread id", "engine session"])
async def test_a_deleted_thread_leaves_the_next_conversation_only_its_own(
    engine: ContextEngine, named: str
) -> None:
    """Two turns on a thread, ``delete()``, a new thread in the same session (the same id,
    or a new thread inside the same ``engine.session``): its request holds only its own
    question, as without the plugin, and the recorder never blocked."""

    async def requests(install: bool) -> list[dict[str, Any]]:
        with ScriptedOpenAIServer(_echo) as server:
            agent = _agent(server)
            if install:
                ce.semantic_kernel.install(engine)

            def thread() -> ChatHistoryAgentThread:
                return ChatHistoryAgentThread(thread_id="user-1" if named == "thread id" else None)

            async def conversation() -> None:
                first = thread()
                for text in EARLIER:
                    await agent.get_response(messages=text.format(user="alice"), thread=first)
                await first.delete()
                await agent.get_response(messages=LATER.format(user="alice"), thread=thread())

            if named == "thread id":
                await conversation()
            else:
                with engine.session("user-1"):
                    await conversation()
            if install:
                ce.semantic_kernel.uninstall()
            return server.requests

    native = await requests(False)
    with no_blocking(engine) as blocking:
        sent = await requests(True)
    assert blocking.used == []
    assert len(sent) == 3
    assert "OLD-ONE" in wire(sent[1])  # the thread's own earlier turn, before the delete
    assert _sent(sent[2]) == [("user", LATER.format(user="alice"))]
    assert sent[2]["messages"] == native[2]["messages"]
    doc = await engine.get_session("user-1")
    asked = [EARLIER[0], EARLIER[1], LATER]
    assert [m.content for m in doc.session.messages if m.role.value == "user"] == [
        text.format(user="alice") for text in asked
    ]  # the earlier turns stay stored


async def test_a_thread_deleted_by_a_later_process_clears_its_named_session(
    engine: ContextEngine,
) -> None:
    """The app names the thread; a later request builds a new thread object with that id,
    never run, and deletes it to start over: the session it names is cleared."""
    with ScriptedOpenAIServer(_echo) as server:
        agent = _agent(server)
        ce.semantic_kernel.install(engine)
        for text in EARLIER:
            await agent.get_response(
                messages=text.format(user="alice"), thread=ChatHistoryAgentThread(thread_id="u-9")
            )
        await ChatHistoryAgentThread(thread_id="u-9").delete()
        await agent.get_response(
            messages=LATER.format(user="alice"), thread=ChatHistoryAgentThread(thread_id="u-9")
        )
        requests = server.requests
    assert "OLD-ONE" in wire(requests[1])  # the session gave the earlier turn back
    assert _sent(requests[2]) == [("user", LATER.format(user="alice"))]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_cleared_chat_history_sends_only_the_new_messages(
    engine: ContextEngine, stream: bool
) -> None:
    """The app's own chat loop on one ``ChatHistory`` in ``engine.session("user-1")``:
    ``clear()`` (sync, on the event loop's thread: queued, never blocking), then a new
    question: its request holds that question only."""
    with ScriptedOpenAIServer(_echo) as server:
        service = kernel_with(server).get_service(type=None)
        ce.semantic_kernel.install(engine)
        history = ChatHistory(system_message=SYSTEM)
        with no_blocking(engine) as blocking, engine.session("user-1"):
            for text in EARLIER:
                await _ask(service, history, text.format(user="alice"), stream)
            history.clear()
            await _ask(service, history, LATER.format(user="alice"), stream)
        requests = server.requests
    assert blocking.used == []
    assert "OLD-ONE" in wire(requests[1])
    assert _sent(requests[2]) == [("user", LATER.format(user="alice"))]


async def test_a_chat_history_cleared_outside_an_event_loop_is_cleared_at_once(
    engine: ContextEngine,
) -> None:
    """``clear()`` called from a thread with no event loop (a worker of the app) writes the
    clear there and then."""
    with ScriptedOpenAIServer(_echo) as server:
        service = kernel_with(server).get_service(type=None)
        ce.semantic_kernel.install(engine, session_id="user-1")
        history = ChatHistory()
        for text in EARLIER:
            await _ask(service, history, text.format(user="alice"), False)
        await asyncio.to_thread(history.clear)
        await _ask(service, history, LATER.format(user="alice"), False)
        requests = server.requests
    assert _sent(requests[2]) == [("user", LATER.format(user="alice"))]


@pytest.mark.parametrize("kind", ["agent thread", "chat history"])
async def test_two_users_at_once_one_clears_the_other_keeps_its_history(
    engine: ContextEngine, kind: str
) -> None:
    """Alice and bob, two turns each under ``asyncio.gather``; alice ends her conversation
    after the first and asks again: her request holds her new question only, bob's holds his
    earlier turn."""
    with ScriptedOpenAIServer(_echo) as server:
        ce.semantic_kernel.install(engine)

        async def user(name: str) -> None:
            first, later = EARLIER[0].format(user=name), LATER.format(user=name)
            if kind == "agent thread":
                agent = _agent(server, f"agent_{name}")
                thread = ChatHistoryAgentThread(thread_id=f"u-{name}")
                await agent.get_response(messages=first, thread=thread)
                if name == "alice":
                    await thread.delete()
                    thread = ChatHistoryAgentThread(thread_id=f"u-{name}")
                await asyncio.sleep(0)  # let bob's turn interleave
                await agent.get_response(messages=later, thread=thread)
                return
            service = kernel_with(server).get_service(type=None)
            history = ChatHistory(system_message=SYSTEM)
            with engine.session(f"u-{name}"):
                await _ask(service, history, first, False)
                if name == "alice":
                    history.clear()
                await asyncio.sleep(0)
                await _ask(service, history, later, False)

        with no_blocking(engine) as blocking:
            await asyncio.gather(user("alice"), user("bob"))
        requests = server.requests
    assert blocking.used == []
    assert len(requests) == 4
    later = {
        name: next(r for r in requests if LATER.format(user=name) in wire(r))
        for name in ("alice", "bob")
    }
    assert _sent(later["alice"]) == [("user", LATER.format(user="alice"))]
    assert _sent(later["bob"]) == [
        ("user", EARLIER[0].format(user="bob")),
        ("assistant", f"noted {EARLIER[0].format(user='bob')}"),
        ("user", LATER.format(user="bob")),
    ]
    for request in requests:
        text = wire(request)
        assert ("alice" in text) != ("bob" in text)


async def test_only_what_a_history_or_thread_sent_is_cleared(engine: ContextEngine) -> None:
    """In ``engine.session("user-1")``: a ``ChatHistory`` no model call sent, cleared; a
    thread of another session deleted: the session's conversation goes on whole."""
    with ScriptedOpenAIServer(_echo) as server:
        service = kernel_with(server).get_service(type=None)
        agent = _agent(server)
        ce.semantic_kernel.install(engine)
        history = ChatHistory(system_message=SYSTEM)
        other = ChatHistoryAgentThread(thread_id="someone-else")
        await agent.get_response(messages="elsewhere", thread=other)
        with engine.session("user-1"):
            await _ask(service, history, EARLIER[0].format(user="alice"), False)
            unsent = ChatHistory()
            unsent.add_user_message("never sent")
            unsent.clear()
        await other.delete()
        with engine.session("user-1"):
            await _ask(service, ChatHistory(system_message=SYSTEM), LATER, False)
        requests = server.requests
    assert _sent(requests[2]) == [
        ("user", EARLIER[0].format(user="alice")),
        ("assistant", f"noted {EARLIER[0].format(user='alice')}"),
        ("user", LATER),
    ]


async def test_a_thread_whose_agent_ran_inside_a_function_clears_no_session_of_the_app(
    engine: ContextEngine,
) -> None:
    """The model calls a function that asks a helper agent on a thread the app keeps; its
    calls are nested in the function call. The app deletes that thread inside its own
    ``engine.session("user-1")``: the user's conversation goes on whole."""

    class Helper:
        def __init__(self, agent: ChatCompletionAgent) -> None:
            self.agent, self.thread = agent, ChatHistoryAgentThread()

        @kernel_function(name="ask", description="Ask the helper.")
        async def ask(self, question: str) -> str:
            return str(
                (await self.agent.get_response(messages=question, thread=self.thread)).message
            )

    def script(body: dict[str, Any]) -> ScriptedResponse:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return ScriptedResponse(text="the helper says hi")
        if body.get("tools") and "USE-HELPER" in str(last["content"]):
            return ScriptedResponse(tool_calls=[("call_h", "Helper-ask", '{"question": "hi?"}')])
        return _echo(body)

    with ScriptedOpenAIServer(script) as server:
        helper = Helper(ChatCompletionAgent(kernel=kernel_with(server), name="h", instructions="H"))
        kernel = kernel_with(server, (helper, "Helper"))
        service = kernel.get_service(type=None)
        behavior = FunctionChoiceBehavior.Auto()
        settings = OpenAIChatPromptExecutionSettings(function_choice_behavior=behavior)
        ce.semantic_kernel.install(engine)
        history = ChatHistory(system_message=SYSTEM)
        history.add_user_message("USE-HELPER please")
        with engine.session("user-1"):
            reply = await service.get_chat_message_content(history, settings, kernel=kernel)
            assert reply is not None and str(reply.content) == "the helper says hi"
            await helper.thread.delete()
            await _ask(service, ChatHistory(system_message=SYSTEM), LATER, False)
        requests = server.requests
    assert len(requests) == 4  # the user's, the helper's, the user's next round, the new one
    assert "USE-HELPER please" in wire(requests[3])


async def test_after_uninstall_sks_own_methods_are_back_and_clear_nothing(
    engine: ContextEngine,
) -> None:
    targets = patched_targets()
    assert (ChatHistory, "clear") in targets
    assert (ChatHistoryAgentThread, "_delete") in targets
    clear, delete = vars(ChatHistory)["clear"], vars(ChatHistoryAgentThread)["_delete"]
    with ScriptedOpenAIServer(_echo) as server:
        agent = _agent(server)
        plugin = ce.semantic_kernel.install(engine)
        assert vars(ChatHistory)["clear"] is not clear
        assert vars(ChatHistoryAgentThread)["_delete"] is not delete
        thread = ChatHistoryAgentThread(thread_id="user-1")
        await agent.get_response(messages=EARLIER[0].format(user="alice"), thread=thread)
        plugin.uninstall()
        assert vars(ChatHistory)["clear"] is clear
        assert vars(ChatHistoryAgentThread)["_delete"] is delete
        await thread.delete()
        ce.semantic_kernel.install(engine)
        await agent.get_response(messages=LATER, thread=ChatHistoryAgentThread(thread_id="user-1"))
        requests = server.requests
    assert "OLD-ONE" in wire(requests[1])  # deleted while uninstalled: nothing was cleared
