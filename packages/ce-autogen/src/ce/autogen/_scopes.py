"""Which session an AutoGen model call, tool run or memory query belongs to: the kit's rule
(:func:`ce.core.integration.resolve_scope`) applied to AutoGen's runs.

AutoGen names no conversation (an agent's or a team's history lives in the object itself), so
a top-level run's session is ``with engine.session(...)`` around it, else
``install(session_id=...)``, else the run itself (``run:<id>``, one per ``run`` /
``run_stream`` / ``on_messages`` of a standalone agent, one per ``run`` / ``run_stream`` of a
team). A team's run is one scope: every agent of the team, nested teams included, records into
it and is assembled from it (each with its own system message first, see ``_inject``).

A reset (``on_reset`` of an agent, ``reset()`` of a team: AutoGen's way to start a new task
with the same objects) clears the session of the object's last run: the plugin remembers, per
agent and team object (weakly), the session its last run recorded into. An agent's turn in a
team is the team's run: its session is the team's, which the team's reset clears (an agent
reset alone, or inside its team's reset, leaves it to the team).

A run started inside a tool call of another run (an ``AgentTool`` / ``TeamTool``, a tool body
that runs an agent) is nested: it gets the child scope ``<outer session>/<tool call id>`` and
never receives or changes the outer conversation. So is the inner team's run of a
``SocietyOfMindAgent``'s turn: ``<session of the agent's run>/<agent name>`` (``~2``, ... for
its later turns), as AutoGen resets that team after every answer. An agent a
``MessageFilterAgent`` wraps is the team's agent (the wrapper only filters what it receives).

AutoGen's hooks do not receive the agent (``_call_llm`` and ``_execute_tool_call`` are
class / static methods), so a run's :class:`Frame` is found by the objects they do receive:
the agent's model context and workbench list, and for a team's speaker selection the team
id. A frame is bound when the run starts and unbound when it ends.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ce.core.integration import ObjectSessions, Scope, ToolScopeIds, resolve_scope

if TYPE_CHECKING:
    from ce.core.integration import Plugin

__all__ = [
    "Frame",
    "Runs",
    "ToolFrame",
    "agents_of",
    "current_tool",
    "filtered_of",
    "in_tool",
    "reachable",
    "unwrapped",
]


@dataclass(frozen=True)
class ToolFrame:
    """A tool call in flight: the scope it was made in, the model's call id, and the id
    naming the child scope of the runs nested in it (the call id, or ``<id>~2``, ... when an
    earlier tool run of the session used it: see :class:`~ce.core.integration.ToolScopeIds`)."""

    scope: Scope
    call_id: str
    child_id: str


_tool: ContextVar[ToolFrame | None] = ContextVar("ce_autogen_tool", default=None)


def current_tool() -> ToolFrame | None:
    """The tool call the current code runs inside, if any."""
    return _tool.get()


class in_tool:
    """Within this block, runs started are nested in ``frame``'s tool call."""

    def __init__(self, frame: ToolFrame) -> None:
        self._frame = frame
        self._token: Any = None

    def __enter__(self) -> ToolFrame:
        self._token = _tool.set(self._frame)
        return self._frame

    def __exit__(self, *exc: object) -> None:
        _tool.reset(self._token)


@dataclass
class Frame:
    """One run in flight: its scope, the names of the model-driven agents of its team
    (empty for a standalone agent) and of those of them a ``MessageFilterAgent`` wraps
    (``filtered``: each sees only what its model context holds)."""

    scope: Scope
    peers: frozenset[str] = frozenset()
    filtered: frozenset[str] = frozenset()
    team: bool = False
    team_id: str | None = None
    objects: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return self.scope.session_id


def unwrapped(agent: Any) -> Any:
    """The agent a ``MessageFilterAgent`` wraps (through any depth of wrappers), else
    ``agent``."""
    while getattr(agent, "_wrapped_agent", None) is not None:
        agent = agent._wrapped_agent
    return agent


def agents_of(team: Any) -> Iterator[Any]:
    """The agents of a team, those of its nested teams included; for a
    ``MessageFilterAgent``, the agent it wraps (the one whose model calls the run makes)."""
    for participant in getattr(team, "_participants", ()) or ():
        if hasattr(participant, "_participants"):
            yield from agents_of(participant)
        else:
            yield unwrapped(participant)


