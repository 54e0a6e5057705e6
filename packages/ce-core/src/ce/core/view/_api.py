"""The viewer's JSON documents, read from a store: the sessions, a session's timeline, a turn's
assembled input with its decisions, and a turn replayed under another budget."""

from __future__ import annotations

import bisect
import difflib
import re
from collections.abc import Callable, Sequence
from typing import Any

from ce.core.cli._common import session_or_fail, turn_or_fail
from ce.core.cli._turns import block_labels, instant, last_activity, render_parts, replay_turn
from ce.core.config import RuntimeConfig
from ce.core.errors import StoreError
from ce.core.integration._mappers import reply_id
from ce.core.schema import (
    Evidence,
    Message,
    ModelUsage,
    ModelUsageStage,
    PrepareResult,
    PruneDecision,
    Role,
    SessionDocument,
    ToolCall,
    TurnRecord,
)
from ce.core.stores import Store, turn_config

__all__ = [
    "ACTIONS",
    "REDACTION_MARK",
    "pair_usage",
    "replay_json",
    "session_json",
    "sessions_json",
    "turn_json",
]

ACTIONS = ("kept", "degraded", "dropped")
REDACTION_MARK = "[REDACTED:"
"""How a redacted value starts in stored and assembled text (``[REDACTED:<rule>]``)."""

Json = dict[str, Any]
_FENCE = re.compile(r'<evidence id="([^"]+)"')


async def sessions_json(store: Store, user_id: str | None = None) -> Json:
    """``{"sessions": [...]}``: per stored session its counts, authors, last activity, run
    status and version (only ``user_id``'s sessions when given)."""
    rows: list[Json] = []
    for session_id in await store.list_sessions(user_id=user_id):
        doc = await store.get_session(session_id)
        if doc is None:  # deleted since it was listed
            continue
        session = doc.session
        rows.append(
            {
                "session_id": session_id,
                "messages": len(session.messages),
                "tool_calls": len(session.tool_state.tool_calls),
                "evidences": len(doc.evidences),
                "model_calls": len(session.model_usage),
                "turns": len(await store.list_turns(session_id)),
                "authors": sorted({m.author.id for m in session.messages if m.author}),
                "last_activity": last_activity(doc),
                "run_status": session.run.status.value,
                "version": await store.get_version(session_id),
            }
        )
    return {"sessions": rows}


def _call_json(call: ToolCall | None) -> Json | None:
    if call is None:
        return None
    return {
        "tool_call_id": call.tool_call_id,
        "tool": call.tool,
        "status": call.status.value,
        "duration_ms": call.duration_ms,
        "called_at": call.called_at or None,
        "arguments": call.args_digest,
        "evidence_ids": list(call.result_evidence_ids),
    }


def _usage_json(usage: ModelUsage | None, message_index: int | None = None) -> Json | None:
    if usage is None:
        return None
    return {
        "model_usage_id": usage.model_usage_id,
        "model": f"{usage.provider}/{usage.model}",
        "stage": usage.stage.value,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "latency_ms": usage.latency_ms,
        "first_token_latency_ms": usage.first_token_latency_ms,
        "status": usage.status.value,
        "error": usage.error,
        "task_id": usage.task_id,
        "message_index": message_index,
    }


def _evidence_json(evidence: Evidence, calls: dict[str, ToolCall]) -> Json:
    """An evidence with its provenance: source, score, the tool call that produced it."""
    score = evidence.metadata.get("score")
    call_id = evidence.links.tool_call_id
    return {
        "evidence_id": evidence.evidence_id,
        "type": evidence.type.value,
        "source": {
            "kind": evidence.source.kind.value,
            "name": evidence.source.name,
            "uri": evidence.source.uri,
        },
        "score": score if isinstance(score, (int, float)) else evidence.confidence,
        "confidence": evidence.confidence,
        "doc_id": evidence.metadata.get("doc_id"),
        "tool_call_id": call_id,
        "tool_call": _call_json(calls.get(call_id)) if call_id else None,
        "model_usage_id": evidence.links.model_usage_id,
        "created_at": evidence.created_at,
        "content": evidence.content,
        "redactions": evidence.content.count(REDACTION_MARK),
    }


