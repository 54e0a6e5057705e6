"""The plugin's Haystack tracer, chained to the tracer the app enabled before.

Haystack has one global tracer slot (``haystack.tracing.tracer.actual_tracer``, set by
``enable_tracing``). While installed, that attribute reads as the plugin's
:class:`ChainedTracer` (:func:`slot`, a property on ``ProxyTracer``), and the app's own tracer
stays where ``enable_tracing`` puts it, in the proxy's ``__dict__``, also when the app enables
it after ``install()``. For every operation the chained tracer opens the app's span (with the
app's parent span, so the app's trace tree is unchanged) and forwards every tag to it: plain
tags as they are, content tags through the app's span's own ``set_content_tag``, which keeps
honouring ``HAYSTACK_CONTENT_TRACING_ENABLED``. The plugin's span keeps the content for
itself, so the global content flag is never turned on (that would send prompts to the app's
tracer too). ``uninstall()`` removes the property: the attribute is the app's tracer again.

Imported only by ``install()``: it needs Haystack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any

from haystack.tracing.tracer import NullTracer, Span, Tracer

__all__ = ["ChainedSpan", "ChainedTracer", "slot"]

Observer = Callable[["ChainedSpan"], AbstractContextManager[None]]
"""What the plugin does around a span (binding run frames, recording on exit)."""


class ChainedSpan(Span):
    """A span of the plugin: its tags (content included) for the plugin, every tag forwarded
    to the app's own span ``inner`` (``None``: the app had no tracer)."""

    def __init__(self, operation_name: str, tags: dict[str, Any], inner: Span | None) -> None:
        self.operation_name = operation_name
        self.tags = tags
        self.inner = inner

    def set_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value
        if self.inner is not None:
            self.inner.set_tag(key, value)

    def set_content_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value
        if self.inner is not None:
            self.inner.set_content_tag(key, value)

    def raw_span(self) -> Any:
        return self.inner.raw_span() if self.inner is not None else self

    def get_correlation_data_for_logs(self) -> dict[str, Any]:
        return self.inner.get_correlation_data_for_logs() if self.inner is not None else {}


class ChainedTracer(Tracer):
    """Opens the app's span (the tracer ``app()`` returns now) and the plugin's around every
    operation; the plugin's ``observer`` runs around each of the plugin's spans."""

    def __init__(self, app: Callable[[], Any], observer: Observer) -> None:
        self.app = app
        self.observer = observer
        self._current: ContextVar[ChainedSpan | None] = ContextVar("ce_haystack_span", default=None)

    @contextlib.contextmanager
    def trace(
        self,
        operation_name: str,
        tags: dict[str, Any] | None = None,
        parent_span: Span | None = None,
    ) -> Iterator[Span]:
        parent = parent_span if parent_span is not None else self._current.get()
        inner_parent = parent.inner if isinstance(parent, ChainedSpan) else parent
        app = self.app()
        with contextlib.ExitStack() as stack:
            inner = None
            if isinstance(app, Tracer) and not isinstance(app, NullTracer):
                inner = stack.enter_context(
                    app.trace(operation_name, tags=tags, parent_span=inner_parent)
                )
            span = ChainedSpan(operation_name, dict(tags or {}), inner)
            token = self._current.set(span)
            stack.callback(_reset, self._current, token)
            stack.enter_context(self.observer(span))
            yield span

    def current_span(self) -> Span | None:
        return self._current.get()


def _reset(var: ContextVar[Any], token: Any) -> None:
    with contextlib.suppress(ValueError):  # a generator closed in another context
        var.reset(token)


def slot(proxy: Any, observer: Observer) -> property:
    """The ``actual_tracer`` property ``ProxyTracer`` gets while installed: ``proxy`` (the
    global one) reads as a :class:`ChainedTracer` chained to the tracer in its ``__dict__``;
    setting it (``enable_tracing``, ``disable_tracing``) sets that one."""
    chained = ChainedTracer(lambda: vars(proxy).get("actual_tracer"), observer)

    def get(self: Any) -> Any:
        return chained if self is proxy else vars(self).get("actual_tracer")

    def set_(self: Any, value: Any) -> None:
        vars(self)["actual_tracer"] = value

    return property(get, set_, doc="The tracer spans go to (chained by ce-haystack).")
