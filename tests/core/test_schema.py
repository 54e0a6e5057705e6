"""The session schema: field names of seed 004 §5.1, enum serialization, validation errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ce.core.errors import SchemaValidationError
from ce.core.schema import (
    SCHEMA_VERSION,
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    LevelOfDetail,
    LodSections,
    Message,
    MessagePart,
    ModelInvocation,
    Role,
    Section,
    SessionDocument,
    ToolCallRequest,
    document_from_json,
    document_to_json,
    dump_document,
    json_schema,
    json_schema_text,
    load_document,
)

SCHEMA_FILE = (
    Path(__file__).resolve().parents[2] / "docs" / "schema" / "session-document.schema.json"
)


def rich_document() -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "session": {
            "session_id": "s-1",
            "messages": [
                {"role": "system", "content": "Be brief.", "message_id": "m0"},
                {
                    "role": "user",
                    "content": "weather in Paris?",
                    "author": {"kind": "user", "id": "alice"},
                    "at": "2026-01-01T00:00:00+00:00",
                    "message_id": "m1",
                    "meta": {"channel": "web"},
                },
                {
                    "role": "assistant",
                    "content": "",
                    "message_id": "m2",
                    "tool_calls": [
                        {
                            "tool_call_id": "c1",
                            "name": "weather",
                            "raw_arguments": '{"city": "Paris"}',
                            "arguments": {"city": "Paris"},
                        }
                    ],
                    "invocation": {"provider": "openai", "model": "gpt-4o"},
                },
                {
                    "role": "tool",
                    "content": "18C, cloudy",
                    "tool_call_id": "c1",
                    "name": "weather",
                    "message_id": "m3",
                    "lod": {
                        "live": [{"title": "result", "body": "18C, cloudy"}],
                        "gist": [{"body": "weather fetched"}],
                    },
                    "refs": [{"evidence_id": "e1", "selector": "lines:1-1"}],
                },
            ],
            "summary": {
                "content": "greeting",
                "updated_at": "2026-01-01T00:00:00+00:00",
                "message_index_range": {"from_index": 0, "to_index": 0},
            },
            "task_state": {"todo_list": {"tasks": [{"task_id": "t1", "name": "answer"}]}},
            "tool_state": {
                "tool_calls": [
                    {
                        "tool_call_id": "c1",
                        "tool": "weather",
                        "provider": {"kind": "mcp", "name": "wx", "uri": "mcp://wx"},
                        "status": "success",
                        "duration_ms": 12,
                        "result_evidence_ids": ["e1"],
                    }
                ]
            },
            "model_usage": [
                {
                    "model_usage_id": "u1",
                    "provider": "openai",
                    "model": "gpt-4o",
                    "stage": "tool_call",
                    "prompt_tokens": 10,
                    "completion_tokens": 5,
                    "total_tokens": 15,
                }
            ],
            "run": {"run_id": "r1", "status": "tool_running"},
        },
        "evidences": {
            "e1": {
                "evidence_id": "e1",
                "type": "tool_result",
                "source": {"kind": "tool", "name": "weather"},
                "content": "18C, cloudy",
                "confidence": 0.9,
                "links": {"tool_call_id": "c1"},
            }
        },
        "context_blocks": [
            {"block_id": "b1", "block_type": "evidence", "priority": "high", "refs": []}
        ],
        "meta": {"locale": "en", "actor": {"user_id": "alice", "agent": {"agent_id": "a1"}}},
    }


def test_rich_document_round_trips_through_json() -> None:
    doc = load_document(rich_document())
    assert document_from_json(document_to_json(doc)) == doc
    assert load_document(dump_document(doc)) == doc


def test_enums_serialize_as_their_string_values() -> None:
    dumped = json.loads(document_to_json(load_document(rich_document())))
    assert dumped["session"]["messages"][2]["role"] == "assistant"
    assert dumped["session"]["tool_state"]["tool_calls"][0]["provider"]["kind"] == "mcp"
    assert dumped["session"]["model_usage"][0]["stage"] == "tool_call"
    assert dumped["session"]["run"]["status"] == "tool_running"
    assert dumped["evidences"]["e1"]["type"] == "tool_result"


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["session"]["messages"][1].update(role="robot"), "session.messages.1.role"),
        (lambda d: d["session"].pop("session_id"), "session.session_id"),
        (
            lambda d: d["session"]["model_usage"][0].update(prompt_tokens="many"),
            "session.model_usage.0.prompt_tokens",
        ),
        (lambda d: d["evidences"]["e1"].update(confidence=3), "evidences.e1.confidence"),
        (lambda d: d["session"]["messages"][0].update(colour="red"), "session.messages.0.colour"),
        (lambda d: d["context_blocks"][0].update(priority="urgent"), "context_blocks.0.priority"),
    ],
)
def test_invalid_documents_name_the_field_path(mutate: Any, path: str) -> None:
    data = rich_document()
    mutate(data)
    with pytest.raises(SchemaValidationError) as info:
        load_document(data)
    assert path in [p for p, _ in info.value.errors]
    assert path in str(info.value)


def test_document_level_id_rules() -> None:
    data = rich_document()
    data["evidences"]["other"] = data["evidences"]["e1"]
    with pytest.raises(SchemaValidationError, match="differs from its evidence_id"):
        load_document(data)
    data = rich_document()
    data["context_blocks"].append(dict(data["context_blocks"][0]))
    with pytest.raises(SchemaValidationError, match="duplicate context block id"):
        load_document(data)


def test_message_tool_structure_is_checked() -> None:
    with pytest.raises(ValueError, match="tool_call_id"):
        Message(role=Role.TOOL, content="x")
    with pytest.raises(ValueError, match="only allowed on assistant"):
        Message(
            role=Role.USER,
            content="x",
            tool_calls=[ToolCallRequest(tool_call_id="c", name="f")],
        )
    with pytest.raises(ValueError, match="only allowed on tool"):
        Message(role=Role.USER, content="x", tool_call_id="c")


def test_not_json_and_not_object_are_schema_errors() -> None:
    with pytest.raises(SchemaValidationError, match="not valid JSON"):
        document_from_json("{nope")
    with pytest.raises(SchemaValidationError, match="JSON object"):
        load_document([1, 2])  # type: ignore[arg-type]


def test_level_of_detail_falls_back_to_richer_levels() -> None:
    lod = LodSections(live=[Section(title="full", body="all the details")])
    assert lod.get(LevelOfDetail.GIST) == lod.live
    lod = LodSections(live=[Section(body="L")], summary=[Section(body="S")])
    assert lod.get(LevelOfDetail.GIST)[0].body == "S"
    msg = Message(
        role=Role.TOOL,
        content="full text",
        tool_call_id="c",
        lod=LodSections(live=[Section(body="full text")], gist=[Section(title="t", body="g")]),
    )
    assert msg.text_at(LevelOfDetail.LIVE) == "full text"
    assert msg.text_at(LevelOfDetail.SUMMARY) == "full text"
    assert msg.text_at(LevelOfDetail.GIST) == "t\ng"


def test_message_part_keeps_tool_call_structure() -> None:
    part = MessagePart(
        role=Role.ASSISTANT,
        content="",
        tool_calls=[ToolCallRequest(tool_call_id="c1", name="f", raw_arguments="{}")],
    )
    assert MessagePart.model_validate_json(part.model_dump_json()) == part
    tool = MessagePart(role=Role.TOOL, content="ok", tool_call_id="c1", name="f")
    assert tool.tool_call_id == "c1"


def test_seed_field_names_are_present() -> None:
    """Every field seed 004 §5.1 names exists with that name."""
    expected = {
        Message: {"role", "content", "author", "at", "refs"},
        Evidence: {"evidence_id", "type", "source", "content", "confidence", "metadata", "links"},
        EvidenceSource: {"kind", "name", "uri"},
        EvidenceLinks: {"model_usage_id", "tool_call_id"},
        ContextBlock: {"block_id", "block_type", "priority", "token_estimate", "content", "refs"},
        SessionDocument: {"schema_version", "session", "evidences", "context_blocks", "meta"},
        ModelInvocation: {"provider", "model"},
    }
    for model, names in expected.items():
        assert names <= set(model.model_fields), model.__name__


def test_json_schema_file_is_current() -> None:
    """docs/schema is generated; regenerate with ``python3 -m nox -s schema``."""
    assert SCHEMA_FILE.read_text(encoding="utf-8") == json_schema_text(), (
        "docs/schema/session-document.schema.json is stale: run `python3 -m nox -s schema`"
    )
    schema = json_schema()
    assert schema["x-schema-version"] == SCHEMA_VERSION
    assert schema["properties"]["session"]["$ref"] == "#/$defs/Session"
