"""Which session a framework call belongs to: one rule for every plugin.

A top-level call's session is, first match wins: the ``ce_session_id`` the call names
explicitly (run metadata, tags), the innermost ``with engine.session(...)``, the framework's
own conversation identity (a LangGraph ``thread_id``, a chat history's ``session_id``, a
memory's key, ...), the ``session_id`` given to ``install()``. With none of these the call
shares history with nothing: it is scoped to its own top-level run, under a generated session
id (:func:`run_session_id`).

A nested call (a model call inside a tool run, or inside another model-driven component of an
outer run: an LLM-backed tool, a sub-agent called as a tool, a query engine inside a tool, a
condense step) is not part of the outer conversation: it gets a child scope
``"<outer session>/<tool call or component id>"`` and never receives or changes the outer
session's messages. Only a session the nested call names itself (``ce_session_id`` or
``engine.session()`` set inside the nested run, not inherited from an enclosing one) takes it
elsewhere.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ce.core.engine import current_session_id

if TYPE_CHECKING:
    from ce.core.integration._plugin import Plugin

__all__ = [
    "RUN_SESSION_PREFIX",
    "SESSION_KEY",
    "ObjectSessions",
    "Scope",
    "ScopeSource",
    "ToolScopeIds",
    "child_session_id",
    "resolve_scope",
    "run_session_id",
]

SESSION_KEY = "ce_session_id"
"""The metadata / tag key that names a call's session explicitly, in every framework."""

RUN_SESSION_PREFIX = "run:"
"""Session ids of calls nothing names a session for start with this, then the run's id."""

ScopeSource = Literal["explicit", "engine", "framework", "install", "run", "nested"]


@dataclass(frozen=True)
class Scope:
    """The session a framework call is recorded into and assembled from, and why.

    ``source`` says which rule chose it. ``lineage`` holds the sessions of the enclosing
    scopes, outermost first (empty for a top-level call); ``parent_session_id`` and
    ``parent_call_id`` link a nested scope to the call it runs in.
    """

    session_id: str
    source: ScopeSource
    lineage: tuple[str, ...] = ()
    parent_session_id: str | None = None
    parent_call_id: str | None = None

    @property
    def nested(self) -> bool:
        """Whether this scope is a child of an outer one."""
        return self.parent_session_id is not None

    @property
    def named(self) -> bool:
        """Whether a session names this scope (``ce_session_id``, ``engine.session()``, the
        framework's conversation, the install default), so it may hold earlier turns; a run's
        own scope or a nested call's is new with the run."""
        return self.source not in ("run", "nested")

    def child(self, call_id: str) -> Scope:
        """The scope of a call nested in this one's ``call_id`` (a tool call id, a
        component's run id)."""
        return Scope(
            session_id=child_session_id(self.session_id, call_id),
            source="nested",
            lineage=(*self.lineage, self.session_id),
            parent_session_id=self.session_id,
            parent_call_id=call_id,
        )


def run_session_id(run_id: str) -> str:
    """The generated session of a top-level run that names no session."""
    return f"{RUN_SESSION_PREFIX}{run_id}"


def child_session_id(parent_session_id: str, call_id: str) -> str:
    """The session of a call nested in ``parent_session_id``'s ``call_id``."""
    return f"{parent_session_id}/{call_id}"


