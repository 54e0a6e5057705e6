"""Where the plugin hooks into Semantic Kernel, and why there.

- Filters (SK's own hook API) record function calls: on one kernel (``install(kernel=k)``)
  they are added with ``k.add_filter`` (``Kernel.clone()`` deep-copies the lists, so clones
  keep them) and removed from ``k`` by id on uninstall. Filters live per ``Kernel`` instance
  and a global install must also cover kernels built before it without changing them, so the
  global install adds its two filters, outermost, to the call stack every kernel builds
  (``KernelFilterExtension.construct_call_stack``, class level): no kernel's filter list is
  touched, and uninstall puts the one class attribute back.
- ``ChatCompletionClientBase.get_chat_message_contents`` /
  ``get_streaming_chat_message_contents`` (class level, no connector overrides them) bind the
  call's scope and wrap the service's inner methods on first use (see ``_inject`` for why).
  In a scope no session names (a run, a function call's child scope), a call that continues
  none of the scope's earlier calls (a native function prompting for a summary, then for its
  translation) gets a child scope ``<scope>/call:<id>`` of its own
  (:class:`~ce.core.integration.RunConversations`); an ``AgentGroupChat`` stays one scope.
- ``ChatCompletionAgent.get_response`` / ``invoke`` / ``invoke_stream`` and
  ``_ensure_thread_exists_with_messages`` note the agent and its thread (the session);
  ``ChatHistoryAgentThread.reduce`` notes the thread (its reducer's model call is the
  thread's internal call).
- ``ChatHistoryAgentThread._delete`` (what ``thread.delete()`` runs to end a thread that
  holds a conversation) and ``ChatHistory.clear`` (SK's own method, which ``replace`` calls
  too) clear, once they are done, the sessions the thread's or the history's model calls
  were recorded in (``engine.clear_history``): the app ended the conversation, and the next
  one starts from what it passes then. SK has no hook for either. The plugin remembers, per
  thread and per ``ChatHistory`` object (weakly), the named sessions of their calls since
  they were last cleared (:class:`~ce.core.integration.ObjectSessions`); a history it
  never saw in a model call clears nothing. A thread it never saw run (the app's next
  process deleting a thread it names) clears the session its runs would be recorded in
  now, derived from its id as for its agent's calls (global install only: an install on one
  kernel cannot tell the thread's kernel). ``clear`` is sync: on an event loop's thread
  the write is queued on the loop (:func:`ce.core.integration.record_sync`, the session's
  next call writes it first), never blocking it; the thread's ``_delete`` awaits it.
- ``AgentGroupChat.invoke`` / ``invoke_stream`` make the chat one scope for its agents.
- ``InProcessRuntime.start`` (the agent runtime the orchestrations run on) creates its message
  loop task detached from the plugin's frames and from the ``engine.session()`` of the code
  that started it (see ``_scopes``): asyncio would hand that context to every orchestration
  run on the runtime later, another user's included.
- ``ChatHistorySummarizationReducer.reduce``, the kernel-function selection and termination
  strategies of ``AgentGroupChat`` and the orchestrations' managers (a
  ``GroupChatOrchestration``'s decision step, the ``StandardMagenticManager``'s prompts) mark
  their model calls as SK internal calls.

Every replacement goes through the plugin's ledger: ``uninstall()`` puts back the very
objects the classes held and removes the instance entries it added.
"""

from __future__ import annotations

import functools
import logging
import uuid
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from ce.core.integration import (
    ObjectSessions,
    RunConversations,
    clear_sessions,
    clear_sessions_sync,
    is_suppressed,
    marking,
)
from ce.semantic_kernel._convert import turn_key
from ce.semantic_kernel._inject import INNER, INNER_STREAM, Seam
from ce.semantic_kernel._record import Filters
from ce.semantic_kernel._scopes import (
    AgentFrame,
    CallSite,
    agent_frame,
    call_site,
    in_callers_frames,
    internal_kind,
    internal_scope,
    outer_team_scope,
    scope_for_call,
    started_detached,
    stepped,
    team_scope,
    tool_frame,
)

if TYPE_CHECKING:
    from ce.core.integration import PatchLedger, Plugin, Scope

__all__ = ["Patches", "patched_targets"]

logger = logging.getLogger("ce.semantic_kernel")


