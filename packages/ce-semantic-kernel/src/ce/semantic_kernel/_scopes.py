"""Which session a Semantic Kernel model call or function run belongs to: the kit's rule
(:func:`ce.core.integration.resolve_scope`) applied to SK's calls.

First match wins for a top-level call: the ``ce_session_id`` in the call's
``KernelArguments`` (explicit), ``with engine.session(...)``, the framework's own identity
(the id of the ``ChatHistoryAgentThread`` a ``ChatCompletionAgent`` runs on: a random uuid
unless the app names it, so a thread is its own session), ``install(session_id=...)``, else
the run itself (``run:<id>``: one top-level ``kernel.invoke*`` / ``invoke_prompt``, one direct
``get_chat_message_content(s)`` call with its whole auto-function-calling loop, one agent
invocation).

An ``AgentGroupChat`` is one scope for all its agents (each agent's channel has a thread of
its own, with a random id): ``with engine.session(...)``, else ``install(session_id=...)``,
else ``run:<id>`` with one id per chat object, kept across its ``invoke`` calls. Each agent's
request starts with its own instructions; its replies are stored with the agent as author.

A model call made while a function the model asked for runs (an LLM-backed function, an
agent called inside a function) is nested: it gets the child scope
``<outer session>/<function call id>`` and never receives or changes the outer
conversation. So is one made by a function's own work outside such a call (a function a
template calls, a native function the app runs in a named session): the function's run is a
child scope, and an agent it invokes runs there too. SK's own internal model calls (the
summarization reducer, an ``AgentGroupChat``'s kernel-function selection and termination
strategies, the orchestrations' managers) are recorded in a child scope
``<outer session>/<kind>:<id>`` and never rewritten.

SK passes no run object along, so the frames live in context variables: set by the plugin's
hooks around a call and read by the hooks inside it (each parallel function call of the loop
runs in its own ``asyncio.gather`` task, so they do not mix). An async generator runs in the
context of the code that consumes it, so around a streamed call (an agent's ``invoke`` /
``invoke_stream``, a group chat's, a service's streaming call) a frame is set for each step of
the generator only (:func:`stepped`): the consumer's own code between the items, and a model
call it makes there, never sees it. An app's callback SK calls from inside the agent's own code
(``on_intermediate_message``) runs in the frames of the code that called the agent
(:func:`in_callers_frames`).

An agent runtime's message loop (``InProcessRuntime.start()``, which runs the orchestrations'
agents) is a background task: asyncio copies the context of the code that started it into
every handler it runs, for every orchestration invoked on it later. The loop is nobody's
call, so it starts with no frame of the plugin's, and the ``engine.session()`` it inherited
is not in force inside it (:func:`detached`, :func:`resolve`): otherwise every later
orchestration on the runtime, another user's included, would be recorded in and assembled
from the session of the code that happened to start it.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ce.core.engine import current_session_id
from ce.core.integration import SESSION_KEY, Scope, resolve_scope

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = [
    "AgentFrame",
    "CallSite",
    "Detached",
    "ToolFrame",
    "Var",
    "agent_frame",
    "call_site",
    "detached",
    "in_callers_frames",
    "internal_kind",
    "outer_team_scope",
    "resolve",
    "run_scope",
    "scope_for_call",
    "started_detached",
    "stepped",
    "team_scope",
    "tool_frame",
]

_T = TypeVar("_T")
_Y = TypeVar("_Y")


class Var(Generic[_T]):
    """A context variable set for a block (``with var.bound(value):``); a reset from another
    context (a generator closed elsewhere) is ignored."""

    def __init__(self, name: str) -> None:
        self._var: ContextVar[_T | None] = ContextVar(name, default=None)

    def get(self) -> _T | None:
        return self._var.get()

    def set(self, value: _T | None) -> Token[_T | None]:
        return self._var.set(value)

    def reset(self, token: Token[_T | None]) -> None:
        # a reset from another context (a generator closed elsewhere): that context ends anyway
        with contextlib.suppress(ValueError):
            self._var.reset(token)


async def stepped(
    var: Var[_T], value: Callable[[], _T | None], steps: AsyncGenerator[_Y, Any]
) -> AsyncGenerator[_Y, Any]:
    """What ``steps`` yields, with ``var`` set while ``steps`` runs and reset before each item
    is handed on: the code ``steps`` runs (each step, and its closing) sees the value, the
    code consuming the items between two steps does not. ``value`` is read at the first step
    (``None``: ``var`` is left as it is). A value sent in (``asend``) and an exception thrown
    in (``athrow``) are passed on to ``steps``; closing this generator closes ``steps``."""
    bound = value()
    sent: Any = None
    thrown: BaseException | None = None
    try:
        while True:
            token = var.set(bound) if bound is not None else None
            try:
                item = await (steps.asend(sent) if thrown is None else steps.athrow(thrown))
            except StopAsyncIteration:
                return
            finally:
                if token is not None:
                    var.reset(token)
            sent, thrown = None, None
            try:
                sent = yield item
            except GeneratorExit:
                raise
            except BaseException as exc:  # thrown in by the consumer: raised inside ``steps``
                thrown = exc
    finally:
        token = var.set(bound) if bound is not None else None
        try:
            await steps.aclose()
        finally:
            if token is not None:
                var.reset(token)


@dataclass
class AgentFrame:
    """A ``ChatCompletionAgent`` invocation in flight: its thread id, the agent's name and the
    thread object (``None`` until SK makes one for an invocation given none)."""

    thread_id: str | None
    agent: str
    thread: Any = field(default=None, repr=False)


@dataclass
class ToolFrame:
    """A function call of the auto-function-calling loop in flight: the scope of the model
    call that asked for it, SK's call id, the id naming the child scope of the calls nested
    in it (the call id, or ``<id>~2``, ... when an earlier function call of the session used
    it: see :class:`~ce.core.integration.ToolScopeIds`), the frame of the agent that asked
    for it (``None``: no agent) and what the function filter saw of the run."""

    scope: Scope
    call_id: str
    child_id: str
    caller: AgentFrame | None = None
    error: str | None = None
    entered: bool = False
    hits: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class CallSite:
    """One chat-service call (with its auto-function-calling loop): the service it is made
    on, its scope, the agent that makes it (``None``: no agent) and ``internal``: an SK
    internal call (recorded only, never rewritten; the value names it)."""

    service: Any
    scope: Scope
    agent: str | None = None
    internal: str | None = None

    @property
    def session_id(self) -> str:
        return self.scope.session_id


@dataclass(frozen=True)
class Detached:
    """Code running in an agent runtime's message loop: ``inherited`` is the
    ``engine.session()`` in force where the loop was started (``None``: none), which is not
    the session of any call the loop makes."""

    inherited: str | None


agent_frame: Var[AgentFrame] = Var("ce_sk_agent")
tool_frame: Var[ToolFrame] = Var("ce_sk_tool")
call_site: Var[CallSite] = Var("ce_sk_call")
run_scope: Var[Scope] = Var("ce_sk_run")
team_scope: Var[Scope] = Var("ce_sk_team")
internal_kind: Var[str] = Var("ce_sk_internal")
detached: Var[Detached] = Var("ce_sk_detached")


_FRAMES: tuple[Var[Any], ...] = (
    agent_frame,
    tool_frame,
    call_site,
    run_scope,
    team_scope,
    internal_kind,
    detached,
)


def in_callers_frames(callback: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``callback`` run with the frames the code calling this holds now: SK awaits an app's
    callback (an agent's ``on_intermediate_message``) inside the agent's own code, where a model
    call the callback makes would otherwise be the agent's."""
    held = [(var, var.get()) for var in _FRAMES]

    async def in_frames(*args: Any, **kwargs: Any) -> Any:
        tokens = [(var, var.set(value)) for var, value in held]
        try:
            return await callback(*args, **kwargs)
        finally:
            for var, token in reversed(tokens):
                var.reset(token)

    return in_frames


