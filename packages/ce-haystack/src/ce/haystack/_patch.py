"""Where the plugin hooks into Haystack, and why there.

- The tracer slot (``haystack.tracing.tracer.actual_tracer``, a property on ``ProxyTracer``
  while installed): the plugin's tracer, chained to the app's, also one the app enables
  later (see ``_tracer``), records what Pipelines and Agents do (see ``_record``).
- Chat generators (see ``_inject`` for why this seam): globally, ``run`` / ``run_async`` of
  every chat-generator class (a component whose ``run`` takes ``messages`` and returns
  ``replies``), those registered before ``install()`` and, through the ``@component``
  decorator's registration (``_Component._component``), those registered later; a subclass
  that does not define ``run`` itself uses its base class's wrapper. With
  ``install(target=pipeline_or_agent)``, only the target's generators (a pipeline's chat
  generators and Agents, an Agent's ``chat_generator``), on the instances.
- ``Agent.run`` / ``run_async`` bind the Agent's run (its session: ``hook_context``'s
  ``ce_session_id``) and put the plugin's ``after_tool`` hook in the Agent's ``hooks`` (read
  on every step; the hooks are a plain dict the Agent validates only in ``__init__``);
  ``Agent.to_dict`` leaves that hook out, so a pipeline saved while installed is the app's
  own. ``uninstall()`` removes the hook from every Agent it was put on.

Every replacement goes through the plugin's ledger: ``uninstall()`` puts back the very
objects Haystack held.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ce.core.integration import SESSION_KEY, is_suppressed, record_run_ended
from ce.haystack._inject import Seam
from ce.haystack._record import HOOK_TYPE, SpanObserver, ToolRunHook, blocking, targeted
from ce.haystack._scopes import (
    RunFrame,
    bound,
    component_name,
    open_run,
    run_frame,
    tool_frame,
)

if TYPE_CHECKING:
    from ce.core.integration import PatchLedger, Plugin

__all__ = ["Patches", "is_chat_generator", "patched_targets"]

logger = logging.getLogger("ce.haystack")

AFTER_TOOL = "after_tool"


def is_chat_generator(cls: type) -> bool:
    """Whether ``cls`` defines a chat generator's ``run`` itself: it takes ``messages`` and
    returns ``replies`` (an Agent, which returns ``messages``, is not one)."""
    run = vars(cls).get("run")
    if not callable(run):
        return False
    try:
        parameters = inspect.signature(run).parameters
    except (TypeError, ValueError):
        return False
    outputs = getattr(run, "_output_types_cache", None) or {}
    return "messages" in parameters and "replies" in outputs


def _agent_class() -> type:
    from haystack.components.agents import Agent

    return Agent


def patched_targets() -> list[tuple[Any, str]]:
    """What a global install replaces on Haystack's own classes (for the tests): the tracer
    slot on ``ProxyTracer``, the ``@component`` registration, ``Agent.run`` / ``run_async`` /
    ``to_dict`` and ``run`` / ``run_async`` of Haystack's OpenAI chat generator."""
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.core.component.component import _Component
    from haystack.tracing.tracer import ProxyTracer

    agent = _agent_class()
    return [
        (ProxyTracer, "actual_tracer"),
        (_Component, "_component"),
        (agent, "run"),
        (agent, "run_async"),
        (agent, "to_dict"),
        (OpenAIChatGenerator, "run"),
        (OpenAIChatGenerator, "run_async"),
    ]


