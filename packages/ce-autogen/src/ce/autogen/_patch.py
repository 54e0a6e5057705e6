"""Where the plugin hooks into AutoGen, and why there.

AutoGen 0.7 has no hook API in front of a model call: ``AssistantAgent`` reads its client at
the start of a turn and calls it from its class methods ``_call_llm`` (every call of the tool
loop) and ``_reflect_on_tool_use_flow`` (the reflection); its static ``_execute_tool_call``
runs each tool call (AutoGen's call id, ``is_error``), its static
``_update_model_context_with_memory`` queries the memories. The plugin replaces these four
class attributes, and ``on_messages_stream`` (a turn of a standalone agent starts a run; a
team agent's turn that ends with a tool-call summary or a handoff message stores it) and
``BaseGroupChat.run_stream`` (a team's run), ``SocietyOfMindAgent.on_messages_stream`` (the
inner team's run is nested in the turn; a turn outside a team stores the task and the answer)
and ``SelectorGroupChatManager._select_speaker`` (the speaker-selection prompt, recorded
only), ``AssistantAgent.on_reset``, ``SocietyOfMindAgent.on_reset`` and
``BaseGroupChat.reset`` (the reset of an agent or a team clears the session of its last run:
AutoGen has no reset hook, and every team's ``reset`` is ``BaseGroupChat``'s), each by a
function that does its part around the original; and ``FunctionTool.run``, whose sync tool
bodies AutoGen runs in an executor thread that does not get the caller's context variables:
inside an instrumented tool call the body runs in a copy of the caller's context, so the
session (``engine.session``) and the tool call a run started in the body is nested in are
kept. They are class-level, so agents and teams built before ``install()`` are covered, and
the agents themselves are never changed (their client, state and config stay
theirs). Every replacement is recorded in the plugin's ledger: ``uninstall()`` puts back the
very objects the classes held.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from ce.autogen._convert import (
    arguments_of,
    emitted_message,
    handed_key,
    part_of,
    society_turn,
    to_openai,
)
from ce.autogen._inject import CallSite, EngineClient, RecordingClient
from ce.autogen._record import HANDED, SHOWN, hits_from_memory, tool_run, write
from ce.autogen._scopes import (
    Frame,
    ToolFrame,
    agents_of,
    current_tool,
    filtered_of,
    in_tool,
)
from ce.core.integration import clear_sessions, guarded, is_suppressed

if TYPE_CHECKING:
    from ce.autogen._record import Book
    from ce.autogen._scopes import Runs
    from ce.core.integration import PatchLedger, Plugin, Recorder

__all__ = ["Patches", "patched_targets"]

logger = logging.getLogger("ce.autogen")


def patched_targets() -> list[tuple[Any, str]]:
    """The ``(class, attribute)`` pairs the plugin replaces while installed."""
    return [(owner, attr) for owner, attr, _ in _hooks()]


def _hooks() -> list[tuple[Any, str, str]]:
    """Each replaced ``(class, attribute)`` with the :class:`Patches` method that makes its
    replacement from the original."""
    from autogen_agentchat.agents import AssistantAgent, SocietyOfMindAgent
    from autogen_agentchat.teams import BaseGroupChat
    from autogen_agentchat.teams._group_chat._selector_group_chat import (
        SelectorGroupChatManager,
    )
    from autogen_core.tools import FunctionTool

    return [
        (AssistantAgent, "_call_llm", "_make_call_llm"),
        (AssistantAgent, "_reflect_on_tool_use_flow", "_make_reflect_on_tool_use_flow"),
        (AssistantAgent, "_execute_tool_call", "_make_execute_tool_call"),
        (
            AssistantAgent,
            "_update_model_context_with_memory",
            "_make_update_model_context_with_memory",
        ),
        (AssistantAgent, "on_messages_stream", "_make_on_messages_stream"),
        (AssistantAgent, "on_reset", "_make_on_reset"),
        (SocietyOfMindAgent, "on_messages_stream", "_make_society_turn"),
        (SocietyOfMindAgent, "on_reset", "_make_on_reset"),
        (BaseGroupChat, "run_stream", "_make_run_stream"),
        (BaseGroupChat, "reset", "_make_reset"),
        (SelectorGroupChatManager, "_select_speaker", "_make_select_speaker"),
        (FunctionTool, "run", "_make_run"),
    ]


async def _note_shown(agent: Any, name: str, chat_message: Any) -> None:
    """When ``chat_message`` (the end of agent ``name``'s turn) is a ``StructuredMessage``,
    note the text its peers receive (its content's compact JSON) as the reply the model
    wrote, the newest assistant message of the agent's model context (see
    :class:`~ce.autogen._record.ShownTexts`): a peer's call then passes it as the reply the
    session holds, recorded once."""
    from autogen_agentchat.messages import StructuredMessage
    from autogen_core.models import AssistantMessage

    model_context = getattr(agent, "_model_context", None)
    if not isinstance(chat_message, StructuredMessage) or model_context is None:
        return
    shown = chat_message.to_model_message().content
    held = await model_context.get_messages()
    written = next(
        (m.content for m in reversed(held) if isinstance(m, AssistantMessage)),
        None,
    )
    if isinstance(shown, str) and isinstance(written, str):
        SHOWN.note(name, shown, written)


async def _note_handed(agent: Any, name: str, chat_message: Any) -> None:
    """When ``chat_message`` (the end of agent ``name``'s turn) is a ``HandoffMessage`` with
    a context, note the context's assistant message (the reply's tool calls but the
    handoffs, or its thought) as a part of the reply the model wrote, the newest assistant
    message of the agent's model context (see :class:`~ce.autogen._record.HandedParts`): a
    peer's call then passes it as the reply the session holds, recorded once."""
    from autogen_agentchat.messages import HandoffMessage
    from autogen_core.models import AssistantMessage

    model_context = getattr(agent, "_model_context", None)
    if not isinstance(chat_message, HandoffMessage) or model_context is None:
        return
    part = next((m for m in chat_message.context if isinstance(m, AssistantMessage)), None)
    if part is None:
        return
    held = await model_context.get_messages()
    reply = next((m for m in reversed(held) if isinstance(m, AssistantMessage)), None)
    if reply is not None and part_of(part, reply):
        HANDED.note(name, handed_key(part), to_openai([reply])[0])


class Patches:
    """The hooks of one install."""

    def __init__(self, plugin: Plugin, runs: Runs, book: Book, inject: bool) -> None:
        self.plugin = plugin
        self.runs = runs
        self.book = book
        self.inject = inject

    # -- install ----------------------------------------------------------------------------

    def install(self, ledger: PatchLedger) -> None:
        for owner, attr, maker in _hooks():
            raw = vars(owner)[attr]
            make: Callable[[Any], Any] = getattr(self, maker)
            if isinstance(raw, classmethod):
                new: Any = classmethod(make(raw.__func__))
            elif isinstance(raw, staticmethod):
                new = staticmethod(make(raw.__func__))
            else:
                new = make(raw)
            ledger.replace(owner, attr, new)

    # -- runs -------------------------------------------------------------------------------

    def _make_on_messages_stream(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from autogen_agentchat.base import Response

        runs, emitted = self.runs, self._emitted

        async def on_messages_stream(
            agent: Any, *args: Any, **kwargs: Any
        ) -> AsyncGenerator[Any, None]:
            frame: Frame | None = None
            in_team = False
            if not is_suppressed():
                in_team = runs.team_frame(agent) is not None
                if not in_team:
                    frame = Frame(runs.new_scope())
                    runs.bind_agent(agent, frame)
                    if runs.targeted(agent):
                        runs.ran(agent, frame.session_id)
            try:
                async for item in original(agent, *args, **kwargs):
                    if in_team and isinstance(item, Response):
                        await emitted(agent, item.chat_message)
                    yield item
            finally:
                if frame is not None:
                    runs.unbind(frame)

        return on_messages_stream

    async def _emitted(self, agent: Any, chat_message: Any) -> None:
        """A team agent's turn ended with ``chat_message``: when it is a message AutoGen
        shows the peers but never puts into the agent's own model context (a tool-call
        summary, a handoff message, see :func:`emitted_message`), it is stored now, in the
        order the team emits it, with the agent as author, and noted as the agent's emitted
        message (it never comes back to the agent as its own assistant turn). A structured
        reply's text as the peers receive it is noted (see :func:`_note_shown`), and so is
        the part of the reply a handoff passes on (see :func:`_note_handed`)."""
        plugin, book = self.plugin, self.book
        frame = self.runs.for_context(getattr(agent, "_model_context", None))
        if frame is None or not plugin.installed:
            return
        name = str(getattr(agent, "name", ""))
        session_id = frame.session_id
        if getattr(chat_message, "context", None):  # a handoff passing part of the reply on
            await guarded(
                plugin,
                lambda: _note_handed(agent, name, chat_message),
                session_id=session_id,
                what="note a handoff's context",
            )
        message = emitted_message(chat_message, name)
        if message is None:
            await guarded(
                plugin,
                lambda: _note_shown(agent, name, chat_message),
                session_id=session_id,
                what="note a structured reply",
            )
            return

        async def record(recorder: Recorder) -> None:
            texts = [message.content]
            redactor = plugin.engine.redactor_for(plugin.config)
            if redactor is not None:
                texts.append(redactor.redact_text(message.content).redacted_text)
            book.note_emitted(session_id, name, texts)
            await recorder.engine.commit_assistant_message(session_id, message)

        await write(plugin, session_id, "record emitted message", record)

    def _make_run_stream(self, original: Callable[..., Any]) -> Callable[..., Any]:
        runs = self.runs

        async def run_stream(team: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            frame: Frame | None = None
            agents = list(agents_of(team))
            inside = any(runs.team_frame(a) is not None for a in agents)
            if not is_suppressed() and not inside:
                # the agents whose replies are model output; a user proxy's messages are the
                # user's, a code executor's are tool output: both stay user messages
                names = frozenset(
                    str(getattr(a, "name", "")) for a in agents if hasattr(a, "_model_client")
                )
                filtered = frozenset(str(getattr(a, "name", "")) for a in filtered_of(team))
                scope = runs.new_scope(runs.nested_in(team))
                frame = Frame(scope, peers=names, filtered=filtered & names, team=True)
                for agent in agents:
                    runs.bind_agent(agent, frame)
                    runs.ran(agent, None)  # the team's run: the team's reset clears it
                runs.bind_team(team, str(getattr(team, "_team_id", id(team))), frame)
                if any(runs.targeted(obj) for obj in (team, *agents)):
                    runs.ran(team, scope.session_id)
            try:
                async for item in original(team, *args, **kwargs):
                    yield item
            finally:
                if frame is not None:
                    runs.unbind(frame)

        return run_stream

    def _make_society_turn(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from autogen_agentchat.base import Response

        runs, turn = self.runs, self._society_turn

        async def on_messages_stream(
            agent: Any, *args: Any, **kwargs: Any
        ) -> AsyncGenerator[Any, None]:
            # the inner team's run is nested in this turn: AutoGen hands the team only the
            # turn's messages (the earlier ones as one handoff's context) and resets it after
            # the answer, so it never shares the conversation the agent takes part in
            team = getattr(agent, "_team", None)
            name = str(getattr(agent, "name", ""))
            nested: ToolFrame | None = None
            alone: str | None = None  # the session a turn outside a team is recorded in
            if team is not None and not is_suppressed():
                outer = runs.team_frame(agent)
                parent = outer.scope if outer is not None else runs.new_scope()
                nested = runs.nest(team, parent, name)
                if outer is None and runs.targeted(agent):
                    alone = parent.session_id
                    runs.ran(agent, alone)
            incoming = args[0] if args else kwargs.get("messages", ())
            try:
                async for item in original(agent, *args, **kwargs):
                    if alone is not None and isinstance(item, Response):
                        await turn(alone, name, incoming, item.chat_message)
                    yield item
            finally:
                if nested is not None:
                    runs.unnest(team, nested)

        return on_messages_stream

    async def _society_turn(self, session_id: str, name: str, incoming: Any, answer: Any) -> None:
        """A turn of the ``SocietyOfMindAgent`` named ``name`` outside a team ended with
        ``answer``: the turn's messages (the app's task) and the answer, written by the
        agent, are stored as a turn of ``session_id``, the agent's conversation with the app.
        No model call carries them: the inner team's calls are nested, and the agent's summary
        call is neither injected nor recorded."""

        async def record(recorder: Recorder) -> None:
            messages = society_turn(incoming, answer, name)
            await recorder.engine.record_messages(session_id, messages)

        await write(self.plugin, session_id, "record society-of-mind turn", record)

    # -- resets -----------------------------------------------------------------------------

    def _make_on_reset(self, original: Callable[..., Any]) -> Callable[..., Any]:
        runs, clear = self.runs, self._clear

        async def on_reset(agent: Any, *args: Any, **kwargs: Any) -> None:
            await original(agent, *args, **kwargs)
            if not runs.in_reset(agent):
                await clear(agent)

        return on_reset

    def _make_reset(self, original: Callable[..., Any]) -> Callable[..., Any]:
        runs, clear = self.runs, self._clear

        async def reset(team: Any, *args: Any, **kwargs: Any) -> None:
            if runs.in_reset(team):  # a nested team, reset with the team it belongs to
                await original(team, *args, **kwargs)
                return
            with runs.resetting(team):
                await original(team, *args, **kwargs)
            await clear(team)

        return reset

    async def _clear(self, obj: Any) -> None:
        """``obj`` (an agent or a team) was reset: the sessions its runs since its last reset
        recorded into (see :meth:`~ce.autogen._scopes.Runs.ran`) send none of the messages
        they hold so far (``engine.clear_history``), awaited, fail-open. Nothing when it has
        not run since its last reset, when its last run was a team's (the team's reset clears
        that), or inside :func:`~ce.core.integration.suppressed`."""
        sessions = self.runs.take_ran(obj)
        if not is_suppressed():
            await clear_sessions(self.plugin, sessions)

    # -- model calls ------------------------------------------------------------------------

    def _site(self, kwargs: dict[str, Any]) -> CallSite | None:
        """The call site of an agent's model call, from the arguments AutoGen passes (None:
        leave the call alone)."""
        if is_suppressed() or not self.plugin.installed:
            return None
        model_context = kwargs.get("model_context")
        frame = self.runs.for_context(model_context) if model_context is not None else None
        if frame is None:
            return None
        agent = str(kwargs.get("agent_name") or "")
        return CallSite(self.plugin, self.book, frame, agent, self.inject)

    def _wrap_client(self, kwargs: dict[str, Any]) -> None:
        site = self._site(kwargs)
        client = kwargs.get("model_client")
        if site is not None and client is not None and not isinstance(client, EngineClient):
            kwargs["model_client"] = EngineClient(client, site)

    def _make_call_llm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        wrap = self._wrap_client

        async def _call_llm(cls: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            wrap(kwargs)  # AutoGen passes every argument by keyword
            async for item in original(cls, *args, **kwargs):
                yield item

        return _call_llm

    def _make_reflect_on_tool_use_flow(self, original: Callable[..., Any]) -> Callable[..., Any]:
        wrap = self._wrap_client

        async def _reflect_on_tool_use_flow(
            cls: Any, *args: Any, **kwargs: Any
        ) -> AsyncGenerator[Any, None]:
            wrap(kwargs)
            async for item in original(cls, *args, **kwargs):
                yield item

        return _reflect_on_tool_use_flow

    # -- tools and memory -------------------------------------------------------------------

    def _make_execute_tool_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        plugin, runs = self.plugin, self.runs

        async def _execute_tool_call(*args: Any, **kwargs: Any) -> Any:
            call = kwargs.get("tool_call")
            workbench = kwargs.get("workbench")
            frame = runs.for_workbench(workbench) if workbench is not None else None
            if frame is None or call is None or is_suppressed() or not plugin.installed:
                return await original(*args, **kwargs)
            started = time.time()
            # runs started inside the tool (an AgentTool, a tool body running an agent) are
            # nested in this tool call
            call_id = str(call.id)
            child_id = runs.tool_scope_ids.take(frame.session_id, call_id)
            with in_tool(ToolFrame(frame.scope, call_id, child_id)):
                outcome = await original(*args, **kwargs)
            result = outcome[1] if isinstance(outcome, tuple) and len(outcome) == 2 else outcome
            run = tool_run(call_id, str(call.name), arguments_of(call), result, started)
            await write(
                plugin, frame.session_id, "record tool run", lambda r: r.record_tool_run(run)
            )
            return outcome

        return _execute_tool_call

    def _make_update_model_context_with_memory(
        self, original: Callable[..., Any]
    ) -> Callable[..., Any]:
        plugin, runs, book = self.plugin, self.runs, self.book

        async def _update_model_context_with_memory(*args: Any, **kwargs: Any) -> Any:
            model_context = kwargs.get("model_context")
            frame = runs.for_context(model_context) if model_context is not None else None
            if frame is None or is_suppressed() or not plugin.installed:
                return await original(*args, **kwargs)
            held = getattr(model_context, "_messages", None)
            before = len(held) if isinstance(held, list) else None
            events = await original(*args, **kwargs)
            if before is not None and isinstance(held, list):
                from autogen_core.models import SystemMessage

                for added in held[before:]:
                    if isinstance(added, SystemMessage):
                        book.note_memory(added.content)
            results = [item for event in events or () for item in getattr(event, "content", ())]
            hits = hits_from_memory(results)
            if hits:
                await write(
                    plugin, frame.session_id, "record retrieval", lambda r: r.record_retrieval(hits)
                )
            return events

        return _update_model_context_with_memory

    def _make_run(self, original: Callable[..., Any]) -> Callable[..., Any]:
        async def run(tool: Any, args: Any, cancellation_token: Any) -> Any:
            func = getattr(tool, "_func", None)
            signature = getattr(tool, "_signature", None)
            if (
                current_tool() is None
                or is_suppressed()
                or func is None
                or signature is None
                or inspect.iscoroutinefunction(func)
            ):
                return await original(tool, args, cancellation_token)
            # AutoGen's sync branch, with the body run in a copy of this context
            kwargs = {n: getattr(args, n) for n in signature.parameters if hasattr(args, n)}
            cancellable = bool(getattr(tool, "_has_cancellation_support", False))
            if cancellable:
                kwargs["cancellation_token"] = cancellation_token
            body = functools.partial(contextvars.copy_context().run, func, **kwargs)
            future = asyncio.get_running_loop().run_in_executor(None, body)
            if not cancellable:
                cancellation_token.link_future(future)
            return await future

        return run

    # -- speaker selection ------------------------------------------------------------------

    def _make_select_speaker(self, original: Callable[..., Any]) -> Callable[..., Any]:
        plugin, runs = self.plugin, self.runs

        async def _select_speaker(manager: Any, *args: Any, **kwargs: Any) -> Any:
            client = getattr(manager, "_model_client", None)
            if client is None or is_suppressed() or not plugin.installed:
                return await original(manager, *args, **kwargs)
            try:
                team_id = manager.id.key
            except Exception:  # a manager outside an agent runtime
                team_id = None
            frame = runs.for_team(team_id) if team_id is not None else None
            if frame is None:
                return await original(manager, *args, **kwargs)
            # the manager makes its selections one at a time: its client is swapped for the
            # selection only
            manager._model_client = RecordingClient(client, plugin, frame.session_id)
            try:
                return await original(manager, *args, **kwargs)
            finally:
                manager._model_client = client

        return _select_speaker
