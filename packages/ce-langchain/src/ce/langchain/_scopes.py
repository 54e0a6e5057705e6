"""Which session a LangChain call belongs to: the kit's rule (:func:`resolve_scope`) applied to
LangChain's run tree.

LangChain names a conversation in the run config: ``ce_session_id`` metadata (explicit), the
LangGraph ``thread_id``, or the ``session_id`` (or the ``history_factory_config`` keys) a
``RunnableWithMessageHistory`` reads; ``ensure_config`` copies scalar ``configurable`` values
into the metadata every callback sees. :class:`ScopeTracker` follows the runs in flight (chains,
tools, retrievers, chat models: parent link and scope, dropped when the run ends) so that:

- a top-level run without a name gets ``run:<its run id>`` and every call under it shares it;
- a run under a chain or a chat model inherits its parent's scope, unless it names a session
  of its own (a ``RunnableWithMessageHistory`` invoked inside an unnamed run);
- a run under a tool or a retriever is nested: ``<outer>/<tool_call_id>`` (a retriever: its
  run id), so an LLM-backed tool, a sub-agent called as a tool or an LLM query rewriter never
  sees nor changes the outer conversation (only a ``ce_session_id`` / ``engine.session()``
  none of the enclosing scopes has takes it elsewhere); a tool-call id the model reuses
  (``call_0`` in every turn) names each run's scope apart: ``<outer>/call_0``, then
  ``<outer>/call_0~2``, ``<outer>/call_0~3``, as the engine renames the reused call;
- a run inside a ``create_agent`` middleware hook node (``<Middleware>.before_model``, ...),
  or under such a run, is a hook run (:meth:`ScopeTracker.in_hook`): the model calls made
  there are the middleware's own, left alone;
- a LangGraph node whose input state holds messages, run in a superstep beside other tasks
  (a fan-out ``START -> (a, b)``, parallel agents on one thread), is a branch:
  ``<outer>/<node>:<task id>``, it and everything under it; the thread's session never
  assembles a branch's call from, nor records into it, what a sibling does meanwhile, and
  gets a branch's messages when a later call passes the state that merged them
  (:meth:`ScopeTracker.run_beside`);
- a LangGraph run handed messages of its own is a conversation of its own (see
  :func:`handed_messages`): a ``Send``'s task whose payload's messages no state's reducer has
  given an id (a map step's ``{"messages": [HumanMessage(slice)]}`` to a ``create_agent``
  node), ``<outer>/<node>:<task id>``; a run inside a node's task (a compiled graph, a chain
  the node invokes) handed none of the newest messages of the node's input (a
  ``researcher.invoke({"messages": [HumanMessage(question)]})``), ``<outer>/<node>:<run id>``;
  it and everything under it. A run handed the node's messages continues the thread;
- a chat-model call in a LangGraph node whose input state holds messages, that passes none
  of the newest of them (a grader, a query rewriter, an answer prompt the node builds from
  scratch: LangGraph's agentic RAG), or passes messages of its own after the newest of them
  it passes (a summarizer's prompt appended to the conversation, the conversation sent with
  its roles swapped by a reflection step), is the node's own work: ``<outer>/<node>:<id>``,
  never a turn of the graph's conversation (:meth:`ScopeTracker.side_call`);
- in a scope nothing names (``run:<id>``, a nested one), a chat-model call that continues none
  of the conversations of the scope's earlier calls (a map-reduce's map calls, a chain's
  draft-then-critique steps) is a conversation of its own in a child scope
  (:class:`~ce.core.integration.RunConversations`).

Injection (before a chat model's run starts) and recording (its callbacks) ask the same
tracker, so one call is assembled from and recorded into one session.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ce.core.engine import current_session_id
from ce.core.integration import (
    SESSION_KEY,
    RunConversations,
    Scope,
    ToolScopeIds,
    resolve_scope,
)

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = [
    "HISTORY_KEY",
    "ScopeTracker",
    "explicit_session",
    "framework_identity",
    "handed_messages",
    "in_blocking_call",
    "in_hook_node",
    "keeps_replies",
    "make_history_merge",
    "make_runner_tick",
    "make_tool_arun",
    "make_tool_run",
    "messages_key",
    "node_state",
    "parent_run_id",
    "set_blocking",
    "tool_call_in_flight",
]

logger = logging.getLogger(__name__)

HISTORY_KEY = "ce_history_session"
"""Metadata the plugin adds to a ``RunnableWithMessageHistory`` run: the conversation its
``history_factory_config`` keys name (``"alice"`` for the default ``session_id`` key,
``"user_id=u1&conversation_id=c1"`` for several)."""

_FRAMEWORK_KEYS = (HISTORY_KEY, "thread_id", "session_id")
_NESTING_KINDS = frozenset({"tool", "retriever"})
_STATE_TAIL = 16  # the newest messages of a LangGraph node's state a conversation call passes
_PENDING_MAX = 4096
_BESIDE_MAX = 4096  # the newest LangGraph tasks noted as running beside others
_TASK_ID_TAIL = 12  # how much of a task's id names its branch
_PUSH = "__pregel_push"  # the head of the path of a LangGraph task a Send (or a call) started
_NODES_MAX = 65536  # runs never ended (an abandoned stream) are forgotten beyond this
_KEEPER_DEPTH = 64  # how far up a chat-model run its keeper is looked for
_HISTORY_RUN = "RunnableWithMessageHistory"

# create_agent runs middleware hooks as graph nodes named "<Middleware>.<hook>"; model calls
# made there (a summarizer's) are the middleware's own, not the agent's.
_HOOK_NODE_SUFFIXES = (".before_model", ".after_model", ".before_agent", ".after_agent")

# The tool_call_id of the tool run starting in this context (langchain-core < 1.1 does not
# pass it to on_tool_start; the nested calls of the tool body need it before the tool ends).
_tool_call: ContextVar[str | None] = ContextVar("ce_langchain_tool_call", default=None)


def _scalar(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value) or None


def explicit_session(
    metadata: Mapping[str, Any] | None, tags: Sequence[str] | None = None
) -> str | None:
    """The session a run names explicitly: metadata ``ce_session_id``, else a tag
    ``"ce_session_id:<id>"``."""
    named = _scalar((metadata or {}).get(SESSION_KEY))
    if named:
        return named
    prefix = f"{SESSION_KEY}:"
    for tag in tags or ():
        if isinstance(tag, str) and tag.startswith(prefix) and len(tag) > len(prefix):
            return tag[len(prefix) :]
    return None


def framework_identity(metadata: Mapping[str, Any] | None) -> str | None:
    """LangChain's own conversation identity in a run's metadata: the
    ``RunnableWithMessageHistory`` key(s), else the LangGraph ``thread_id``, else a
    ``configurable["session_id"]`` (copied into the metadata by LangChain)."""
    for key in _FRAMEWORK_KEYS:
        value = _scalar((metadata or {}).get(key))
        if value:
            return value
    return None


def in_hook_node(metadata: Mapping[str, Any] | None) -> bool:
    """Whether a run's metadata places it in a ``create_agent`` middleware hook node
    (``langgraph_node`` ``"<Middleware>.before_model"``, ``.after_model``, ``.before_agent``,
    ``.after_agent``)."""
    node = (metadata or {}).get("langgraph_node")
    return isinstance(node, str) and node.endswith(_HOOK_NODE_SUFFIXES)


def handed_messages(inputs: Any, metadata: Mapping[str, Any] | None) -> frozenset[str] | None:
    """For a run in a LangGraph node (``langgraph_node`` in its metadata) whose input holds
    ``messages``: the ids of the newest of them (LangGraph's ``add_messages`` gives every
    message of a state one; none: messages made for the run, a ``Send``'s payload, a
    question a node asks a compiled graph); ``None`` otherwise."""
    if not isinstance((metadata or {}).get("langgraph_node"), str):
        return None
    messages = inputs.get("messages") if isinstance(inputs, Mapping) else None
    if not isinstance(messages, list) or not messages:
        return None
    return frozenset(
        i for m in messages[-_STATE_TAIL:] if isinstance(i := getattr(m, "id", None), str)
    )


def node_state(
    inputs: Any, metadata: Mapping[str, Any] | None, name: str | None = None
) -> tuple[str, frozenset[str]] | None:
    """For a LangGraph node's run (``langgraph_node`` in its metadata) whose input state holds
    ``messages``: the node's name and the ids of the newest of those messages (LangGraph's
    ``add_messages`` gives every message one). For the node's own run (``name``: the run's
    name, the node's) whose input holds no ``messages`` at all (a map-reduce step's ``Send``
    payload, a state of fields that is no chat): the node's name and no ids, so every model
    call made in it is the node's own work (see :meth:`ScopeTracker.side_call`). ``None``
    otherwise."""
    node = (metadata or {}).get("langgraph_node")
    if not isinstance(node, str) or not isinstance(inputs, Mapping):
        return None
    if "messages" not in inputs:
        return (node, frozenset()) if name == node else None
    ids = handed_messages(inputs, metadata)
    return (node, ids) if ids else None


def keeps_replies(
    name: str | None, state: tuple[str, frozenset[str]] | None, metadata: Mapping[str, Any] | None
) -> str | None:
    """Whether a chain run named ``name`` (with :func:`node_state` ``state``) decides by its
    output which of the replies made inside it join the conversation, and how: ``"node"``, a
    LangGraph node's own run whose input state holds messages (what it returns under
    ``messages`` is what the conversation keeps); ``"history"``, a
    ``RunnableWithMessageHistory`` run (its output is what the history keeps); else ``None``.
    A text reply made inside one is recorded when it ends: as a turn if its output holds it,
    else as the call's output only (a grader's verdict kept in another key, the standalone
    question a conversational RAG chain retrieves with)."""
    node = (metadata or {}).get("langgraph_node")
    if state is not None and state[1] and isinstance(node, str) and name == node:
        return "node"
    return "history" if name == _HISTORY_RUN else None


def _turn_key(message: Any) -> Hashable | None:
    """A LangChain message as a conversation holds it (``None`` for a system message, which
    two unrelated calls may share)."""
    kind = getattr(message, "type", None)
    if kind is None or kind == "system":
        return None
    calls = tuple(c.get("id") for c in getattr(message, "tool_calls", None) or ())
    return (kind, str(message.content), calls, getattr(message, "tool_call_id", None))


def _task_id(metadata: Mapping[str, Any] | None) -> str | None:
    """The id of the LangGraph task a run's metadata places it in: the end of its
    ``langgraph_checkpoint_ns`` (``"<node>:<task id>"``, after its parent graphs' in a
    subgraph)."""
    namespace = (metadata or {}).get("langgraph_checkpoint_ns")
    if not isinstance(namespace, str):
        return None
    return namespace.rpartition(":")[2] or None


def _sent(metadata: Mapping[str, Any] | None) -> bool:
    """Whether a run's metadata places it in a LangGraph task a ``Send`` started: its
    ``langgraph_path`` is ``("__pregel_push", <the Send's index>, ...)`` (a functional API
    task's holds its caller's path there)."""
    path = (metadata or {}).get("langgraph_path")
    return (
        isinstance(path, (tuple, list))
        and len(path) > 1
        and path[0] == _PUSH
        and type(path[1]) is int
    )


def parent_run_id(config: Mapping[str, Any] | None) -> UUID | None:
    """The run a call made with ``config`` runs under (its callback manager's parent)."""
    callbacks = (config or {}).get("callbacks")
    parent = getattr(callbacks, "parent_run_id", None)
    return parent if isinstance(parent, UUID) else None


_blocking: ContextVar[bool] = ContextVar("ce_langchain_blocking", default=False)


def set_blocking(blocking: bool) -> None:
    """Say whether the chat-model call this context starts now is a blocking one (``invoke``,
    ``stream``: its callbacks write their records inline) or an async one (``ainvoke``,
    ``astream``: they queue them on the loop). Each entry point sets it as it starts."""
    _blocking.set(blocking)


def in_blocking_call() -> bool:
    """Whether this context's latest chat-model call is a blocking one (see
    :func:`set_blocking`)."""
    return _blocking.get()


def tool_call_in_flight() -> str | None:
    """The ``tool_call_id`` of the tool run starting in this context (see
    :func:`make_tool_run`)."""
    return _tool_call.get()


@dataclass(frozen=True)
class _Node:
    parent: UUID | None
    kind: str
    scope: Scope
    call_id: str  # what a nested run's scope is named after: unique in the session
    hook: bool  # in a create_agent middleware hook node
    state: tuple[str, frozenset[str]] | None = None  # its LangGraph node, see node_state
    keeper: str | None = None  # its output says which replies join the conversation: keeps_replies
    inputs: Sequence[Any] | None = None  # a node's input messages (see ScopeTracker.start)
    joins: str | None = None  # a branch's: the session its state joins (see ScopeTracker.start)
    task: str | None = None  # a chain's: the id of the LangGraph task it runs in


class ScopeTracker:
    """The runs in flight and their scopes, shared by the plugin's injection and recording.

    ``start`` / ``end`` follow a run (cheap: a dict entry under a lock, removed when the run
    ends). :meth:`for_call` is the scope of a chat-model call about to start (injection);
    registered under the call's run id, the handler's ``on_chat_model_start`` picks the same
    scope up (:meth:`start` with ``kind="model"``).
    """

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self._nodes: dict[UUID, _Node] = {}
        self._pending: OrderedDict[Hashable, tuple[Scope, object]] = OrderedDict()
        self._call_ids = ToolScopeIds(plugin)  # the child scopes of tool runs, per session
        self._conversations = RunConversations()  # of the scopes nothing names
        self._beside: OrderedDict[str, None] = OrderedDict()  # LangGraph task ids
        self._lock = threading.Lock()

    def _node(self, run_id: UUID | None) -> _Node | None:
        if run_id is None:
            return None
        with self._lock:
            return self._nodes.get(run_id)

    def resolve(
        self,
        run_id: UUID,
        parent: UUID | None,
        metadata: Mapping[str, Any] | None,
        tags: Sequence[str] | None = None,
    ) -> Scope:
        """The scope of run ``run_id`` under ``parent`` (see the module docstring)."""
        explicit = explicit_session(metadata, tags)
        node = self._node(parent)
        if node is None:
            # a root run; under a run this tracker never saw, that run stands for the root
            return resolve_scope(
                self.plugin,
                run_id=str(parent or run_id),
                explicit=explicit,
                framework=framework_identity(metadata),
            )
        if node.kind in _NESTING_KINDS:
            return resolve_scope(
                self.plugin,
                run_id=str(run_id),
                explicit=explicit,
                parent=node.scope,
                parent_call_id=node.call_id,
            )
        return self._inherit(node.scope, run_id, explicit, metadata)

    def _inherit(
        self,
        outer: Scope,
        run_id: UUID,
        explicit: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> Scope:
        """A run under a chain or model keeps its parent's scope unless it names another one
        (names inherited through the metadata resolve to the parent's scope anyway)."""
        if outer.nested:
            enclosing = {*outer.lineage, outer.session_id}
            in_engine = current_session_id()
            if explicit and explicit not in enclosing:
                return Scope(explicit, "explicit")
            if in_engine and in_engine not in enclosing:
                return Scope(in_engine, "engine")
            return outer
        own = resolve_scope(
            self.plugin,
            run_id=str(run_id),
            explicit=explicit,
            framework=framework_identity(metadata),
        )
        if own.source in ("explicit", "engine", "framework") and own.session_id != outer.session_id:
            return own
        return outer

    def start(
        self,
        run_id: UUID,
        parent: UUID | None,
        kind: str,
        metadata: Mapping[str, Any] | None,
        tags: Sequence[str] | None = None,
        *,
        call_id: str | None = None,
        pending_key: Hashable | None = None,
        state: tuple[str, frozenset[str]] | None = None,
        messages: Sequence[Any] = (),
        keeper: str | None = None,
        inputs: Sequence[Any] | None = None,
        handed: frozenset[str] | None = None,
    ) -> Scope:
        """Follow run ``run_id`` (``kind``: chain, tool, retriever, model; a tool run's
        ``call_id``: its ``tool_call_id``; a LangGraph node's ``state``, see
        :func:`node_state`; ``keeper``: see :func:`keeps_replies`; ``inputs``: a node's input
        messages, held until it ends, see :meth:`pop`; ``handed``: see
        :func:`handed_messages`) until :meth:`end`; its
        scope: the one :meth:`for_call`
        registered for it (by run id, else by ``pending_key``), else :meth:`resolve`'s (a
        chat model's ``messages`` tell a node's own call, see :meth:`side_call`); for a
        LangGraph node's own run whose task runs beside others (:meth:`run_beside`), the
        branch ``<that scope>/<node>:<task id>``; for a LangGraph run handed messages of its
        own, a child scope of that scope (see :meth:`_apart`)."""
        by_id, by_key = self._take(run_id), self._take(pending_key)
        scope = by_id or by_key
        joins = None
        apart = False
        task = _task_id(metadata) if kind == "chain" else None
        if scope is None and kind == "model":
            scope = self._model_scope(run_id, parent, metadata, tags, messages)
        if scope is None:
            scope = self.resolve(run_id, parent, metadata, tags)
            if keeper == "node" and state is not None:
                branch = self._branch(scope, state[0], metadata)
                if branch is not None:
                    scope, joins = branch, scope.session_id
            elif handed is not None:
                own = self._apart(run_id, parent, scope, handed, metadata, task)
                if own is not None:
                    scope, apart = own, True
        named = str(run_id) if call_id is None else self._call_ids.take(scope.session_id, call_id)
        hook = in_hook_node(metadata)
        with self._lock:
            outer = self._nodes.get(parent) if parent is not None else None
            hook = hook or (outer is not None and outer.hook)
            if state is None and outer is not None and kind not in _NESTING_KINDS and not apart:
                # a tool's runs are the tool call's, not the node's; a conversation of its
                # own is none of the node's
                state = outer.state
            self._nodes[run_id] = _Node(
                parent=parent,
                kind=kind,
                scope=scope,
                call_id=named,
                hook=hook,
                state=state,
                keeper=keeper,
                inputs=inputs,
                joins=joins,
                task=task,
            )
            if len(self._nodes) > _NODES_MAX:
                del self._nodes[next(iter(self._nodes))]
        return scope

    def run_beside(self, task_ids: Iterable[str]) -> None:
        """Note the LangGraph tasks ``task_ids`` as running in one superstep together (a
        fan-out ``START -> (a, b)``, ``Send``s to several nodes): each one's node, when its
        input state holds messages, is a branch of the scope it runs in (see :meth:`start`),
        assembled from and recorded into a session of its own. A branch's calls get what the
        graph gives it (the thread's conversation as the state held it at the step, and its
        own tool loop), never what a sibling records meanwhile; the thread's session gets its
        messages, in the state's order and with their names, when a later call passes the
        state that merged them. The newest few thousand ids are held (a task run again, on a
        retry or resumed in this process, is the same branch)."""
        with self._lock:
            for task_id in task_ids:
                self._beside[task_id] = None
                self._beside.move_to_end(task_id)
            while len(self._beside) > _BESIDE_MAX:
                self._beside.popitem(last=False)

    def _branch(self, scope: Scope, node: str, metadata: Mapping[str, Any] | None) -> Scope | None:
        """The branch ``<scope>/<node>:<task id>`` of a node's own run whose task runs beside
        others (see :meth:`run_beside`), or ``None`` (also in that branch already: a compiled
        graph named after the node, run as the node, is the node's run too)."""
        task_id = _task_id(metadata)
        if task_id is None:
            return None
        with self._lock:
            if task_id not in self._beside:
                return None
        name = f"{node}:{task_id[-_TASK_ID_TAIL:]}"
        return None if scope.parent_call_id == name else scope.child(name)

    def _apart(
        self,
        run_id: UUID,
        parent: UUID | None,
        scope: Scope,
        handed: frozenset[str],
        metadata: Mapping[str, Any] | None,
        task: str | None,
    ) -> Scope | None:
        """The scope of a LangGraph chain run handed messages of its own (``handed``: the ids
        of the newest of them, see :func:`handed_messages`), when it inherits ``scope`` from
        its ``parent`` run (a run naming a session of its own keeps it), else ``None``:

        - in a task a ``Send`` started, messages none of which has an id (the ``Send``'s
          payload, made for the task: no state's reducer saw them): the task's own
          conversation ``<scope>/<node>:<task id>``, as a branch is named (``None`` in it
          already: the compiled graph run as the node is the node's run too);
        - inside a node's task (a compiled graph, a chain the node's function invokes: the
          task of its parent), none of the newest messages of the node's input (a question
          of its own; a node whose input holds no messages hands messages of its own only):
          ``<scope>/<node>:<run id>``. A run handed the node's messages (the agent of a
          supervisor, a subgraph added as a node) continues the node's conversation, and so
          does one under a node whose input's messages carry no ids (a state of messages
          without LangGraph's reducer: nothing tells what the run is handed)."""
        outer = self._node(parent)
        if outer is None or outer.kind in _NESTING_KINDS or outer.hook or outer.scope != scope:
            return None
        node = (metadata or {}).get("langgraph_node")
        if not handed and _sent(metadata):
            if task is None:
                return None
            name = f"{node}:{task[-_TASK_ID_TAIL:]}"
            return None if scope.parent_call_id == name else scope.child(name)
        if task is None or task != outer.task or outer.state is None or handed & outer.state[1]:
            return None
        return scope.child(f"{node}:{run_id.hex[-12:]}")

    def end(self, run_id: UUID) -> None:
        """Stop following run ``run_id`` (a no-op for a run never started)."""
        with self._lock:
            self._nodes.pop(run_id, None)

    def pop(self, run_id: UUID) -> _Node | None:
        """Stop following run ``run_id``; what was followed of it (None: never started)."""
        with self._lock:
            return self._nodes.pop(run_id, None)

    def replied(self, session_id: str, reply: Any) -> None:
        """Note ``reply``, the answer of a chat-model call in ``session_id``, for the
        conversations of the scopes nothing names (see
        :meth:`~ce.core.integration.RunConversations.replied`)."""
        self._conversations.replied(session_id, _turn_key(reply))

    def keeper_of(self, run_id: UUID | None, session_id: str) -> tuple[UUID, str] | None:
        """The run whose output says whether the reply of the chat-model run ``run_id`` (in
        session ``session_id``) joins the conversation, and its kind: the nearest enclosing
        keeper run (see :func:`keeps_replies`) of the same session, not across a tool or
        retriever run."""
        with self._lock:
            node = self._nodes.get(run_id) if run_id is not None else None
            for _ in range(_KEEPER_DEPTH):
                if node is None or node.parent is None:
                    return None
                parent = node.parent
                node = self._nodes.get(parent)
                if node is None or node.kind in _NESTING_KINDS:
                    return None
                if node.keeper is not None:
                    same = node.scope.session_id == session_id
                    return (parent, node.keeper) if same else None
        return None

    def scope_of(self, run_id: UUID | None) -> Scope | None:
        """The scope of a run in flight, or ``None``."""
        node = self._node(run_id)
        return None if node is None else node.scope

    def side_call(self, parent: UUID | None, messages: Sequence[Any]) -> _Node | None:
        """The run under which a chat-model call with ``messages`` is a LangGraph node's
        own work: under ``parent`` is a node whose input state holds messages (with ids), and
        the call does not end with one of the newest of them: it passes none of them (a
        grader's prompt), or messages of its own after the newest of them it passes (a
        summarizer's "Create a summary of the conversation above" appended to the
        conversation, the drafts a reflection step sends as user messages); or a node whose
        input holds no messages (its calls are prompts of their own, whatever thread the
        graph runs on). ``None`` for a call of the conversation (it ends with a message of
        the state: only the last message is looked at), or outside such a node."""
        node = self._node(parent)
        if node is None or node.state is None or node.hook or node.kind in _NESTING_KINDS:
            return None
        ids = node.state[1]
        if messages and getattr(messages[-1], "id", None) in ids:
            return None
        return node

    def _model_scope(
        self,
        run_id: UUID,
        parent: UUID | None,
        metadata: Mapping[str, Any] | None,
        tags: Sequence[str] | None,
        messages: Sequence[Any],
    ) -> Scope:
        """The scope of a chat-model call with ``messages``: a LangGraph node's own (see
        :meth:`side_call`), else :meth:`resolve`'s, placed among the conversations of a
        scope nothing names (see :class:`~ce.core.integration.RunConversations`)."""
        scope = self._side_scope(run_id, parent, messages) if messages else None
        if scope is not None:
            return scope
        scope = self.resolve(run_id, parent, metadata, tags)
        return self._conversations.place(scope, messages, _turn_key, f"call:{run_id.hex[-12:]}")

    def _side_scope(
        self, run_id: UUID | None, parent: UUID | None, messages: Sequence[Any]
    ) -> Scope | None:
        """The child scope ``<outer>/<node>:<id>`` of a node's own call (see
        :meth:`side_call`), or ``None``."""
        node = self.side_call(parent, messages)
        if node is None or node.state is None:
            return None
        name = f"{node.state[0]}:{(run_id or uuid.uuid4()).hex[-12:]}"
        return resolve_scope(
            self.plugin, run_id=str(run_id), parent=node.scope, parent_call_id=name
        )

    def in_hook(self, run_id: UUID | None) -> bool:
        """Whether run ``run_id`` (in flight) is in a ``create_agent`` middleware hook node:
        a model call under it is the middleware's own, whatever its own config says."""
        node = self._node(run_id)
        return node is not None and node.hook

    def for_call(
        self,
        run_id: UUID | None,
        parent: UUID | None,
        metadata: Mapping[str, Any] | None,
        tags: Sequence[str] | None = None,
        *,
        pending_key: Hashable | None = None,
        keep: object = None,
        messages: Sequence[Any] = (),
    ) -> Scope:
        """The scope of a chat-model call about to start under ``parent`` with ``messages``,
        registered for the handler under ``run_id`` (the id the call's run will get) or
        ``pending_key`` (e.g. the identities of the messages handed to it; ``keep`` holds them
        alive meanwhile)."""
        scope = self._model_scope(run_id or uuid.uuid4(), parent, metadata, tags, messages)
        for key in (run_id, pending_key):
            if key is not None:
                self.remember(key, scope, keep)
        return scope

    def remember(self, key: Hashable, scope: Scope, keep: object = None) -> None:
        """Register ``scope`` for the chat-model run :meth:`start` will find under ``key``
        (the oldest registrations go first beyond a few thousand never claimed)."""
        with self._lock:
            self._pending[key] = (scope, keep)
            self._pending.move_to_end(key)
            while len(self._pending) > _PENDING_MAX:
                self._pending.popitem(last=False)

    def _take(self, key: Hashable | None) -> Scope | None:
        if key is None:
            return None
        with self._lock:
            entry = self._pending.pop(key, None)
        return None if entry is None else entry[0]

    def clear(self) -> None:
        """Forget every run, pending call, tool-call id, run conversation and task running
        beside others (on uninstall)."""
        with self._lock:
            self._nodes.clear()
            self._pending.clear()
            self._beside.clear()
        self._call_ids.clear()
        self._conversations.clear()


def messages_key(messages: Sequence[object]) -> tuple[str, tuple[int, ...]]:
    """A pending key naming a list of message objects by identity."""
    return ("messages", tuple(id(m) for m in messages))


def make_history_merge(
    on_history: Callable[[Any, Any], None],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ledger's replacement factory for ``RunnableWithMessageHistory._merge_configs``: the
    merged config's metadata also names the conversation its ``history_factory_config`` keys
    select (:data:`HISTORY_KEY`), so custom keys (``user_id`` + ``conversation_id``) scope the
    run like ``session_id`` does; then ``on_history(history, config)`` is told of the message
    history the run uses. Never raises more than the original does."""

    def factory(original: Callable[..., Any]) -> Callable[..., Any]:
        return _history_merge(original, on_history)

    return factory


def _history_merge(
    original: Callable[..., Any], on_history: Callable[[Any, Any], None]
) -> Callable[..., Any]:
    def _merge_configs(self: Any, *configs: Any) -> Any:
        config = original(self, *configs)
        try:
            keys = [spec.id for spec in self.history_factory_config]
            configurable = config.get("configurable") or {}
            values = [_scalar(configurable.get(key)) for key in keys]
            if keys and all(values):
                identity = (
                    str(values[0])
                    if len(keys) == 1
                    else "&".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
                )
                config["metadata"] = {**(config.get("metadata") or {}), HISTORY_KEY: identity}
        except Exception:  # an unexpected history_factory_config: no identity, run scope
            pass
        history = (config.get("configurable") or {}).get("message_history")
        if history is not None:
            try:
                on_history(history, config)
            except Exception:  # noting it is the plugin's own bookkeeping: never the app's error
                logger.debug("could not note the message history of a run", exc_info=True)
        return config

    _merge_configs.__wrapped__ = original  # type: ignore[attr-defined]
    return _merge_configs


def make_runner_tick(
    run_beside: Callable[[Iterable[str]], None],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ledger's replacement factory for LangGraph's ``PregelRunner.tick`` and ``atick``,
    which run the tasks of one superstep: when they are several, ``run_beside`` is told their
    ids before any of them starts (see :meth:`ScopeTracker.run_beside`); then the original
    runs them, untouched."""

    def factory(original: Callable[..., Any]) -> Callable[..., Any]:
        def tick(self: Any, tasks: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
            tasks = tuple(tasks)
            if len(tasks) > 1:
                run_beside(i for t in tasks if isinstance(i := getattr(t, "id", None), str))
            return original(self, tasks, *args, **kwargs)

        tick.__wrapped__ = original  # type: ignore[attr-defined]
        return tick

    return factory


def make_tool_run(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement of ``BaseTool.run``: the ``tool_call_id`` it runs for is visible to
    ``on_tool_start`` (:func:`tool_call_in_flight`) on every langchain-core version."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _tool_call.set(_scalar(kwargs.get("tool_call_id")))
        try:
            return original(self, *args, **kwargs)
        finally:
            _tool_call.reset(token)

    run.__wrapped__ = original  # type: ignore[attr-defined]
    return run


def make_tool_arun(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The coroutine twin of :func:`make_tool_run` for ``BaseTool.arun``."""

    async def arun(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _tool_call.set(_scalar(kwargs.get("tool_call_id")))
        try:
            return await original(self, *args, **kwargs)
        finally:
            _tool_call.reset(token)

    arun.__wrapped__ = original  # type: ignore[attr-defined]
    return arun
