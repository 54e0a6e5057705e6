"""Records for store tests: small factories and a change set that uses the whole schema."""

from __future__ import annotations

from typing import Any, Literal

from ce.core.schema import (
    SCHEMA_VERSION,
    Actor,
    AgentInfo,
    Author,
    AuthorKind,
    BlockType,
    ConflictRecord,
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    LodSections,
    Message,
    MessageIndexRange,
    Meta,
    ModelInvocation,
    ModelUsage,
    ModelUsageStage,
    Priority,
    ProviderKind,
    PruneDecision,
    RedactionRecord,
    Ref,
    Report,
    Role,
    RunState,
    RunStatus,
    Section,
    Session,
    SessionDocument,
    SourceKind,
    Summary,
    Task,
    TaskState,
    TaskStatus,
    TodoList,
    ToolCall,
    ToolCallRequest,
    ToolCallStatus,
    ToolProvider,
    ToolState,
    ToolType,
    TurnRecord,
)
from ce.core.stores.base import SessionChanges

__all__ = [
    "block",
    "evidence",
    "expected_document",
    "message",
    "meta",
    "rich_changes",
    "task",
    "tool_call",
    "turn",
    "usage",
]


def message(key: str, role: Role = Role.USER, **fields: Any) -> Message:
    """A message with id ``key`` (content derived from it unless given)."""
    fields.setdefault("content", f"content of {key}")
    return Message(role=role, message_id=key, **fields)


def evidence(
    key: str,
    type: EvidenceType = EvidenceType.RAG_DOC,
    kind: SourceKind = SourceKind.RAG,
    **fields: Any,
) -> Evidence:
    """An evidence with id ``key`` from a source named after it (content likewise)."""
    fields.setdefault("content", f"evidence {key}")
    return Evidence(
        evidence_id=key,
        type=type,
        source=EvidenceSource(kind=kind, name=f"source of {key}"),
        **fields,
    )


def block(
    key: str,
    block_type: BlockType = BlockType.EVIDENCE,
    priority: Priority = Priority.MEDIUM,
    content: str = "",
) -> ContextBlock:
    """A context block with id ``key``."""
    return ContextBlock(
        block_id=key,
        block_type=block_type,
        priority=priority,
        content=content or f"block {key}",
        token_estimate=7,
    )


def tool_call(key: str) -> ToolCall:
    """A successful MCP tool call with id ``key``."""
    return ToolCall(tool_call_id=key, tool="search", provider=ToolProvider(kind=ProviderKind.MCP))


def usage(key: str) -> ModelUsage:
    """A model usage record with id ``key``."""
    return ModelUsage(model_usage_id=key, provider="openai", model="gpt-4o", prompt_tokens=3)


def task(key: str, status: TaskStatus = TaskStatus.PENDING) -> Task:
    """A task with id ``key``."""
    return Task(task_id=key, name=f"task {key}", status=status)


def turn(key: str, kind: Literal["turn", "call"] = "turn", **fields: Any) -> TurnRecord:
    """A turn record with id ``key`` whose report keeps one block and drops a range of two."""
    fields.setdefault("at", "2026-01-01T00:00:00+00:00")
    fields.setdefault("message_count", 3)
    fields.setdefault("evidence_count", 0)
    fields.setdefault(
        "report",
        Report(
            turn_id=key,
            token_budget=100,
            token_used=40,
            prune_decisions=[
                PruneDecision(
                    block_id="msg:m1..msg:m2",
                    action="dropped",
                    reason="budget",
                    token_estimate=30,
                    block_count=2,
                ),
                PruneDecision(block_id="msg:m3", action="kept", reason="recent", token_estimate=40),
            ],
        ),
    )
    return TurnRecord(turn_id=key, kind=kind, **fields)


def meta(user_id: str) -> Meta:
    """Session meta naming ``user_id`` as the actor."""
    return Meta(locale="en", actor=Actor(user_id=user_id, user_role="member"))