class Patches:
    """The hooks of one install (see the module docstring)."""

    def __init__(self, plugin: Plugin, target: Any, inject: bool, generation: object) -> None:
        self.plugin = plugin
        self.target = target
        self.generation = generation
        self.seam = Seam(plugin, inject, self.active)
        self.hook = ToolRunHook(plugin, self.active)
        self.observer = SpanObserver(plugin, self.observing)
        self._hooked: dict[int, tuple[weakref.ref[Any], bool]] = {}
        self._lock = threading.Lock()

    def active(self) -> bool:
        plugin = self.plugin
        return (
            plugin.installed
            and plugin.options.get("_generation") is self.generation
            and not is_suppressed()
        )

    def observing(self) -> bool:
        """Whether the tracer records this span: always when global, inside a run of the
        target otherwise."""
        return self.active() and (self.target is None or targeted.get())

    # -- install ---------------------------------------------------------------------------

    def install(self, ledger: PatchLedger) -> None:
        from ce.haystack._tracer import slot
        from haystack.tracing.tracer import ProxyTracer, tracer

        ledger.replace(ProxyTracer, "actual_tracer", slot(tracer, self.observer))
        agent = _agent_class()
        ledger.wrap(agent, "to_dict", self._to_dict)
        ledger.register(self._unhook_agents, "the after_tool hooks on Agents")
        if self.target is None:
            self._install_global(ledger, agent)
        else:
            self._install_target(ledger, self.target, agent)

    def _install_global(self, ledger: PatchLedger, agent: type) -> None:
        from haystack.core.component.component import _Component, component

        ledger.wrap(agent, "run", lambda original: self._agent_run(original))
        ledger.wrap(agent, "run_async", lambda original: self._agent_run_async(original))
        for cls in list(component.registry.values()):
            self._wrap_class(ledger, cls)

        def register(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def _component(decorator: Any, cls: type) -> type:
                new_cls: type = original(decorator, cls)
                if self.active():
                    try:
                        self._wrap_class(ledger, new_cls)
                    except Exception:
                        logger.warning("ce-haystack: cannot wrap %s", new_cls, exc_info=True)
                return new_cls

            return _component

        ledger.wrap(_Component, "_component", register)

    def _wrap_class(self, ledger: PatchLedger, cls: type) -> None:
        if not is_chat_generator(cls) or issubclass(cls, _agent_class()):
            return
        if getattr(vars(cls)["run"], "ce_wrapped", False):  # registered under two paths
            return
        ledger.wrap(cls, "run", self.seam.wrap_run)
        if inspect.iscoroutinefunction(vars(cls).get("run_async")):
            ledger.wrap(cls, "run_async", self.seam.wrap_run_async)

    def _install_target(self, ledger: PatchLedger, target: Any, agent: type) -> None:
        if isinstance(target, agent):
            self._target_agent(ledger, target)
            return
        walk = getattr(target, "walk", None)
        if not callable(walk):
            raise TypeError(f"install(target=...) takes a Pipeline or an Agent, not {target!r}")
        for name in ("run", "run_async"):
            if callable(getattr(target, name, None)):
                ledger.wrap(target, name, self._targeted)
        for _, instance in walk():
            if isinstance(instance, agent):
                self._target_agent(ledger, instance)
            else:
                self._target_generator(ledger, instance)

    def _target_agent(self, ledger: PatchLedger, target: Any) -> None:
        ledger.wrap(target, "run", lambda original: self._agent_run(original, target))
        ledger.wrap(target, "run_async", lambda original: self._agent_run_async(original, target))
        self._target_generator(ledger, target.chat_generator)

    def _target_generator(self, ledger: PatchLedger, instance: Any) -> None:
        if not is_chat_generator(type(instance)) and not any(
            is_chat_generator(base) for base in type(instance).__mro__
        ):
            return
        ledger.wrap(instance, "run", lambda original: self.seam.wrap_run(original, instance))
        if inspect.iscoroutinefunction(getattr(instance, "run_async", None)):
            ledger.wrap(
                instance,
                "run_async",
                lambda original: self.seam.wrap_run_async(original, instance),
            )

    def _targeted(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A target pipeline's own (bound) ``run`` / ``run_async``, marking its runs."""
        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with bound(targeted, True):
                    return await original(*args, **kwargs)

            return run_async

        @functools.wraps(original)
        def run(*args: Any, **kwargs: Any) -> Any:
            with bound(targeted, True):
                return original(*args, **kwargs)

        return run

    # -- Agents ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _agent_scope(self, agent: Any, kwargs: Mapping[str, Any], sync: bool) -> Iterator[None]:
        """Around one Agent run (``sync``: through ``run``): its frame bound and the
        ``after_tool`` hook in place."""
        if not self.active():
            yield
            return
        try:
            self._hook_agent(agent)
            context = kwargs.get("hook_context")
            explicit = context.get(SESSION_KEY) if isinstance(context, Mapping) else None
            name = None if tool_frame.get() is not None else component_name.get()
            prompted = getattr(agent, "system_prompt", None) is not None
            frame = open_run(self.plugin, explicit, agent=name, prompted=prompted)
        except Exception:
            logger.warning("ce-haystack: cannot scope the Agent run", exc_info=True)
            yield
            return
        with (
            bound(run_frame, frame),
            bound(targeted, targeted.get() or self.target is not None),
            bound(blocking, sync),
        ):
            try:
                yield
            except BaseException as exc:
                self._ended_unfinished(frame, exc, sync)
                raise

    def _ended_unfinished(self, frame: RunFrame, exc: BaseException, sync: bool) -> None:
        """An Agent run that raised (a tool's error raised out of it, the run cancelled) ends
        its session's run in flight (:func:`~ce.core.integration.record_run_ended`: inline
        from ``run``, queued on the loop from ``run_async``)."""
        if self.active():
            record_run_ended(self.plugin, frame.scope.session_id, exc, blocking=sync)

    def _agent_run(self, original: Callable[..., Any], instance: Any = None) -> Callable[..., Any]:
        patches = self
        if instance is None:

            @functools.wraps(original)
            def run(self: Any, *args: Any, **kwargs: Any) -> Any:
                with patches._agent_scope(self, kwargs, True):
                    return original(self, *args, **kwargs)

            return run

        @functools.wraps(original)
        def run_bound(*args: Any, **kwargs: Any) -> Any:
            with patches._agent_scope(instance, kwargs, True):
                return original(*args, **kwargs)

        return run_bound

    def _agent_run_async(
        self, original: Callable[..., Any], instance: Any = None
    ) -> Callable[..., Any]:
        patches = self
        if instance is None:

            @functools.wraps(original)
            async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                with patches._agent_scope(self, kwargs, False):
                    return await original(self, *args, **kwargs)

            return run_async

        @functools.wraps(original)
        async def run_async_bound(*args: Any, **kwargs: Any) -> Any:
            with patches._agent_scope(instance, kwargs, False):
                return await original(*args, **kwargs)

        return run_async_bound

    def _hook_agent(self, agent: Any) -> None:
        hooks = agent.hooks
        if not isinstance(hooks, dict):
            return
        with self._lock:
            created = AFTER_TOOL not in hooks
            after = hooks.setdefault(AFTER_TOOL, [])
            if not any(h is self.hook for h in after):
                after.append(self.hook)
                self._hooked[id(agent)] = (weakref.ref(agent), created)

    def _unhook_agents(self) -> None:
        with self._lock:
            agents = [(ref(), created) for ref, created in self._hooked.values()]
            self._hooked.clear()
        for agent, created in agents:
            if agent is None or not isinstance(agent.hooks, dict):
                continue
            after = agent.hooks.get(AFTER_TOOL)
            if after is None:
                continue
            after[:] = [h for h in after if h is not self.hook]
            if not after and created:
                del agent.hooks[AFTER_TOOL]

    def _to_dict(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def to_dict(self: Any) -> dict[str, Any]:
            data: dict[str, Any] = original(self)
            params = data.get("init_parameters")
            hooks = params.get("hooks") if isinstance(params, dict) else None
            if isinstance(params, dict) and isinstance(hooks, dict):
                kept = {
                    point: [
                        h
                        for h in listed
                        if not (isinstance(h, dict) and h.get("type") == HOOK_TYPE)
                    ]
                    for point, listed in hooks.items()
                }
                kept = {point: listed for point, listed in kept.items() if listed}
                params["hooks"] = kept or None
            return data

        return to_dict
