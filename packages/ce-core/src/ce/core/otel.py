"""OpenTelemetry traces of what the engine did (extra ``ce-core[otel]``).

:class:`EngineTracer` subscribes to an engine's event bus and turns its events into spans:

- one span per ``prepare_turn`` / ``prepare_call`` (``ce prepare_turn`` / ``ce prepare_call``,
  kind INTERNAL), a child of the span current where the call ran (a framework's agent or
  chain span, say), from the call's start to its end. Attributes follow the OpenTelemetry
  GenAI semantic conventions where one means the same thing (``gen_ai.conversation.id``: the
  session; ``gen_ai.request.model``: the model hint), and use the ``ce.`` prefix otherwise:
  ``ce.turn.id``, ``ce.turn.kind``, ``ce.budget.input_tokens``, ``ce.tokens.used``,
  ``ce.tokens.kept``, ``ce.tokens.dropped``, ``ce.tokens.saved_by_degrading``,
  ``ce.blocks.kept`` / ``.degraded`` / ``.dropped``, ``ce.parts``, ``ce.evidence.new``,
  ``ce.degradations``, ``ce.degradation.reasons``, ``ce.conflicts``, ``ce.errors``,
  ``ce.redactions`` (fields redacted), ``ce.redaction.rules``. Each degradation, conflict and
  error of the call is a span event (``ce.degradation``, ``ce.conflict``, ``ce.error``).
- a call whose budget cannot hold its must-keep blocks ends its span with status ERROR.
- a degradation or error outside a prepared call (recording a reply, a tool run, a failed
  hook) is an event on the current span, or a short span of its own when none is recording.

The prepare span never carries ``gen_ai.usage.*`` nor ``gen_ai.operation.name``: it is not a
model call. The model call's tokens stay on the span the framework's own instrumentation
(OpenInference, Langfuse, OpenLLMetry) makes for it, so nothing is counted twice; ce's
counts are its estimate of the input it assembled, under ``ce.tokens.*``.

This module imports without OpenTelemetry; :class:`EngineTracer` raises :class:`ImportError`
naming the extra when ``opentelemetry-api`` is not installed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ce.core.events import Event, EventBus
from ce.core.schema import Report

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = ["INSTALL_HINT", "TRACER_NAME", "EngineTracer"]

INSTALL_HINT = "pip install 'ce-core[otel]'"
TRACER_NAME = "ce.core"

_MUST_EXCEEDED = "must_exceeded_budget"


def _trace_api() -> Any:
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError(f"ce.core.otel needs opentelemetry-api: {INSTALL_HINT}") from exc
    return trace


class EngineTracer:
    """An event handler that writes the engine's events as OpenTelemetry spans (see the module
    docstring for what each span holds).

    ``tracer_provider``: where the spans go (default: the global one, as set by the app or by
    ``opentelemetry-instrument``). Attach it to an engine's bus with :meth:`attach` (or pass
    it to ``bus.on_all``); :meth:`detach` removes it from every bus it was attached to.
    Raises :class:`ImportError` naming ``ce-core[otel]`` when OpenTelemetry is missing.
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        trace = _trace_api()
        self._trace = trace
        self._tracer: Tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self._buses: list[EventBus] = []

    def attach(self, bus: EventBus) -> EngineTracer:
        """Subscribe to every event of ``bus`` (an engine's ``events``); returns ``self``."""
        if not any(b is bus for b in self._buses):
            bus.on_all(self)
            self._buses.append(bus)
        return self

    def detach(self) -> None:
        """Unsubscribe from every bus :meth:`attach` subscribed to."""
        while self._buses:
            self._buses.pop().off("*", self)

    def __call__(self, event: Event) -> None:
        kind = event.event_type
        if kind == "Assembled" and isinstance(event.payload.get("report"), Report):
            self._prepared(event)
        elif kind == "Error" and event.payload.get("reason") == _MUST_EXCEEDED:
            self._failed_prepare(event)
        elif kind in ("Degraded", "Error") and not event.payload.get("prepare"):
            self._loose(event)
        # ConflictDetected and the prepared call's own degradations and errors are in its
        # report: they become events of its span

    # -- spans ------------------------------------------------------------------------------

    def _prepared(self, event: Event) -> None:
        payload = event.payload
        report: Report = payload["report"]
        call_kind = "turn" if payload.get("kind") == "turn" else "call"
        attributes = _base_attributes(event, call_kind, payload.get("model_hint"))
        attributes.update(_report_attributes(report, payload.get("parts")))
        span = self._tracer.start_span(
            f"ce prepare_{call_kind}",
            kind=self._trace.SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_start(payload),
        )
        for text in report.degradations:
            reason, _, detail = text.partition(": ")
            span.add_event(
                "ce.degradation", {"ce.degradation.reason": reason, "ce.degradation.detail": detail}
            )
        for conflict in report.conflicts:
            span.add_event(
                "ce.conflict",
                {
                    "ce.conflict.field_path": conflict.field_path,
                    "ce.conflict.evidence_ids": list(conflict.evidence_ids),
                    "ce.conflict.resolution": conflict.resolution,
                },
            )
        for text in report.errors:
            reason, _, detail = text.partition(": ")
            span.add_event("ce.error", {"ce.error.reason": reason, "ce.error.detail": detail})
        span.end()

    def _failed_prepare(self, event: Event) -> None:
        detail = str(event.payload.get("detail", ""))
        span = self._tracer.start_span(
            "ce prepare",
            kind=self._trace.SpanKind.INTERNAL,
            attributes=_base_attributes(event, None, None),
        )
        span.add_event("ce.error", {"ce.error.reason": _MUST_EXCEEDED, "ce.error.detail": detail})
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, detail[:200]))
        span.end()

    def _loose(self, event: Event) -> None:
        name = "ce.degradation" if event.event_type == "Degraded" else "ce.error"
        attributes: dict[str, Any] = {
            f"{name}.reason": str(event.payload.get("reason", "")),
            f"{name}.detail": str(event.payload.get("detail", "")),
            "gen_ai.conversation.id": event.session_id,
        }
        attributes.update({f"ce.tag.{key}": value for key, value in event.tags.items()})
        current: Span = self._trace.get_current_span()
        if current.is_recording():
            current.add_event(name, attributes)
            return
        span = self._tracer.start_span(
            "ce degraded" if name == "ce.degradation" else "ce error",
            kind=self._trace.SpanKind.INTERNAL,
            attributes=_base_attributes(event, None, None),
        )
        span.add_event(name, attributes)
        span.end()


