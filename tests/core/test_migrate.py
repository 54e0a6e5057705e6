"""Migrating the 0.9 pre-release layout to the current schema, and refusing unknown versions."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ce.core.errors import MigrationError
from ce.core.schema import (
    SCHEMA_VERSION,
    EvidenceType,
    Migrator,
    ProviderKind,
    ToolCallStatus,
    load_document,
)


def old_document() -> dict[str, Any]:
    return {
        "schema_version": "0.9",
        "session_id": "legacy-1",
        "messages": [
            {"role": "user", "content": "find the invoice", "ts": "2025-05-01T10:00:00Z"},
            {"role": "assistant", "content": "found it", "ts": "2025-05-01T10:00:05Z"},
        ],
        "tool_calls": [
            {
                "id": "call-1",
                "name": "search_invoices",
                "args": {"q": "invoice 42"},
                "status": "error",
                "duration_ms": 40,
            }
        ],
        "usage": [
            {
                "id": "u-1",
                "provider": "openai",
                "model": "gpt-4o-mini",
                "prompt_tokens": 120,
                "completion_tokens": 30,
            }
        ],
        "evidences": [
            {
                "id": "ev-1",
                "type": "rag_doc",
                "source": {"kind": "rag", "uri": "s3://docs/invoice-42.pdf"},
                "content": "Invoice 42: 100 EUR",
            }
        ],
        "blocks": [{"block_id": "b-1", "block_type": "instruction", "priority": "must"}],
        "meta": {"locale": "de"},
    }


def test_old_layout_is_upgraded_with_a_change_log() -> None:
    original = old_document()
    snapshot = copy.deepcopy(original)
    result = Migrator().migrate(original, "0.9")
    assert original == snapshot, "migrate must not modify its input"
    assert (result.from_version, result.to_version) == ("0.9", SCHEMA_VERSION)
    doc = result.doc
    assert doc.schema_version == SCHEMA_VERSION
    assert doc.session.session_id == "legacy-1"
    assert [m.at for m in doc.session.messages] == ["2025-05-01T10:00:00Z", "2025-05-01T10:00:05Z"]
    call = doc.session.tool_state.tool_calls[0]
    assert (call.tool_call_id, call.tool, call.args_digest) == (
        "call-1",
        "search_invoices",
        {"q": "invoice 42"},
    )
    assert call.status is ToolCallStatus.ERROR
    assert call.provider.kind is ProviderKind.BUILTIN
    usage = doc.session.model_usage[0]
    assert (usage.model_usage_id, usage.total_tokens) == ("u-1", 150)
    assert doc.evidences["ev-1"].type is EvidenceType.RAG_DOC
    assert doc.context_blocks[0].block_id == "b-1"
    assert doc.meta is not None and doc.meta.locale == "de"
    joined = "\n".join(result.changes)
    for fragment in ("ts to messages[].at", "tool_state.tool_calls", "model_usage", "mapping"):
        assert fragment in joined


def test_load_document_migrates_transparently() -> None:
    doc = load_document(old_document())
    assert doc.schema_version == SCHEMA_VERSION
    assert list(doc.evidences) == ["ev-1"]


@pytest.mark.parametrize("version", ["0.1", "2.0", "None", ""])
def test_unknown_versions_are_refused(version: str) -> None:
    migrator = Migrator()
    assert not migrator.can_migrate(version)
    with pytest.raises(MigrationError, match="cannot migrate"):
        migrator.migrate({"schema_version": version}, version)
    with pytest.raises(MigrationError):
        load_document({"schema_version": version, "session": {"session_id": "x"}})


def test_current_version_needs_no_steps() -> None:
    migrator = Migrator()
    assert migrator.current_version() == SCHEMA_VERSION
    assert migrator.can_migrate(SCHEMA_VERSION)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("session_id"), "session_id"),
        (lambda d: d.update(evidences={"ev-1": {}}), "must be a list"),
        (lambda d: d["tool_calls"][0].pop("name"), "lacks 'name'"),
        (lambda d: d.update(extra_field=1), "unknown top-level keys"),
        (lambda d: d["messages"][0].update(role="robot"), "invalid"),
    ],
)
def test_malformed_old_documents_raise_migration_error(mutate: Any, message: str) -> None:
    data = old_document()
    mutate(data)
    with pytest.raises(MigrationError, match=message):
        Migrator().migrate(data, "0.9")