def pair_usage(messages: Sequence[Message], usage: Sequence[ModelUsage]) -> dict[int, ModelUsage]:
    """The usage record of each reply (by message index). A reply recorded with its usage in
    one write is named after it; the other replies (assistant messages naming their model)
    take the other usage records (summaries aside) in order, when both counts agree and each
    pair names the same model."""
    by_reply = {reply_id(u.model_usage_id): u for u in usage}
    paired: dict[int, ModelUsage] = {}
    for index, message in enumerate(messages):
        if message.message_id in by_reply:
            paired[index] = by_reply[message.message_id]
    taken = {u.model_usage_id for u in paired.values()}
    summarize = ModelUsageStage.SUMMARIZE
    rest = [u for u in usage if u.model_usage_id not in taken and u.stage is not summarize]
    replies = [
        i
        for i, m in enumerate(messages)
        if m.role is Role.ASSISTANT and m.invocation is not None and i not in paired
    ]
    if len(rest) == len(replies):
        for index, record in zip(replies, rest, strict=True):
            invocation = messages[index].invocation
            if invocation and (invocation.provider, invocation.model) == (
                record.provider,
                record.model,
            ):
                paired[index] = record
    return paired


def _counts(decisions: Sequence[PruneDecision]) -> Json:
    return {
        action: {
            "blocks": sum(d.block_count for d in decisions if d.action == action),
            "tokens": sum(d.token_estimate for d in decisions if d.action == action),
        }
        for action in ACTIONS
    }


def _message_json(
    index: int,
    message: Message,
    calls: dict[str, ToolCall],
    usage: ModelUsage | None,
) -> Json:
    requests = [
        {
            "tool_call_id": r.tool_call_id,
            "name": r.name,
            "arguments": r.raw_arguments,
            "call": _call_json(calls.get(r.tool_call_id)),
        }
        for r in message.tool_calls or ()
    ]
    result = None
    if message.role is Role.TOOL and message.tool_call_id:
        result = _call_json(calls.get(message.tool_call_id)) or {
            "tool_call_id": message.tool_call_id,
            "tool": message.name or "",
            "status": None,
            "duration_ms": None,
            "evidence_ids": [],
        }
    invocation = message.invocation
    return {
        "item": "message",
        "index": index,
        "message_id": message.message_id,
        "role": message.role.value,
        "author": message.author.model_dump(mode="json") if message.author else None,
        "name": message.name,
        "at": message.at,
        "content": message.content,
        "tool_calls": requests,
        "tool_result": result,
        "refs": [r.evidence_id for r in message.refs or ()],
        "model": f"{invocation.provider}/{invocation.model}" if invocation else None,
        "usage": _usage_json(usage, index),
        "attachments": sum(1 for p in message.parts or () if p.type != "text"),
        "redactions": message.content.count(REDACTION_MARK),
    }


def _turn_row(number: int, record: TurnRecord, messages: Sequence[Message]) -> Json:
    report = record.report
    reply = record.message_count
    answered = reply < len(messages) and messages[reply].role is Role.ASSISTANT
    return {
        "item": "model_call",
        "turn": number,
        "turn_id": record.turn_id,
        "kind": record.kind,
        "at": record.at,
        "message_count": record.message_count,
        "token_used": report.token_used,
        "token_budget": report.token_budget,
        "actions": _counts(report.prune_decisions),
        "redactions": sum(r.fields_redacted for r in report.redactions),
        "errors": len(report.errors),
        "reply_index": reply if answered else None,
    }


def _timeline(
    doc: SessionDocument, turns: Sequence[TurnRecord], usage_of: dict[int, ModelUsage]
) -> list[Json]:
    """Messages in order; before message ``i`` the model calls prepared on the ``i`` messages
    before it, the evidences and unanswered tool calls recorded since the message before it
    (by time; those without a time at the end)."""
    messages = doc.session.messages
    calls = {c.tool_call_id: c for c in doc.session.tool_state.tool_calls}
    stamps: list[float] = []
    latest = float("-inf")
    for message in messages:  # a message without a time takes the one before it
        if message.at:
            latest = max(latest, instant(message.at).timestamp())
        stamps.append(latest)

    def slot(stamp: str | None) -> int:
        if not stamp:
            return len(messages)
        return bisect.bisect_right(stamps, instant(stamp).timestamp())

    slots: list[list[tuple[float, Json]]] = [[] for _ in range(len(messages) + 1)]

    def place(position: int, stamp: str | None, item: Json) -> None:
        key = instant(stamp).timestamp() if stamp else float("inf")
        slots[min(position, len(messages))].append((key, item))

    for number, record in enumerate(turns, 1):
        place(record.message_count, record.at, _turn_row(number, record, messages))
    for evidence in doc.evidences.values():
        item = {"item": "evidence", **_evidence_json(evidence, calls)}
        place(slot(evidence.created_at), evidence.created_at, item)
    mentioned = {m.tool_call_id for m in messages if m.role is Role.TOOL}
    mentioned.update(r.tool_call_id for m in messages for r in m.tool_calls or ())
    for call in doc.session.tool_state.tool_calls:
        if call.tool_call_id not in mentioned:
            item = {"item": "tool_call", **(_call_json(call) or {})}
            place(slot(call.called_at), call.called_at, item)
    timeline: list[Json] = []
    for index in range(len(messages) + 1):
        timeline.extend(item for _, item in sorted(slots[index], key=lambda pair: pair[0]))
        if index < len(messages):
            timeline.append(_message_json(index, messages[index], calls, usage_of.get(index)))
    return timeline