def _service_targets() -> list[tuple[Any, str]]:
    from semantic_kernel.connectors.ai.chat_completion_client_base import (
        ChatCompletionClientBase,
    )

    return [
        (ChatCompletionClientBase, "get_chat_message_contents"),
        (ChatCompletionClientBase, "get_streaming_chat_message_contents"),
    ]


def _agent_targets() -> list[tuple[Any, str]]:
    from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread

    return [
        (ChatCompletionAgent, "get_response"),
        (ChatCompletionAgent, "invoke"),
        (ChatCompletionAgent, "invoke_stream"),
        (ChatCompletionAgent, "_ensure_thread_exists_with_messages"),
        (ChatHistoryAgentThread, "reduce"),
        (ChatHistoryAgentThread, "_delete"),
    ]


def _history_targets() -> list[tuple[Any, str]]:
    from semantic_kernel.contents import ChatHistory

    return [(ChatHistory, "clear")]


def _team_targets() -> list[tuple[Any, str]]:
    from semantic_kernel.agents import AgentGroupChat

    return [(AgentGroupChat, "invoke"), (AgentGroupChat, "invoke_stream")]


def _runtime_targets() -> list[tuple[Any, str]]:
    try:  # the agent runtime of the orchestrations (experimental, absent in older releases)
        from semantic_kernel.agents.runtime import InProcessRuntime
    except ImportError:
        return []
    return [(InProcessRuntime, "start")]


def _internal_targets() -> list[tuple[Any, str, str]]:
    from semantic_kernel.agents.strategies import (
        KernelFunctionSelectionStrategy,
        KernelFunctionTerminationStrategy,
    )
    from semantic_kernel.contents.history_reducer.chat_history_summarization_reducer import (
        ChatHistorySummarizationReducer,
    )

    targets: list[tuple[Any, str, str]] = [
        (ChatHistorySummarizationReducer, "reduce", "summarize"),
        (KernelFunctionSelectionStrategy, "select_agent", "select"),
        (KernelFunctionTerminationStrategy, "should_agent_terminate", "terminate"),
    ]
    return targets + _manager_targets()


def _manager_targets() -> list[tuple[Any, str, str]]:
    """The orchestrations' managers: a ``GroupChatOrchestration``'s (the app's subclass of
    ``GroupChatManager``, called from the manager actor's one decision step) and the
    ``StandardMagenticManager``'s four prompts."""
    try:  # the orchestrations (experimental, absent in older releases)
        from semantic_kernel.agents.orchestration.group_chat import GroupChatManagerActor
        from semantic_kernel.agents.orchestration.magentic import StandardMagenticManager
    except ImportError:
        return []
    return [
        (GroupChatManagerActor, "_determine_state_and_take_action", "manage"),
        *(
            (StandardMagenticManager, name, "manage")
            for name in ("plan", "replan", "create_progress_ledger", "prepare_final_answer")
        ),
    ]


def patched_targets(global_install: bool = True) -> list[tuple[Any, str]]:
    """The ``(class, attribute)`` pairs the plugin replaces while installed."""
    from semantic_kernel.filters.kernel_filters_extension import KernelFilterExtension

    targets = [
        *_service_targets(),
        *_agent_targets(),
        *_history_targets(),
        *_team_targets(),
        *_runtime_targets(),
    ]
    targets += [(owner, attr) for owner, attr, _ in _internal_targets()]
    if global_install:
        targets.append((KernelFilterExtension, "construct_call_stack"))
    return targets