def _start(payload: dict[str, Any]) -> int | None:
    started = payload.get("started_ns")
    return started if isinstance(started, int) and 0 < started <= time.time_ns() else None


def _base_attributes(event: Event, call_kind: str | None, model_hint: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {"gen_ai.conversation.id": event.session_id}
    if event.turn_id:
        attributes["ce.turn.id"] = event.turn_id
    if call_kind:
        attributes["ce.turn.kind"] = call_kind
    if isinstance(model_hint, str) and model_hint:
        attributes["gen_ai.request.model"] = model_hint
    return attributes


def _report_attributes(report: Report, parts: Any) -> dict[str, Any]:
    decisions = report.prune_decisions
    kept = [d for d in decisions if d.action != "dropped"]
    dropped = [d for d in decisions if d.action == "dropped"]
    reasons = sorted({text.partition(": ")[0] for text in report.degradations})
    rules = sorted({rule for r in report.redactions for rule in r.rules_applied})
    attributes: dict[str, Any] = {
        "ce.budget.input_tokens": report.token_budget,
        "ce.tokens.used": report.token_used,
        "ce.tokens.kept": sum(d.token_estimate for d in kept),
        "ce.tokens.dropped": sum(d.token_estimate for d in dropped),
        "ce.tokens.saved_by_degrading": sum(
            d.saved_tokens for d in decisions if d.action == "degraded"
        ),
        "ce.blocks.kept": sum(d.block_count for d in decisions if d.action == "kept"),
        "ce.blocks.degraded": sum(d.block_count for d in decisions if d.action == "degraded"),
        "ce.blocks.dropped": sum(d.block_count for d in dropped),
        "ce.evidence.new": len(report.new_evidence_ids),
        "ce.degradations": len(report.degradations),
        "ce.conflicts": len(report.conflicts),
        "ce.errors": len(report.errors),
        "ce.redactions": sum(r.fields_redacted for r in report.redactions),
    }
    if isinstance(parts, int):
        attributes["ce.parts"] = parts
    if reasons:
        attributes["ce.degradation.reasons"] = reasons
    if rules:
        attributes["ce.redaction.rules"] = rules
    return attributes