def rich_changes() -> SessionChanges:
    """A change set that uses every part of the document and most optional fields."""
    t0 = "2026-01-01T00:00:00+00:00"
    return SessionChanges(
        messages=[
            message("rich-system", Role.SYSTEM, author=Author(kind=AuthorKind.SYSTEM, id="sys")),
            message(
                "rich-user",
                at=t0,
                content="Quelle est la météo ? 天气如何 🌦",
                refs=[Ref(evidence_id="ev-doc", selector="lines:1-3")],
                lod=LodSections(
                    live=[Section(title="Question", body="full text")],
                    summary=[Section(body="short")],
                    gist=[Section(body="gist")],
                ),
                meta={"channel": "web", "nothing": None, "nested": {"list": [1, 2.5, "x"]}},
            ),
            message(
                "rich-assistant",
                Role.ASSISTANT,
                content="",
                tool_calls=[
                    ToolCallRequest(
                        tool_call_id="call-1",
                        name="search",
                        raw_arguments='{"q": "weather"}',
                        arguments={"q": "weather"},
                    ),
                    ToolCallRequest(
                        tool_call_id="call-2", name="clock", raw_arguments="{", parse_error="EOF"
                    ),
                ],
                invocation=ModelInvocation(provider="openai", model="gpt-4o"),
                author=Author(kind=AuthorKind.AGENT, id="planner"),
            ),
            message("rich-tool-1", Role.TOOL, tool_call_id="call-1", name="search"),
            message("rich-tool-2", Role.TOOL, tool_call_id="call-2", name="clock"),
        ],
        tool_calls=[
            ToolCall(
                tool_call_id="call-1",
                tool="search",
                provider=ToolProvider(kind=ProviderKind.MCP, name="web", uri="mcp://web"),
                type=ToolType.FUNCTION_CALL,
                called_at=t0,
                args_digest={"q": "weather", "sha256": "ab12"},
                status=ToolCallStatus.SUCCESS,
                duration_ms=120,
                result_evidence_ids=["ev-tool"],
                task_id="task-1",
            ),
            ToolCall(
                tool_call_id="call-2",
                tool="clock",
                provider=ToolProvider(kind=ProviderKind.BUILTIN),
                status=ToolCallStatus.ERROR,
            ),
        ],
        model_usage=[
            ModelUsage(
                model_usage_id="usage-1",
                provider="openai",
                model="gpt-4o",
                stage=ModelUsageStage.ANSWER,
                params={"temperature": 0.2},
                prompt_tokens=120,
                completion_tokens=30,
                total_tokens=150,
                first_token_latency_ms=80,
                latency_ms=900,
                task_id="task-1",
            )
        ],
        evidences=[
            evidence(
                "ev-doc",
                confidence=0.75,
                metadata={"doc_id": "d1", "version": 3},
                created_at=t0,
            ),
            evidence(
                "ev-tool",
                EvidenceType.TOOL_RESULT,
                SourceKind.TOOL,
                links=EvidenceLinks(tool_call_id="call-1"),
            ),
        ],
        context_blocks=[
            block("block-instruction", BlockType.INSTRUCTION, Priority.MUST),
            ContextBlock(
                block_id="block-evidence",
                block_type=BlockType.EVIDENCE,
                priority=Priority.HIGH,
                content="cited",
                refs=[Ref(evidence_id="ev-doc")],
            ),
        ],
        tasks=[
            task("task-1", TaskStatus.IN_PROGRESS),
            Task(task_id="task-2", name="answer", depends_on=["task-1"], error=""),
        ],
        turns=[
            TurnRecord(
                turn_id="turn-1",
                kind="call",
                at=t0,
                message_count=5,
                evidence_count=2,
                summary=Summary(
                    content="earlier",
                    updated_at=t0,
                    message_index_range=MessageIndexRange(from_index=0, to_index=0),
                ),
                config={"model_hint": "gpt-4o", "budget": {"max_input_tokens": 900}, "x": None},
                tool_schemas=[{"type": "function", "function": {"name": "search"}}],
                report=Report(
                    turn_id="turn-1",
                    new_evidence_ids=["ev-tool"],
                    new_block_ids=["block-evidence"],
                    prune_decisions=[
                        PruneDecision(
                            block_id="block-instruction",
                            action="kept",
                            reason="must",
                            token_estimate=7,
                            level="live",
                        ),
                        PruneDecision(
                            block_id="msg:rich-system..msg:rich-user",
                            action="degraded",
                            reason="budget",
                            token_estimate=12,
                            block_count=2,
                            level="gist",
                        ),
                    ],
                    conflicts=[
                        ConflictRecord(
                            evidence_ids=["ev-doc", "ev-tool"],
                            field_path="weather",
                            resolution="newest",
                        )
                    ],
                    redactions=[
                        RedactionRecord(
                            evidence_id="ev-tool", rules_applied=["email"], fields_redacted=1
                        )
                    ],
                    token_budget=900,
                    token_used=640,
                    degradations=["summary: adapter timed out"],
                    errors=["selector lines:9-12 out of range"],
                ),
            )
        ],
        summary=Summary(
            content="the user asked about the weather",
            updated_at=t0,
            message_index_range=MessageIndexRange(from_index=0, to_index=1),
            evidence_ids=["ev-doc"],
        ),
        run=RunState(run_id="run-1", status=RunStatus.TOOL_RUNNING),
        meta=Meta(
            locale="fr-FR",
            created_at=t0,
            updated_at=t0,
            actor=Actor(user_id="user-1", user_role="admin", agent=AgentInfo(agent_id="agent-1")),
        ),
    )


def expected_document(session_id: str, changes: SessionChanges) -> SessionDocument:
    """The document of a new session after committing ``changes`` (ids all distinct; the turn
    records are not part of it)."""
    return SessionDocument(
        schema_version=SCHEMA_VERSION,
        session=Session(
            session_id=session_id,
            messages=changes.messages,
            summary=changes.summary,
            task_state=TaskState(todo_list=TodoList(tasks=changes.tasks)),
            tool_state=ToolState(tool_calls=changes.tool_calls),
            model_usage=changes.model_usage,
            run=changes.run or RunState(),
        ),
        evidences={e.evidence_id: e for e in changes.evidences},
        context_blocks=changes.context_blocks,
        meta=changes.meta,
    )
