"""Seed 004 §18.2, row by row: each failure degrades as specified and emits its event; and the
redaction canary: secrets never reach the store's bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ce.core.config import RedactionRules, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import RedactionError, VersionConflictError
from ce.core.events import Event, InMemoryEventBus
from ce.core.pipeline import LlmRequest, LlmResponse
from ce.core.primitives import SequentialIdGenerator, SteppingClock
from ce.core.redaction import RegexRedactor
from ce.core.schema import (
    BlockType,
    ContextBlock,
    EvidenceSource,
    EvidenceType,
    Message,
    ModelInvocation,
    ModelUsage,
    Priority,
    Ref,
    Role,
    SourceKind,
    ToolCall,
    ToolCallRequest,
    ToolProvider,
)
from ce.core.stores import MemoryStore, SQLiteStore
from ce.core.tokens import CharBasedEstimator

INV = ModelInvocation(provider="openai", model="gpt-4o")
RAG = EvidenceSource(kind=SourceKind.RAG, name="kb", uri="kb://doc")


class Recorder:
    def __init__(self) -> None:
        self.bus = InMemoryEventBus()
        self.events: list[Event] = []
        self.bus.on_all(self.events.append)

    def reasons(self, event_type: str) -> list[str]:
        return [e.payload.get("reason", "") for e in self.events if e.event_type == event_type]


def engine_with(recorder: Recorder, store: Any = None, **kwargs: Any) -> ContextEngine:
    kwargs.setdefault("config", RuntimeConfig(model_hint="gpt-4o"))
    kwargs.setdefault("id_generator", SequentialIdGenerator("id"))
    return ContextEngine(
        store or MemoryStore(), event_bus=recorder.bus, clock=SteppingClock(), **kwargs
    )


class FailingRedactor(RegexRedactor):
    def redact_text(self, text: str) -> Any:
        raise RedactionError("the PII service is down")

    def redact_value(self, value: Any) -> Any:
        raise RedactionError("the PII service is down")


async def test_row_ingestor_redaction_failed() -> None:
    rec = Recorder()
    engine = engine_with(rec, redactor=FailingRedactor())
    evidence = await engine.ingest_evidence("s", "mail bob@example.com", RAG, EvidenceType.RAG_DOC)
    assert "redaction_failed" in rec.reasons("Degraded")
    assert evidence.metadata["has_sensitive"] is True
    assert evidence.content == "mail bob@example.com"  # stored as given, flagged


class FailingHasher:
    def digest(self, content: str) -> str:
        raise OSError("hash backend unavailable")


async def test_row_ingestor_dedup_skipped() -> None:
    rec = Recorder()
    engine = engine_with(rec, hasher=FailingHasher())
    first = await engine.ingest_evidence("s", "same text", RAG, EvidenceType.RAG_DOC)
    second = await engine.ingest_evidence("s", "same text", RAG, EvidenceType.RAG_DOC)
    assert rec.reasons("Degraded") == ["dedup_skipped", "dedup_skipped"]
    assert first.evidence_id != second.evidence_id  # written normally, without dedup


class PoisonEstimator(CharBasedEstimator):
    def estimate_text(self, text: str, model_hint: str | None = None) -> int:
        if "POISON" in text:
            raise ValueError("cannot count this")
        return super().estimate_text(text, model_hint)


async def test_row_deriver_one_evidence_fails() -> None:
    rec = Recorder()
    engine = engine_with(rec, token_estimator=PoisonEstimator())
    await engine.ingest_evidence("s", "POISON pill", RAG, EvidenceType.RAG_DOC)
    await engine.ingest_evidence(
        "s", "healthy doc", EvidenceSource(kind=SourceKind.RAG, uri="kb://2"), EvidenceType.RAG_DOC
    )
    result = await engine.prepare_turn("s", "question")
    assert "evidence_derive_failed" in rec.reasons("Error")
    system = result.assembled_input.parts[0].content
    assert "healthy doc" in system and "POISON" not in system


async def test_row_renderer_selector_failed_falls_back_to_block_content() -> None:
    rec = Recorder()
    engine = engine_with(rec)
    evidence = await engine.ingest_evidence("s", "line one\nline two", RAG, EvidenceType.RAG_DOC)
    await engine.put_context_block(
        "s",
        ContextBlock(
            block_id="policy",
            block_type=BlockType.INSTRUCTION,
            priority=Priority.HIGH,
            content="Refund policy applies.",
            refs=[Ref(evidence_id=evidence.evidence_id, selector="lines:40-50")],
        ),
    )
    result = await engine.prepare_turn("s", "refund?")
    assert "selector_resolve_failed" in rec.reasons("Degraded")
    assert "Refund policy applies." in result.assembled_input.parts[0].content
    assert any("selector_resolve_failed" in d for d in result.report.degradations)


async def test_row_renderer_evidence_not_found() -> None:
    rec = Recorder()
    engine = engine_with(rec)
    await engine.put_context_block(
        "s",
        ContextBlock(
            block_id="cites-missing",
            block_type=BlockType.PLAN,
            priority=Priority.HIGH,
            content="Plan: check the doc.",
            refs=[Ref(evidence_id="no-such-evidence")],
        ),
    )
    result = await engine.prepare_turn("s", "go")
    assert "evidence_not_found" in rec.reasons("Degraded")
    assert "Plan: check the doc." in result.assembled_input.parts[0].content


class FailingAdapter:
    async def generate(self, request: LlmRequest) -> LlmResponse:
        raise TimeoutError("summary model timed out")


class ScriptedAdapter:
    def __init__(self) -> None:
        self.requests: list[LlmRequest] = []

    async def generate(self, request: LlmRequest) -> LlmResponse:
        self.requests.append(request)
        return LlmResponse(
            content=f"summary #{len(self.requests)}",
            model="summarizer-mini",
            provider="scripted",
            prompt_tokens=50,
            completion_tokens=5,
            total_tokens=55,
        )


def summary_config() -> RuntimeConfig:
    return RuntimeConfig(
        model_hint="gpt-4o",
        summary={"trigger_message_count": 6, "preserve_recent_messages": 2},  # type: ignore[arg-type]
    )


async def chat(engine: ContextEngine, turns: int) -> None:
    for i in range(turns):
        await engine.prepare_turn("s", f"question {i}")
        await engine.commit_assistant_message(
            "s", Message(role=Role.ASSISTANT, content=f"answer {i}", invocation=INV)
        )


async def test_row_summarizer_failed_keeps_full_messages() -> None:
    rec = Recorder()
    engine = engine_with(rec, llm_adapter=FailingAdapter(), config=summary_config())
    await chat(engine, 5)
    result = await engine.prepare_turn("s", "and now?")
    assert "summarize_failed" in rec.reasons("Degraded")
    users = [p.content for p in result.assembled_input.parts if p.role is Role.USER]
    assert users[0] == "question 0"  # nothing was summarized away


async def test_rolling_summary_records_usage_and_evidence_and_hides_old_messages() -> None:
    rec = Recorder()
    adapter = ScriptedAdapter()
    store = MemoryStore()
    engine = engine_with(rec, store, llm_adapter=adapter, config=summary_config())
    await chat(engine, 5)
    result = await engine.prepare_turn("s", "and now?")
    doc = await store.get_session("s")
    assert doc is not None and doc.session.summary is not None
    summary = doc.session.summary
    assert summary.content.startswith("summary #")
    usage = [u for u in doc.session.model_usage if u.stage.value == "summarize"]
    assert usage and usage[-1].total_tokens == 55
    llm_outputs = [e for e in doc.evidences.values() if e.type is EvidenceType.LLM_OUTPUT]
    assert llm_outputs[-1].links.model_usage_id == usage[-1].model_usage_id
    assert llm_outputs[-1].evidence_id in summary.evidence_ids
    system = result.assembled_input.parts[0].content
    assert "Summary of earlier conversation" in system
    assert any(d.reason == "covered by the rolling summary" for d in result.report.prune_decisions)
    assert "SummaryGenerated" in [e.event_type for e in rec.events]
    # incremental: the next summary starts after the previous range
    await chat(engine, 5)
    assert "summary #1" in adapter.requests[-1].messages[-1].content


async def test_row_version_conflicts_are_retried_then_raised() -> None:
    rec = Recorder()
    store = MemoryStore()
    engine = engine_with(rec, store)
    await engine.prepare_turn("s", "first")
    real_commit = store.commit
    failures = {"left": 1}

    async def flaky(session_id: str, changes: Any, expected_version: Any = None) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise VersionConflictError(session_id, expected_version, 99)
        return await real_commit(session_id, changes, expected_version)

    store.commit = flaky  # type: ignore[method-assign]
    result = await engine.prepare_turn("s", "second")
    assert rec.reasons("Error") == ["version_conflict"]
    assert any("version_conflict" in e for e in result.report.errors)
    doc = await store.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == ["first", "second"]
    # more conflicts in a row: retried up to conflict_retries (4) times, then raised
    failures["left"] = 4
    await engine.prepare_turn("s", "third")
    failures["left"] = 5
    with pytest.raises(VersionConflictError):
        await engine.prepare_turn("s", "fourth")
    doc = await store.get_session("s")
    assert doc is not None
    assert [m.content for m in doc.session.messages] == ["first", "second", "third"]
    once = engine_with(
        Recorder(), store, conflict_retries=1, id_generator=SequentialIdGenerator("once")
    )  # the seed's retry once
    failures["left"] = 2
    with pytest.raises(VersionConflictError):
        await once.prepare_turn("s", "fifth")
    with pytest.raises(ValueError, match="conflict_retries"):
        engine_with(Recorder(), store, conflict_retries=-1)


async def test_another_writer_is_seen_before_the_next_turn(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    a = engine_with(Recorder(), SQLiteStore(path))
    b = engine_with(Recorder(), SQLiteStore(path), id_generator=SequentialIdGenerator("b"))
    await a.prepare_turn("s", "from a")
    await b.prepare_turn("s", "from b")
    result = await a.prepare_turn("s", "a again")
    users = [p.content for p in result.assembled_input.parts if p.role is Role.USER]
    assert users == ["from a", "from b", "a again"]


# -- the canary ---------------------------------------------------------------------------

SECRETS = {
    "email": "alice.canary@example.com",
    "phone": "+1 415-555-0132",
    "payment_card": "4111 1111 1111 1111",
    "ipv4": "203.0.113.77",
    "ipv6": "2001:db8:85a3::8a2e:370:7334",
    "api_key": "sk-proj-CANARYabcdefghijklmnop1234567890",
    "bearer_token": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnQ0FOQVJZc2ln",
}
CUSTOM = "ACME-CANARY-7781"
LITERAL = "project bluebird canary"


async def test_canary_secrets_never_reach_the_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "canary.db"
    config = RuntimeConfig(
        model_hint="gpt-4o",
        redaction={  # type: ignore[arg-type]
            "rules": RedactionRules(
                patterns=(r"internal_id=ACME-[A-Z]+-\d+",), dictionaries=(LITERAL,)
            )
        },
    )
    engine = engine_with(Recorder(), SQLiteStore(path), config=config)
    blob = " | ".join([*SECRETS.values(), f"internal_id={CUSTOM}", LITERAL])
    await engine.set_system_instruction("s", f"System note: {blob}")
    await engine.prepare_turn("s", f"my details: {blob}")
    await engine.commit_assistant_message(
        "s",
        Message(
            role=Role.ASSISTANT,
            content=f"echo {blob}",
            invocation=INV,
            tool_calls=[
                ToolCallRequest(
                    tool_call_id="c1",
                    name="crm_lookup",
                    raw_arguments='{{"email": "{}", "note": "{}"}}'.format(
                        SECRETS["email"], SECRETS["api_key"]
                    ),
                )
            ],
        ),
    )
    await engine.record_tool_call(
        "s",
        ToolCall(
            tool_call_id="c1",
            tool="crm_lookup",
            provider=ToolProvider(kind="builtin"),
            args_digest={"email": SECRETS["email"], "ip": SECRETS["ipv4"]},
        ),
    )
    history = [
        Message(role=Role.USER, content=f"my details: {blob}"),
        Message(
            role=Role.ASSISTANT,
            content=f"echo {blob}",
            invocation=INV,
            tool_calls=[ToolCallRequest(tool_call_id="c1", name="crm_lookup")],
        ),
        Message(role=Role.TOOL, tool_call_id="c1", name="crm_lookup", content=f"found {blob}"),
    ]
    result = await engine.prepare_call("s", history)
    await engine.ingest_evidence(
        "s", f"doc with {blob}", RAG, EvidenceType.RAG_DOC, metadata={"owner": SECRETS["email"]}
    )
    await engine.record_model_usage(
        "s",
        ModelUsage(
            model_usage_id="u1",
            provider="openai",
            model="gpt-4o",
            params={"user": SECRETS["email"]},
        ),
    )
    await engine.prepare_turn("s", "final")
    await engine.close()
    await engine.store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("canary"))
    for name, secret in [*SECRETS.items(), ("custom", CUSTOM), ("dictionary", LITERAL)]:
        assert secret.encode() not in raw, f"{name} canary reached the store"
    assert b"[REDACTED:email]" in raw
    rendered = "\n".join(p.content for p in result.assembled_input.parts)
    assert SECRETS["email"] not in rendered
    assert result.report.redactions


async def test_tokenizer_unavailable_falls_back_and_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tiktoken = pytest.importorskip("tiktoken")

    def unavailable(name: str) -> Any:
        raise OSError(f"no cached {name} and no network")

    monkeypatch.setattr(tiktoken, "get_encoding", unavailable)
    rec = Recorder()
    engine = ContextEngine(
        MemoryStore(), event_bus=rec.bus, config=RuntimeConfig(model_hint="gpt-4o")
    )
    result = await engine.prepare_turn("s", "count me anyway")
    assert "tokenizer_unavailable" in rec.reasons("Degraded")
    assert any(d.startswith("tokenizer_unavailable") for d in result.report.degradations)
    assert 0 < result.assembled_input.total_tokens <= result.report.token_budget