def started_detached(start: Callable[[], _T]) -> _T:
    """``start()`` (an agent runtime's ``start``, which creates its message loop task) run in
    a copy of the current context with none of the plugin's frames and the current
    ``engine.session()`` marked as inherited (see :func:`resolve`); the caller's context is
    left as it is."""

    def in_copy() -> _T:
        for var in _FRAMES:
            var.set(None)
        detached.set(Detached(current_session_id()))
        return start()

    return contextvars.copy_context().run(in_copy)


def resolve(
    plugin: Plugin,
    *,
    run_id: str,
    explicit: object = None,
    framework: object = None,
    parent: Scope | None = None,
    parent_call_id: str | None = None,
) -> Scope:
    """:func:`ce.core.integration.resolve_scope`, except in an agent runtime's message loop,
    where the ``engine.session()`` the loop inherited from the code that started it is not in
    force (one the loop's own code sets to another session is)."""
    frame = detached.get()
    return resolve_scope(
        plugin,
        run_id=run_id,
        explicit=explicit,
        framework=framework,
        parent=parent,
        parent_call_id=parent_call_id,
        inherited=frame.inherited if frame is not None else None,
    )


def explicit_session(arguments: Any) -> Any:
    """The ``ce_session_id`` a call's ``KernelArguments`` name, if any."""
    if arguments is None:
        return None
    try:
        return arguments.get(SESSION_KEY)
    except Exception:  # not a mapping
        return None