def filtered_of(team: Any) -> Iterator[Any]:
    """The agents of a team (nested teams included) that a ``MessageFilterAgent`` wraps."""
    for participant in getattr(team, "_participants", ()) or ():
        if hasattr(participant, "_participants"):
            yield from filtered_of(participant)
        elif unwrapped(participant) is not participant:
            yield unwrapped(participant)


def reachable(target: Any) -> Iterator[Any]:
    """``target`` (an agent or a team) and the agents and teams it runs: a team's agents
    and nested teams, a wrapped agent, a ``SocietyOfMindAgent``'s inner team."""
    yield target
    inner = unwrapped(target)
    if inner is not target:
        yield from reachable(inner)
    for participant in getattr(target, "_participants", ()) or ():
        yield from reachable(participant)
    team = getattr(target, "_team", None)
    if team is not None and hasattr(team, "_participants"):
        yield from reachable(team)


class Runs:
    """The frames of the runs in flight, by the objects AutoGen's hooks receive."""

    def __init__(self, plugin: Plugin, targets: Iterable[Any] = ()) -> None:
        self.plugin = plugin
        self.tool_scope_ids = ToolScopeIds(plugin)  # the child scopes of tool runs, per session
        self._frames: dict[tuple[str, int], tuple[Any, Frame, bool]] = {}
        self._teams: dict[str, tuple[Frame, bool]] = {}
        self._nested: dict[int, tuple[Any, ToolFrame]] = {}
        self._ran = ObjectSessions()  # the sessions of each agent's and team's own runs
        self._resetting: dict[int, int] = {}
        self._lock = threading.Lock()
        self._targets: weakref.WeakSet[Any] | None = None
        targets = list(targets)
        if targets:
            self._targets = weakref.WeakSet()
            for target in targets:
                for obj in reachable(target):
                    self._targets.add(obj)

    # -- targets ----------------------------------------------------------------------------

    def targeted(self, obj: Any) -> bool:
        """Whether the plugin acts on ``obj`` (an agent or a team)."""
        return self._targets is None or obj in self._targets

    # -- frames -----------------------------------------------------------------------------

    def new_scope(self, parent: ToolFrame | None = None) -> Scope:
        """The scope of a run starting now: nested in ``parent`` when given, else in the
        tool call the current code runs inside, else top-level."""
        tool = parent or current_tool()
        run_id = uuid.uuid4().hex
        if tool is None:
            return resolve_scope(self.plugin, run_id=run_id)
        return resolve_scope(
            self.plugin, run_id=run_id, parent=tool.scope, parent_call_id=tool.child_id
        )

    def nest(self, team: Any, parent: Scope, name: str) -> ToolFrame:
        """Make the next runs of ``team`` (a ``SocietyOfMindAgent``'s inner team, the agent
        named ``name`` taking its turn in ``parent``) nested: in the child scope
        ``<parent session>/<name>`` (``<name>~2``, ... for the agent's later turns in that
        session). Returns the binding, for :meth:`unnest`."""
        frame = ToolFrame(parent, name, self.tool_scope_ids.take(parent.session_id, name))
        with self._lock:
            self._nested[id(team)] = (team, frame)
        return frame

    def unnest(self, team: Any, frame: ToolFrame) -> None:
        """Forget the binding ``frame`` of ``team`` (the turn ended), where it still holds."""
        with self._lock:
            entry = self._nested.get(id(team))
            if entry is not None and entry[1] is frame:
                del self._nested[id(team)]

    def nested_in(self, team: Any) -> ToolFrame | None:
        """What a run of ``team`` starting now is nested in (see :meth:`nest`), if any."""
        entry = self._nested.get(id(team))
        return entry[1] if entry is not None and entry[0] is team else None

    def running_in(self, session_id: str) -> bool:
        """Whether an agent's or a team's run in flight records into ``session_id``."""
        with self._lock:
            return any(frame.session_id == session_id for _, frame, _ in self._frames.values())

    def _keys(self, agent: Any) -> list[tuple[str, Any]]:
        keys: list[tuple[str, Any]] = []
        for kind, attr in (("context", "_model_context"), ("workbench", "_workbench")):
            obj = getattr(agent, attr, None)
            if obj is not None:
                keys.append((kind, obj))
        return keys

    def bind_agent(self, agent: Any, frame: Frame) -> None:
        """Make ``frame`` the run of ``agent``'s model calls, tool runs and memory queries
        (acted on when the agent is targeted)."""
        act = self.targeted(agent)
        with self._lock:
            for kind, obj in self._keys(agent):
                self._frames[(kind, id(obj))] = (obj, frame, act)
                frame.objects.append((kind, obj))

    def bind_team(self, team: Any, team_id: str, frame: Frame) -> None:
        """Make ``frame`` the run of the speaker selection of ``team`` (id ``team_id``)."""
        act = self.targeted(team)
        with self._lock:
            self._teams[team_id] = (frame, act)
            frame.team_id = team_id

    def unbind(self, frame: Frame) -> None:
        """Forget ``frame`` (the run ended), where it is still bound."""
        with self._lock:
            for kind, obj in frame.objects:
                entry = self._frames.get((kind, id(obj)))
                if entry is not None and entry[1] is frame:
                    del self._frames[(kind, id(obj))]
            frame.objects.clear()
            team = self._teams.get(frame.team_id or "")
            if team is not None and team[0] is frame:
                del self._teams[frame.team_id or ""]

    def _get(self, kind: str, obj: Any, acting: bool = True) -> Frame | None:
        entry = self._frames.get((kind, id(obj)))
        if entry is None or entry[0] is not obj or (acting and not entry[2]):
            return None
        return entry[1]

    def for_context(self, model_context: Any) -> Frame | None:
        """The run an agent's model context is in (None: none, or not acted on)."""
        return self._get("context", model_context)

    def for_workbench(self, workbench: Any) -> Frame | None:
        """The run an agent's workbench list is in (None: none, or not acted on)."""
        return self._get("workbench", workbench)

    def for_team(self, team_id: Any) -> Frame | None:
        """The run of team ``team_id`` (None: none, or not acted on)."""
        entry = self._teams.get(str(team_id))
        return entry[0] if entry is not None and entry[1] else None

    def team_frame(self, agent: Any) -> Frame | None:
        """The frame of the team run ``agent`` takes part in now, if any."""
        model_context = getattr(agent, "_model_context", None)
        if model_context is None:
            return None
        frame = self._get("context", model_context, acting=False)
        return frame if frame is not None and frame.team else None

    # -- resets -----------------------------------------------------------------------------

    def ran(self, obj: Any, session_id: str | None) -> None:
        """Note the session of the run of ``obj`` (an agent or a team the plugin records)
        starting now: what its reset clears. ``None``: the run is a team's (``obj`` an agent
        of it), so the agent's own reset clears nothing (what it ran in before is the
        team's to clear)."""
        if session_id is None:
            self._ran.take(obj)
            return
        with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced
            self._ran.note(obj, session_id)

    def take_ran(self, obj: Any) -> list[str]:
        """The sessions of ``obj``'s runs since its last reset, to clear on this one
        (forgotten: a reset with no run since has nothing to clear). Empty: it never ran, or
        its last run was a team's."""
        return self._ran.take(obj) or []

    @contextmanager
    def resetting(self, team: Any) -> Iterator[None]:
        """Within this block ``team`` is being reset: the resets of what it runs (its agents,
        nested teams, a ``SocietyOfMindAgent``'s inner team) are part of it (see
        :meth:`in_reset`)."""
        ids = {id(obj) for obj in reachable(team)}
        with self._lock:
            for key in ids:
                self._resetting[key] = self._resetting.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                for key in ids:
                    left = self._resetting.pop(key, 1) - 1
                    if left > 0:
                        self._resetting[key] = left

    def in_reset(self, obj: Any) -> bool:
        """Whether ``obj`` is reset as part of a team's reset in flight (its reset then clears
        nothing: the team's clears the team's session)."""
        return id(obj) in self._resetting

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()
            self._teams.clear()
            self._nested.clear()
            self._resetting.clear()
        self._ran.clear()
