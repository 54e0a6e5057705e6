"""What ``ce report``, ``ce replay``, ``ce sessions`` and ``ce view`` share, without rich:
readable labels of a report's blocks, a session's last activity, an assembled input as lines,
and the replay of a stored turn under another budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from ce.core.cli._common import CliError, first_line, turn_or_fail
from ce.core.config import RuntimeConfig
from ce.core.errors import BudgetExceededError, StoreError
from ce.core.primitives import parse_iso
from ce.core.schema import Message, MessagePart, PrepareResult, Role, SessionDocument, TurnRecord
from ce.core.stores import Store, turn_config
from ce.core.tokens import tokenizer_name

__all__ = [
    "Replay",
    "block_labels",
    "instant",
    "last_activity",
    "render_parts",
    "replay_configs",
    "replay_turn",
]

_EARLIEST = datetime.min.replace(tzinfo=timezone.utc)


def instant(stamp: str) -> datetime:
    """``stamp`` as an aware datetime; an unparsable stamp is the earliest instant (it sorts
    first)."""
    try:
        return parse_iso(stamp)
    except ValueError:
        return _EARLIEST


def last_activity(doc: SessionDocument) -> str | None:
    """The latest of the messages' ``at`` and ``meta.updated_at``, as stored (None if none)."""
    stamps = [m.at for m in doc.session.messages if m.at]
    if doc.meta is not None and doc.meta.updated_at:
        stamps.append(doc.meta.updated_at)
    return max(stamps, key=instant) if stamps else None


def _message_label(message: Message) -> str:
    who = message.role.value + (f" {message.author.id}" if message.author else "")
    if message.role is Role.ASSISTANT and message.tool_calls and not message.content.strip():
        return f"{who} → " + ", ".join(f"{c.name}()" for c in message.tool_calls)
    return f"{who}: {first_line(message.content, 48)}"


def block_labels(doc: SessionDocument | None) -> Callable[[str], str]:
    """What a report's block id stands for, readable: role (and author) with the first words
    of a message (``msg:<id>``; a range names its ends), type and source of an evidence."""
    if doc is None:
        return lambda block_id: ""
    messages = {m.message_id: m for m in doc.session.messages if m.message_id}

    def one(block_id: str) -> str:
        kind, _, ident = block_id.partition(":")
        if kind == "msg" and ident in messages:
            return _message_label(messages[ident])
        if kind in ("ev", "evidence") and ident in doc.evidences:
            evidence = doc.evidences[ident]
            source = evidence.source.name or evidence.source.kind.value
            return f"{evidence.type.value} {source}: {first_line(evidence.content, 40)}"
        return ""

    def label(block_id: str) -> str:
        if ".." in block_id:
            first, _, last = block_id.partition("..")
            ends = [one(first), one(last)]
            return " … ".join(e for e in ends if e)
        return one(block_id)

    return label


def render_parts(parts: list[MessagePart]) -> list[str]:
    """The lines of an assembled input as the diff compares them: a header per message
    (role, tool-call id, name, error flag), its content indented, then its tool calls."""
    lines: list[str] = []
    for part in parts:
        head = f"### {part.role.value}"
        if part.tool_call_id:
            head += f" [{part.tool_call_id}]"
        if part.name:
            head += f" name={part.name}"
        if part.is_error:
            head += " (error)"
        lines.append(head)
        lines.extend(f"    {line}" for line in part.content.splitlines())
        lines.extend(
            f"    -> {call.name}({call.raw_arguments}) [{call.tool_call_id}]"
            for call in part.tool_calls or ()
        )
    return lines


def _errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in exc.errors()
    )


def replay_configs(
    stored: dict[str, Any], budget: int, model_hint: str | None, reserve: int | None = None
) -> tuple[RuntimeConfig, RuntimeConfig]:
    """The turn's stored config and the same config with ``budget.max_input_tokens`` set to
    ``budget`` (and ``model_hint`` when given), both validated; :class:`CliError` if either is
    invalid. The reply reserve is ``reserve`` when given; else the stored one, or a quarter of
    ``budget`` when the stored one would leave the input no room."""
    try:
        before = RuntimeConfig.model_validate(stored)
    except ValidationError as exc:
        raise CliError(f"the turn's stored config is not valid here: {_errors(exc)}") from None
    data = before.model_dump()  # validated again below: the budget validators must run
    data["budget"]["max_input_tokens"] = budget
    if reserve is not None:
        data["budget"]["reserved_reply_tokens"] = reserve
    elif data["budget"]["reserved_reply_tokens"] >= budget:
        data["budget"]["reserved_reply_tokens"] = budget // 4
    if model_hint is not None:
        data["model_hint"] = model_hint
    try:
        after = RuntimeConfig.model_validate(data)
    except ValidationError as exc:
        given = f"--budget {budget}" + (f" --reserve {reserve}" if reserve is not None else "")
        raise CliError(f"{given}: {_errors(exc)}") from None
    return before, after


@dataclass(frozen=True)
class Replay:
    """A stored turn reassembled twice: under its own config (``before``) and under the
    changed one (``after``); ``labels`` name the two sides of their diff."""

    record: TurnRecord
    before_config: RuntimeConfig
    after_config: RuntimeConfig
    before: PrepareResult
    after: PrepareResult
    labels: tuple[str, str]
    tokenizer_now: str | None = None  # the tokenizer the replay counted with (None: unknown)


async def replay_turn(
    store: Store,
    session_id: str,
    turn_id: str | None,
    budget: int,
    model_hint: str | None = None,
    reserve: int | None = None,
) -> Replay:
    """Reassemble turn ``turn_id`` (as :func:`~ce.core.cli._common.turn_or_fail` names it)
    under its stored config and under the one with ``budget`` (``model_hint``, ``reserve``; see
    :func:`replay_configs`). Writes nothing. :class:`CliError` when the turn, its config or the
    engine is missing, or when the budget cannot hold what a call must keep."""
    record = await turn_or_fail(store, session_id, turn_id)
    try:
        stored = await turn_config(store, session_id, record)
    except StoreError as exc:
        raise CliError(str(exc)) from None
    before_config, after_config = replay_configs(stored, budget, model_hint, reserve)
    try:
        from ce.core.engine import ContextEngine
    except ImportError as exc:
        raise CliError(f"replay needs ce.core.engine, which cannot be imported: {exc}") from None
    engine = ContextEngine(store=store)
    before = await engine.replay_turn(session_id, record.turn_id, before_config)
    try:
        after = await engine.replay_turn(session_id, record.turn_id, after_config)
    except BudgetExceededError as exc:
        left = after_config.budget.context_tokens
        raise CliError(
            f"--budget {budget} leaves {left:,} input tokens (after the "
            f"{after_config.budget.reserved_reply_tokens:,}-token reply reserve), which cannot "
            f"hold the blocks a call must keep (instruction, newest user message, in-flight "
            f"tool chain): {exc}"
        ) from None
    old_budget = before_config.budget.max_input_tokens
    labels = (
        f"{record.turn_id} @ {old_budget:,} tokens (stored)",
        f"{record.turn_id} @ {budget:,} tokens",
    )
    if after_config.model_hint != before_config.model_hint:
        labels = (
            f"{labels[0]}, model {before_config.model_hint}",
            f"{labels[1]}, model {after_config.model_hint}",
        )
    estimator = getattr(engine, "estimator", None)
    now = None if estimator is None else tokenizer_name(estimator, before_config.model_hint)
    return Replay(record, before_config, after_config, before, after, labels, now)