async def session_json(store: Store, session_id: str) -> Json:
    """A session: its run, timeline (messages with authors, tool calls with status and
    duration, evidences, model calls with tokens), model usage records and turns."""
    doc = await session_or_fail(store, session_id)
    session = doc.session
    turns = await store.list_turns(session_id)
    usage_of = pair_usage(session.messages, session.model_usage)
    index_of = {u.model_usage_id: i for i, u in usage_of.items()}
    calls = {c.tool_call_id: c for c in session.tool_state.tool_calls}
    summary = session.summary
    return {
        "session_id": session_id,
        "version": await store.get_version(session_id),
        "run": {
            "status": session.run.status.value,
            "run_id": session.run.run_id,
            "last_error": session.run.last_error,
        },
        "last_activity": last_activity(doc),
        "timeline": _timeline(doc, turns, usage_of),
        "model_usage": [
            _usage_json(u, index_of.get(u.model_usage_id)) for u in session.model_usage
        ],
        "tool_calls": [_call_json(c) for c in session.tool_state.tool_calls],
        "evidences": [_evidence_json(e, calls) for e in doc.evidences.values()],
        "turns": [_turn_row(n, t, session.messages) for n, t in enumerate(turns, 1)],
        "summary": None
        if summary is None
        else {
            "content": summary.content,
            "from_index": summary.message_index_range.from_index,
            "to_index": summary.message_index_range.to_index,
            "source": summary.source,
            "removed_by_app": summary.removed_by_app,
            "cleared": summary.cleared.model_dump() if summary.cleared else None,
            "withdrawn": [span.model_dump() for span in summary.withdrawn],
        },
    }


def _decisions_json(
    decisions: Sequence[PruneDecision],
    label: Callable[[str], str],
    evidences: dict[str, Json],
) -> list[Json]:
    rows = []
    for d in decisions:
        kind, _, ident = d.block_id.partition(":")
        rows.append(
            {
                "block_id": d.block_id,
                "kind": kind if ident else d.block_id,
                "action": d.action,
                "level": d.level,
                "reason": d.reason,
                "tokens": d.token_estimate,
                "saved_tokens": d.saved_tokens,
                "block_count": d.block_count,
                "label": label(d.block_id),
                "evidence": evidences.get(ident) if kind in ("ev", "evidence") else None,
            }
        )
    return rows


def _parts_json(result: PrepareResult) -> list[Json]:
    return [
        {
            "role": p.role.value,
            "content": p.content,
            "name": p.name,
            "tool_call_id": p.tool_call_id,
            "is_error": p.is_error,
            "tool_calls": [
                {"tool_call_id": c.tool_call_id, "name": c.name, "arguments": c.raw_arguments}
                for c in p.tool_calls or ()
            ],
        }
        for p in result.assembled_input.parts
    ]


def _fenced(result: PrepareResult, evidences: dict[str, Json]) -> list[Json]:
    """The stored evidences the input carries in ``<evidence id=...>`` fences (evidence
    blocks and tool results), each once, with the number of the message it is in."""
    found: dict[str, Json] = {}
    for number, part in enumerate(result.assembled_input.parts, 1):
        for ident in _FENCE.findall(part.content):
            if ident in evidences and ident not in found:
                found[ident] = {**evidences[ident], "message": number}
    return list(found.values())


async def _reassemble(
    store: Store, session_id: str, record: TurnRecord
) -> tuple[RuntimeConfig | None, PrepareResult | None, str]:
    """The turn's config and its input reassembled under it, or why it cannot be."""
    try:
        config = RuntimeConfig.model_validate(await turn_config(store, session_id, record))
    except (StoreError, ValueError) as exc:
        return None, None, f"its config is not stored or not valid here: {exc}"
    try:
        from ce.core.engine import ContextEngine
    except ImportError as exc:  # pragma: no cover - the engine ships with ce.core
        return config, None, f"ce.core.engine cannot be imported: {exc}"
    try:
        # a fresh engine per request: a long-lived one would cache sessions that other
        # processes go on writing to
        result = await ContextEngine(store=store).replay_turn(session_id, record.turn_id, config)
    except Exception as exc:  # the page says why instead of failing
        return config, None, f"reassembling it failed: {type(exc).__name__}: {exc}"
    return config, result, ""