class Patches:
    """The hooks of one install: ``kernel`` limits the plugin to that kernel (and its
    clones); ``inject=False`` records only."""

    def __init__(self, plugin: Plugin, kernel: Any, inject: bool, generation: object) -> None:
        self.plugin = plugin
        self.kernel = kernel
        self.seam = Seam(plugin, inject)
        self.filters = Filters(plugin, generation)
        # the services wrapped (pydantic models are unhashable: by id, through weak refs)
        self.services: dict[int, weakref.ref[Any]] = {}
        self.chats: dict[int, tuple[weakref.ref[Any], str]] = {}
        self.conversations = RunConversations()  # the conversations of unnamed scopes
        # the named sessions of the calls of each ChatHistory and agent thread (held weakly)
        self.histories = ObjectSessions()
        self.threads = ObjectSessions()

    # -- install ----------------------------------------------------------------------------

    def install(self, ledger: PatchLedger) -> None:
        from semantic_kernel.filters.filter_types import FilterTypes
        from semantic_kernel.filters.kernel_filters_extension import KernelFilterExtension

        if self.kernel is not None:
            kernel = self.kernel
            for kind, fn in (
                (FilterTypes.FUNCTION_INVOCATION, self.filters.function),
                (FilterTypes.AUTO_FUNCTION_INVOCATION, self.filters.auto),
            ):
                kernel.add_filter(kind, fn)
                ledger.register(
                    functools.partial(kernel.remove_filter, kind, filter_id=id(fn)),
                    f"filter {kind.value} on kernel {id(kernel):#x}",
                )
        else:
            ledger.wrap(KernelFilterExtension, "construct_call_stack", self._make_call_stack)
        get, stream = _service_targets()
        ledger.wrap(get[0], get[1], self._make_get)
        ledger.wrap(stream[0], stream[1], self._make_stream)
        ledger.register(self._unwrap_services, "inner methods of chat services")
        for owner, attr in _agent_targets():
            if attr == "reduce":
                maker = self._make_thread_reduce
            elif attr == "_delete":
                maker = self._make_thread_delete
            elif attr.startswith("_ensure"):
                maker = self._make_thread
            else:
                maker = self._make_agent_call
            ledger.wrap(owner, attr, maker)
        for owner, attr in _history_targets():
            ledger.wrap(owner, attr, self._make_history_clear)
        for owner, attr in _team_targets():
            ledger.wrap(owner, attr, self._make_team)
        for owner, attr in _runtime_targets():
            ledger.wrap(owner, attr, self._make_runtime_start)
        for owner, attr, internal in _internal_targets():
            marked = marking(internal_kind, internal)
            if internal == "summarize":
                ledger.wrap(owner, attr, functools.partial(self._make_summarize, marked))
            else:
                ledger.wrap(owner, attr, marked)

    # -- filters ----------------------------------------------------------------------------

    def _make_call_stack(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from semantic_kernel.filters.filter_types import FilterTypes

        filters = self.filters

        def construct_call_stack(kernel: Any, filter_type: Any, inner_function: Any) -> Any:
            stack = original(kernel, filter_type, inner_function)
            if filter_type == FilterTypes.FUNCTION_INVOCATION:
                return functools.partial(filters.function, next=stack)
            if filter_type == FilterTypes.AUTO_FUNCTION_INVOCATION:
                return functools.partial(filters.auto, next=stack)
            return stack

        return construct_call_stack

    def targeted(self, kernel: Any) -> bool:
        """Whether the plugin acts on a call made with ``kernel``."""
        if self.kernel is None:
            return True
        if kernel is None:
            return False
        fn = self.filters.function
        return any(f is fn for _, f in getattr(kernel, "function_invocation_filters", ()))

    # -- services ---------------------------------------------------------------------------

    def _ensure_wrapped(self, service: Any) -> None:
        own = getattr(service, "__dict__", None)
        if own is None or INNER in own:
            return
        inner = getattr(service, INNER)
        inner_stream = getattr(service, INNER_STREAM)
        object.__setattr__(service, INNER, self.seam.wrap_inner(service, inner))
        object.__setattr__(
            service, INNER_STREAM, self.seam.wrap_inner_stream(service, inner_stream)
        )
        self.services[id(service)] = weakref.ref(service)

    def _unwrap_services(self) -> None:
        for ref in list(self.services.values()):
            service = ref()
            if service is None:
                continue
            own = getattr(service, "__dict__", {})
            for name in (INNER, INNER_STREAM):
                if getattr(own.get(name), "ce_wrapped", False):
                    del own[name]
        self.services = {}

    def _site(self, service: Any, chat_history: Any, kwargs: dict[str, Any]) -> CallSite | None:
        """The site of a chat-service call sending ``chat_history`` (``None``: not one the
        plugin acts on)."""
        plugin = self.plugin
        if is_suppressed() or not plugin.installed or not self.targeted(kwargs.get("kernel")):
            return None
        arguments = kwargs.get("arguments")
        kind = internal_kind.get()
        if kind is not None:
            return CallSite(service, internal_scope(plugin, kind, arguments), None, kind)
        scope, agent, thread = scope_for_call(plugin, arguments)
        if scope is not team_scope.get():  # a group chat's agents share its scope
            messages = list(getattr(chat_history, "messages", None) or ())
            call_id = f"call:{uuid.uuid4().hex[:12]}"
            scope = self.conversations.place(scope, messages, turn_key, call_id)
        # what clearing the history, deleting the thread, clears: the call's session when a
        # session names it; a thread whose agent runs elsewhere (nested in a function, in a
        # group chat) is seen all the same (its deletion clears nothing of its own)
        named = scope.session_id if scope.named else None
        if named is not None:
            self._used(self.histories, chat_history, named)
        frame = agent_frame.get()
        seen = thread if thread is not None else frame.thread if frame is not None else None
        if seen is not None:
            self._used(self.threads, seen, named if seen is thread else None)
        return CallSite(service, scope, agent)

    @staticmethod
    def _used(used: ObjectSessions, obj: Any, session_id: str | None) -> None:
        try:
            used.note(obj, session_id)
        except Exception:  # an object that cannot be held weakly: its clearing clears nothing
            logger.debug("cannot note the session of %r", type(obj), exc_info=True)

    def _make_get(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        async def get_chat_message_contents(
            service: Any, chat_history: Any, settings: Any, **kwargs: Any
        ) -> Any:
            site = patches._site(service, chat_history, kwargs)
            if site is None:
                return await original(service, chat_history, settings, **kwargs)
            patches._ensure_wrapped(service)
            token = call_site.set(site)
            try:
                return await original(service, chat_history, settings, **kwargs)
            finally:
                call_site.reset(token)

        return get_chat_message_contents

    def _make_stream(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def get_streaming_chat_message_contents(
            service: Any, chat_history: Any, settings: Any, **kwargs: Any
        ) -> AsyncGenerator[Any, Any]:
            def site() -> CallSite | None:
                found = patches._site(service, chat_history, kwargs)
                if found is not None:
                    patches._ensure_wrapped(service)
                return found

            # the call's site is set for each step only, not for the consumer's loop body
            return stepped(call_site, site, original(service, chat_history, settings, **kwargs))

        return get_streaming_chat_message_contents

    # -- agents -----------------------------------------------------------------------------

    def _make_agent_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

        if inspect.isasyncgenfunction(original):

            @functools.wraps(original)
            def invoke(agent: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
                def frame() -> AgentFrame:
                    return AgentFrame(
                        _thread_id(kwargs), str(agent.name or ""), kwargs.get("thread")
                    )

                # the agent's frame is set for each step only: a model call the app makes
                # while it consumes the replies, or in its callback, is its own
                callback = kwargs.get("on_intermediate_message")
                if callback is not None:
                    kwargs["on_intermediate_message"] = in_callers_frames(callback)
                return stepped(agent_frame, frame, original(agent, *args, **kwargs))

            return invoke

        @functools.wraps(original)
        async def get_response(agent: Any, *args: Any, **kwargs: Any) -> Any:
            frame = AgentFrame(_thread_id(kwargs), str(agent.name or ""), kwargs.get("thread"))
            token = agent_frame.set(frame)
            try:
                return await original(agent, *args, **kwargs)
            finally:
                agent_frame.reset(token)

        return get_response

    def _make_thread(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        async def _ensure_thread_exists_with_messages(agent: Any, *args: Any, **kwargs: Any) -> Any:
            thread = await original(agent, *args, **kwargs)
            frame = agent_frame.get()
            if frame is not None:
                if frame.thread_id is None:
                    # the thread SK made for this invocation (a new uuid: its own session)
                    frame.thread_id = getattr(thread, "id", None)
                if frame.thread is None:
                    frame.thread = thread
            return thread

        return _ensure_thread_exists_with_messages

    def _make_summarize(
        self, marking_internal: Callable[..., Any], original: Callable[..., Any]
    ) -> Callable[..., Any]:
        """``ChatHistorySummarizationReducer.reduce`` (``marking_internal``: the factory
        that makes its model call an internal one), noting the summaries the reducer then
        holds: one handed on through a prompt template loses its mark (see
        :class:`~ce.semantic_kernel._convert.SummaryTexts`)."""
        summaries = self.seam.summaries
        marked = marking_internal(original)

        @functools.wraps(marked)
        async def reduce(reducer: Any, *args: Any, **kwargs: Any) -> Any:
            result = await marked(reducer, *args, **kwargs)
            summaries.note(list(getattr(reducer, "messages", ())))
            return result

        return reduce

    def _make_thread_reduce(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        async def reduce(thread: Any, *args: Any, **kwargs: Any) -> Any:
            # the thread's session, as for its agent's calls: a summarization reducer's
            # request is recorded in "<thread's session>/summarize:<id>"
            thread_id = getattr(thread, "id", None)
            token = agent_frame.set(AgentFrame(str(thread_id) if thread_id else None, ""))
            try:
                return await original(thread, *args, **kwargs)
            finally:
                agent_frame.reset(token)

        return reduce

    # -- clearing ---------------------------------------------------------------------------

    def _make_thread_delete(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        async def _delete(thread: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(thread, *args, **kwargs)
            # the thread still has its id here: ``delete()`` drops it once this returns
            await clear_sessions(patches.plugin, patches._thread_sessions(thread))
            return result

        return _delete

    def _thread_sessions(self, thread: Any) -> list[str]:
        """The sessions a thread being deleted clears: those its agent's calls were recorded
        in; for a thread never seen run, the one they would be recorded in now (global
        install; none inside a model call or a function call, where they would be nested).
        Empty when the plugin does not act (suppressed, uninstalled)."""
        try:
            sessions = self.threads.take(thread)
            if is_suppressed() or not self.plugin.installed:
                return []
            if sessions is not None or self.kernel is not None:
                return sessions or []
            thread_id = getattr(thread, "id", None)
            if not thread_id or tool_frame.get() is not None or call_site.get() is not None:
                return []
            frame = AgentFrame(str(thread_id), "", thread)
            token = agent_frame.set(frame)
            try:
                scope, _, owner = scope_for_call(self.plugin, None)
            finally:
                agent_frame.reset(token)
            return [scope.session_id] if owner is thread and scope.named else []
        except Exception:  # fail open: the thread is deleted as SK deletes it
            logger.warning("could not tell the session of a deleted agent thread", exc_info=True)
            return []

    def _make_history_clear(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def clear(history: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(history, *args, **kwargs)
            patches._history_cleared(history)
            return result

        return clear

    def _history_cleared(self, history: Any) -> None:
        """The app cleared ``history``: the sessions its model calls were recorded in send
        none of what they hold so far (queued on a running loop, written now otherwise)."""
        plugin = self.plugin
        try:
            sessions = self.histories.take(history)
        except Exception:  # fail open: the history is cleared as SK clears it
            logger.warning("could not tell the session of a cleared ChatHistory", exc_info=True)
            return
        if not sessions or is_suppressed() or not plugin.installed:  # never sent: nothing
            return
        clear_sessions_sync(plugin, sessions)

    # -- group chats ------------------------------------------------------------------------

    def _chat_scope(self, chat: Any) -> Scope:
        """The scope of an AgentGroupChat's invocation (one run id per chat object)."""
        run_id = self.chats.get(id(chat))
        if run_id is None or run_id[0]() is not chat:
            run_id = (weakref.ref(chat), uuid.uuid4().hex)
            self.chats[id(chat)] = run_id
        return outer_team_scope(self.plugin, run_id[1])

    def _make_team(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def invoke(chat: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            def scope() -> Scope | None:
                if is_suppressed() or not patches.plugin.installed or team_scope.get() is not None:
                    return None
                return patches._chat_scope(chat)

            # the chat's scope is set for each step only, not for the consumer's loop body
            return stepped(team_scope, scope, original(chat, *args, **kwargs))

        return invoke

    # -- agent runtimes ---------------------------------------------------------------------

    def _make_runtime_start(self, original: Callable[..., Any]) -> Callable[..., Any]:
        plugin = self.plugin

        @functools.wraps(original)
        def start(runtime: Any, *args: Any, **kwargs: Any) -> Any:
            if not plugin.installed:
                return original(runtime, *args, **kwargs)
            # the message loop task copies this context: it is nobody's call
            return started_detached(functools.partial(original, runtime, *args, **kwargs))

        return start


def _thread_id(kwargs: dict[str, Any]) -> str | None:
    thread = kwargs.get("thread")
    value = getattr(thread, "id", None) if thread is not None else None
    return str(value) if value else None