def _new_run() -> str:
    return uuid.uuid4().hex


def outer_scope(plugin: Plugin, arguments: Any = None) -> Scope:
    """The scope the current code runs in: the enclosing model call's, the function call's
    (nested), the agent's, the top-level run's, else a new top-level run's."""
    site = call_site.get()
    if site is not None:
        return site.scope
    return scope_for_call(plugin, arguments)[0]


def scope_for_call(plugin: Plugin, arguments: Any) -> tuple[Scope, str | None, Any]:
    """The scope of a chat-service call starting now, the agent making it and the agent
    thread whose conversation the call is (``None``: none, as for a call nested in a function
    or an agent of a group chat, whose scope is not its thread's)."""
    explicit = explicit_session(arguments)
    tool = tool_frame.get()
    if tool is not None:
        # an agent invoked inside the function makes its calls; the agent that called the
        # function does not make the function's own calls
        inner = agent_frame.get()
        return (
            resolve(
                plugin,
                run_id=_new_run(),
                explicit=explicit,
                parent=tool.scope,
                parent_call_id=tool.child_id,
            ),
            (inner.agent or None) if inner is not None and inner is not tool.caller else None,
            None,
        )
    agent = agent_frame.get()
    team = team_scope.get()
    if team is not None:
        # an agent of an AgentGroupChat: every agent of the chat shares the chat's session
        if explicit and explicit != team.session_id:
            return Scope(str(explicit), "explicit"), agent.agent if agent else None, None
        return team, (agent.agent or None) if agent is not None else None, None
    run = run_scope.get()
    if agent is not None:
        if run is not None and run.nested:
            # an agent a function's own work invokes (a native function the app runs in a
            # named session, a function a template calls): nested there, as the function's
            # other model calls are
            if explicit and explicit not in (*run.lineage, run.session_id):
                return Scope(str(explicit), "explicit"), agent.agent or None, None
            return run, agent.agent or None, None
        scope = resolve(plugin, run_id=_new_run(), explicit=explicit, framework=agent.thread_id)
        return scope, agent.agent or None, agent.thread
    if run is not None:
        # a session the run or an enclosing one has (arguments a template passes on) does not
        # pull a nested function's call back there
        if explicit and explicit not in (*run.lineage, run.session_id):
            return Scope(str(explicit), "explicit"), None, None
        return run, None, None
    return resolve(plugin, run_id=_new_run(), explicit=explicit), None, None


def internal_scope(plugin: Plugin, kind: str, arguments: Any = None) -> Scope:
    """The child scope of one SK internal model call of ``kind``."""
    return outer_scope(plugin, arguments).child(f"{kind}:{uuid.uuid4().hex[:12]}")


def outer_team_scope(plugin: Plugin, run_id: str) -> Scope:
    """The scope of a group chat's invocation whose run id is ``run_id`` (nested when it runs
    inside a function call)."""
    tool = tool_frame.get()
    if tool is not None:
        return resolve(plugin, run_id=run_id, parent=tool.scope, parent_call_id=tool.child_id)
    return resolve(plugin, run_id=run_id)