async def turn_json(store: Store, session_id: str, turn_id: str) -> Json:
    """One model call: its stored report (decisions with reasons, levels and tokens,
    redactions, degradations, errors, conflicts), the evidences its blocks are with their
    provenance, and the input as it was assembled (reassembled from what is stored: the turn
    record keeps the report, not the text; ``input.matches_report`` says whether the
    reassembly made the stored decisions)."""
    record = await turn_or_fail(store, session_id, turn_id)
    doc = await session_or_fail(store, session_id)
    turns = await store.list_turns(session_id)
    number = next(i for i, t in enumerate(turns, 1) if t.turn_id == record.turn_id)
    messages = doc.session.messages
    calls = {c.tool_call_id: c for c in doc.session.tool_state.tool_calls}
    evidences = {i: _evidence_json(e, calls) for i, e in doc.evidences.items()}
    report = record.report
    config, result, problem = await _reassemble(store, session_id, record)
    usage_of = pair_usage(messages, doc.session.model_usage)
    reply = record.message_count
    reply_json = None
    if reply < len(messages) and messages[reply].role is Role.ASSISTANT:
        reply_json = _message_json(reply, messages[reply], calls, usage_of.get(reply))
    matches = result is not None and result.report.prune_decisions == report.prune_decisions
    return {
        "session_id": session_id,
        "turn": {
            **_turn_row(number, record, messages),
            "evidence_count": record.evidence_count,
            "config_id": record.config_id,
            "max_input_tokens": config.budget.max_input_tokens if config else None,
            "reserved_reply_tokens": config.budget.reserved_reply_tokens if config else None,
            "model_hint": config.model_hint if config else None,
            "tool_schemas": len(record.tool_schemas),
        },
        "turns": len(turns),
        "decisions": _decisions_json(report.prune_decisions, block_labels(doc), evidences),
        "totals": _counts(report.prune_decisions),
        "redactions": [r.model_dump(mode="json") for r in report.redactions],
        "degradations": list(report.degradations),
        "errors": list(report.errors),
        "conflicts": [c.model_dump(mode="json") for c in report.conflicts],
        "new_evidence_ids": list(report.new_evidence_ids),
        "input": {
            "reassembled": True,
            "available": result is not None,
            "problem": problem,
            "matches_report": matches,
            "total_tokens": result.assembled_input.total_tokens if result else None,
            "parts": _parts_json(result) if result else [],
            "evidences": _fenced(result, evidences) if result else [],
            "redactions": sum(p.content.count(REDACTION_MARK) for p in result.assembled_input.parts)
            if result
            else 0,
        },
        "reply": reply_json,
    }


def _side(result: PrepareResult, budget: int, label: Callable[[str], str]) -> Json:
    report = result.report
    return {
        "max_input_tokens": budget,
        "token_budget": report.token_budget,
        "total_tokens": result.assembled_input.total_tokens,
        "messages": len(result.assembled_input.parts),
        "totals": _counts(report.prune_decisions),
        "decisions": _decisions_json(report.prune_decisions, label, {}),
    }


def _state(decision: PruneDecision | None) -> str:
    if decision is None:
        return "-"
    return decision.action + (f" @{decision.level}" if decision.level else "")


async def replay_json(
    store: Store,
    session_id: str,
    turn_id: str,
    budget: int,
    model_hint: str | None = None,
    reserve: int | None = None,
) -> Json:
    """Turn ``turn_id`` reassembled under its stored config and under ``budget`` (as ``ce
    replay`` does): both sides' totals and decisions, the blocks whose decision changed, and
    the unified diff of the two inputs as ``{"op", "text"}`` lines (``op``: ``+``, ``-``,
    `` `` context, ``@`` hunk, ``h`` file header)."""
    replay = await replay_turn(store, session_id, turn_id, budget, model_hint, reserve)
    doc = await store.get_session(session_id)
    label = block_labels(doc)
    lines = difflib.unified_diff(
        render_parts(replay.before.assembled_input.parts),
        render_parts(replay.after.assembled_input.parts),
        fromfile=replay.labels[0],
        tofile=replay.labels[1],
        lineterm="",
    )
    diff = [
        {"op": "h" if line.startswith(("--- ", "+++ ")) else line[:1] or " ", "text": line}
        for line in lines
    ]
    before = {d.block_id: d for d in replay.before.report.prune_decisions}
    after = {d.block_id: d for d in replay.after.report.prune_decisions}
    changed = [
        {
            "block_id": block_id,
            "label": label(block_id),
            "before": _state(before.get(block_id)),
            "after": _state(after.get(block_id)),
        }
        for block_id in dict.fromkeys([*before, *after])
        if _state(before.get(block_id)) != _state(after.get(block_id))
    ]
    return {
        "session_id": session_id,
        "turn_id": replay.record.turn_id,
        "labels": list(replay.labels),
        "identical": not diff,
        "before": _side(replay.before, replay.before_config.budget.max_input_tokens, label),
        "after": _side(replay.after, budget, label),
        "changed": changed,
        "diff": diff,
    }