def _name(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    return text or None


def resolve_scope(
    plugin: Plugin,
    *,
    run_id: str,
    explicit: object = None,
    framework: object = None,
    parent: Scope | None = None,
    parent_call_id: str | None = None,
    inherited: str | None = None,
) -> Scope:
    """The scope of one framework call (a model call, a tool run, a retrieval).

    ``run_id`` identifies the call's top-level run (a root run, a root span, a workflow
    run); ``explicit`` is the ``ce_session_id`` the call carries and ``framework`` the
    framework's own conversation identity, if any (empty strings and non-scalars count as
    absent; ints are ids too). ``parent`` is the scope of the enclosing tool run or
    model-driven component when the call is nested in one, and ``parent_call_id`` that
    component's id (default: ``run_id``).

    A nested call gets ``parent.child(parent_call_id)``, unless it names a session of its own
    (``explicit`` or ``engine.session()``) that none of its enclosing scopes has: a name
    inherited from the outer run does not take a nested call back into the outer
    conversation. A top-level call follows the module's order; with nothing named it is
    scoped to its run (:func:`run_session_id`).

    ``inherited``: the ``engine.session()`` the call's flow of work inherited from the code
    that started it rather than set itself (a framework's message loop, started once inside
    one user's session, serving every user's later work): it does not name the call's
    session (one the flow sets to another name does).
    """
    named = _name(explicit)
    in_engine = current_session_id()
    if in_engine is not None and in_engine == inherited:
        in_engine = None
    if parent is not None:
        enclosing = {*parent.lineage, parent.session_id}
        if named and named not in enclosing:
            return Scope(named, "explicit")
        if in_engine and in_engine not in enclosing:
            return Scope(in_engine, "engine")
        return parent.child(parent_call_id or run_id)
    if named:
        return Scope(named, "explicit")
    if in_engine:
        return Scope(in_engine, "engine")
    own = _name(framework)
    if own:
        return Scope(own, "framework")
    if plugin.session_id:
        return Scope(plugin.session_id, "install")
    return Scope(run_session_id(run_id), "run")


class ToolScopeIds:
    """The ids naming the child scopes of tool runs (``parent_call_id`` of
    :func:`resolve_scope`), per session: a tool call's id the first time; for an id the
    session's runs used before (a model may answer ``call_0`` in every turn) the name the
    engine stores that call under (``<id>~2``, ``<id>~3``, ...), so each run's nested calls
    get a scope of their own. The earlier runs are those the ``plugin``'s engine holds for
    the session (read from the store by a process that did not make them: a restarted app,
    another worker) and those this process named (for the ``sessions`` latest used
    sessions). Thread-safe."""

    def __init__(self, plugin: Plugin | None = None, sessions: int = 4096) -> None:
        self._plugin = plugin
        self._sessions = sessions
        self._used: OrderedDict[str, set[str]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, session_id: str, call_id: str) -> str:
        """The id of the child scope of a run of tool call ``call_id`` in ``session_id``."""
        current: str | None = None
        held: set[str] = set()
        if self._plugin is not None and self._plugin.installed:
            current, held = self._plugin.engine._tool_call_names(session_id, call_id)
        with self._lock:
            used = self._used.pop(session_id, set())
            self._used[session_id] = used  # the latest used last
            while len(self._used) > self._sessions:
                self._used.popitem(last=False)
            if current is not None and current not in used:
                unique = current  # the call running now, as the session stores it
            else:
                unique, n = call_id, 2
                while unique in used or unique in held:
                    unique, n = f"{call_id}~{n}", n + 1
            used.add(unique)
        return unique

    def clear(self) -> None:
        """Forget every id."""
        with self._lock:
            self._used.clear()


class ObjectSessions:
    """Per framework object (a memory, a chat history, an agent thread), the sessions its
    calls were recorded in since it was last taken, the most recent last: what a reset of
    that object clears (:meth:`ContextEngine.clear_history`). Objects are held weakly and by
    identity (pydantic models, which are unhashable, included); one the app drops is
    forgotten. Thread-safe."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[weakref.ref[Any], list[str]]] = {}
        self._lock = threading.Lock()

    def note(self, obj: Any, session_id: str | None) -> None:
        """A call of ``obj`` is recorded in ``session_id`` (``None``: in no session of its
        own, e.g. nested in a tool: ``obj`` is seen all the same). Raises ``TypeError`` for an
        object that cannot be referenced weakly."""
        key = id(obj)

        def gone(ref: weakref.ref[Any], key: int = key) -> None:
            # no lock (the collector may run this inside a locked block): it runs while the
            # object is freed, before another object can get its id
            held = self._held.get(key)
            if held is not None and held[0] is ref:
                self._held.pop(key, None)

        with self._lock:
            held = self._held.get(key)
            if held is None or held[0]() is not obj:
                held = (weakref.ref(obj, gone), [])
                self._held[key] = held
            if session_id is not None:
                if session_id in held[1]:
                    held[1].remove(session_id)
                held[1].append(session_id)

    def sessions(self, obj: Any) -> list[str] | None:
        """The sessions of ``obj``'s calls since it was last taken, the most recent last
        (``None``: none of its calls was seen since)."""
        with self._lock:
            held = self._held.get(id(obj))
            return list(held[1]) if held is not None and held[0]() is obj else None

    def take(self, obj: Any) -> list[str] | None:
        """:meth:`sessions`, then forget ``obj``."""
        with self._lock:
            held = self._held.get(id(obj))
            if held is None or held[0]() is not obj:
                return None
            del self._held[id(obj)]
        return held[1]

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
