"""ce.core.otel: the engine's events as OpenTelemetry spans, read back from the SDK's
in-memory exporter."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import BudgetExceededError
from ce.core.events import Event
from ce.core.otel import EngineTracer
from ce.core.pipeline import LlmRequest, LlmResponse
from ce.core.primitives import SequentialIdGenerator
from ce.core.schema import Message, ModelInvocation, Role
from ce.core.stores import MemoryStore

INV = ModelInvocation(provider="openai", model="gpt-4o")
WORDS = "The quarterly numbers moved in every region and the team wrote it all down. "


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


class FailingAdapter:
    async def generate(self, request: LlmRequest) -> LlmResponse:
        raise TimeoutError("summary model timed out")


def _engine(budget: int, **kwargs: Any) -> ContextEngine:
    return ContextEngine(
        MemoryStore(),
        config=RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=50),
            **kwargs.pop("config", {}),
        ),
        id_generator=SequentialIdGenerator("id"),
        **kwargs,
    )


async def _chat(engine: ContextEngine, turns: int) -> None:
    for i in range(turns):
        await engine.prepare_turn("s1", f"question {i}: {WORDS * 3}")
        await engine.commit_assistant_message(
            "s1", Message(role=Role.ASSISTANT, content=f"answer {i}: {WORDS * 3}", invocation=INV)
        )


def _prepare_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("ce prepare")]


async def test_a_prepared_call_is_one_span_with_the_reports_figures(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    engine = _engine(400)
    tracing = EngineTracer(provider).attach(engine.events)
    await _chat(engine, 4)
    exporter.clear()
    app = provider.get_tracer("app")
    with app.start_as_current_span("agent step") as parent:
        result = await engine.prepare_turn("s1", "Mail the summary to jane@example.com please")
    report = result.report
    (span,) = _prepare_spans(exporter)
    attrs = dict(span.attributes or {})

    assert span.name == "ce prepare_turn"
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    assert attrs["gen_ai.conversation.id"] == "s1"
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert attrs["ce.turn.id"] == report.turn_id
    assert attrs["ce.turn.kind"] == "turn"
    assert attrs["ce.budget.input_tokens"] == report.token_budget == 350
    assert attrs["ce.tokens.used"] == report.token_used
    assert attrs["ce.parts"] == len(result.assembled_input.parts)
    dropped = sum(d.block_count for d in report.prune_decisions if d.action == "dropped")
    assert dropped > 0  # the budget is too small for the whole conversation
    assert attrs["ce.blocks.dropped"] == dropped
    assert attrs["ce.tokens.dropped"] == sum(
        d.token_estimate for d in report.prune_decisions if d.action == "dropped"
    )
    assert attrs["ce.redactions"] == 1
    assert attrs["ce.redaction.rules"] == ("email",)
    # not a model call: the framework's own instrumentation counts the model's tokens
    assert not [k for k in attrs if k.startswith("gen_ai.usage.")]
    assert "gen_ai.operation.name" not in attrs
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time <= span.end_time
    tracing.detach()


async def test_degradations_of_a_call_are_events_of_its_span_not_of_the_parent(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    summary = {"trigger_message_count": 6, "preserve_recent_messages": 2}
    engine = _engine(8000, llm_adapter=FailingAdapter(), config={"summary": summary})
    EngineTracer(provider).attach(engine.events)
    await _chat(engine, 5)
    exporter.clear()
    with provider.get_tracer("app").start_as_current_span("agent step"):
        result = await engine.prepare_turn("s1", "and now?")
    assert any(d.startswith("summarize_failed") for d in result.report.degradations)
    (span,) = _prepare_spans(exporter)
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    assert ("ce.degradation", "summarize_failed") in [
        (name, a["ce.degradation.reason"]) for name, a in events
    ]
    assert dict(span.attributes or {})["ce.degradation.reasons"] == ("summarize_failed",)
    (parent,) = [s for s in exporter.get_finished_spans() if s.name == "agent step"]
    assert list(parent.events) == []  # reported once, on the prepare span


async def test_a_budget_that_cannot_hold_the_must_blocks_is_an_error_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    engine = _engine(60)
    EngineTracer(provider).attach(engine.events)
    with pytest.raises(BudgetExceededError):
        await engine.prepare_turn("s1", WORDS * 20)
    (span,) = exporter.get_finished_spans()
    assert span.name == "ce prepare"
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["ce.error"]
    assert dict(span.attributes or {})["gen_ai.conversation.id"] == "s1"


def test_a_degradation_outside_a_prepared_call_goes_to_the_current_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = EngineTracer(provider)
    loose = Event("Degraded", "s1", payload={"reason": "integration_failed", "detail": "boom"})
    with provider.get_tracer("app").start_as_current_span("llm call"):
        tracing(loose)
        tracing(Event("Degraded", "s1", payload={"reason": "x", "detail": "y", "prepare": True}))
    (llm,) = exporter.get_finished_spans()
    (event,) = llm.events  # the prepared call's own degradation is left to its span
    assert event.name == "ce.degradation"
    assert dict(event.attributes or {})["ce.degradation.reason"] == "integration_failed"

    exporter.clear()
    tracing(loose)  # no span is current: a short span of its own
    (own,) = exporter.get_finished_spans()
    assert own.name == "ce degraded"
    assert [e.name for e in own.events] == ["ce.degradation"]


async def test_detach_stops_the_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    engine = _engine(8000)
    tracing = EngineTracer(provider).attach(engine.events)
    tracing.attach(engine.events)  # attaching twice subscribes once
    await engine.prepare_turn("s1", "hello")
    assert len(_prepare_spans(exporter)) == 1
    tracing.detach()
    await engine.prepare_turn("s1", "hello again")
    assert len(_prepare_spans(exporter)) == 1


def test_the_module_imports_without_opentelemetry_and_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [n for n in sys.modules if n.startswith(("opentelemetry", "ce.core.otel"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    otel = importlib.import_module("ce.core.otel")
    with pytest.raises(ImportError, match=r"pip install 'ce-core\[otel\]'"):
        otel.EngineTracer()
