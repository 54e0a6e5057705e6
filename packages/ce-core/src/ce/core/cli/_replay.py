"""``ce replay``: reassemble a stored turn under another budget and diff the two inputs (needs
rich and the engine)."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from ce.core.cli._common import CliError, turn_or_fail
from ce.core.cli._inspect import action_totals
from ce.core.config import RuntimeConfig
from ce.core.errors import BudgetExceededError, StoreError
from ce.core.schema import MessagePart, PrepareResult, Report, TurnRecord
from ce.core.stores import Store, turn_config
from ce.core.tokens import tokenizer_name

__all__ = ["render_parts", "replay", "replay_configs", "show_replay"]

_DIFF_STYLES = {"+": "green", "-": "red", "@": "cyan"}


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


def show_replay(
    console: Console,
    labels: tuple[str, str],
    before: PrepareResult,
    after: PrepareResult,
) -> None:
    """Print the unified diff of two assembled inputs and their token totals."""
    diff = list(
        difflib.unified_diff(
            render_parts(before.assembled_input.parts),
            render_parts(after.assembled_input.parts),
            fromfile=labels[0],
            tofile=labels[1],
            lineterm="",
        )
    )
    if not diff:
        console.print(Text("the two assembled inputs are identical"))
    for line in diff:
        header = line.startswith(("--- ", "+++ "))
        console.print(Text(line, style="bold" if header else _DIFF_STYLES.get(line[:1], "")))
    for label, result in zip(labels, (before, after), strict=True):
        assembled, rep = result.assembled_input, result.report
        totals = Text(
            f"{label}: {assembled.total_tokens:,} tokens of {rep.token_budget:,}, "
            f"{len(assembled.parts)} message(s) · "
        )
        totals.append_text(action_totals(rep.prune_decisions))
        console.print(totals)


async def replay(
    store: Store,
    console: Console,
    session_id: str,
    turn_id: str,
    budget: int,
    model_hint: str | None,
    reserve: int | None = None,
) -> None:
    """Reassemble turn ``turn_id`` under its stored config and under the changed one, and
    show the difference."""
    record = await turn_or_fail(store, session_id, turn_id)
    turn_id = record.turn_id  # it may have been named by index or prefix
    try:
        stored = await turn_config(store, session_id, record)
    except StoreError as exc:
        raise CliError(str(exc)) from None
    before_config, after_config = replay_configs(stored, budget, model_hint, reserve)
    try:
        # The engine lands after this module: until then mypy sees no ContextEngine.
        from ce.core.engine import (
            ContextEngine,
        )
    except ImportError as exc:
        raise CliError(f"replay needs ce.core.engine, which cannot be imported: {exc}") from None
    engine = ContextEngine(store=store)
    before = await engine.replay_turn(session_id, turn_id, before_config)
    try:
        after = await engine.replay_turn(session_id, turn_id, after_config)
    except BudgetExceededError as exc:
        left = after_config.budget.context_tokens
        raise CliError(
            f"--budget {budget} leaves {left:,} input tokens (after the "
            f"{after_config.budget.reserved_reply_tokens:,}-token reply reserve), which cannot "
            f"hold the blocks a call must keep (instruction, newest user message, in-flight "
            f"tool chain): {exc}"
        ) from None
    estimator = getattr(engine, "estimator", None)
    now = None if estimator is None else tokenizer_name(estimator, before_config.model_hint)
    _check_stored(console, record, before, now)
    old_budget = before_config.budget.max_input_tokens
    labels = (f"{turn_id} @ {old_budget:,} tokens (stored)", f"{turn_id} @ {budget:,} tokens")
    if after_config.model_hint != before_config.model_hint:
        labels = (
            f"{labels[0]}, model {before_config.model_hint}",
            f"{labels[1]}, model {after_config.model_hint}",
        )
    show_replay(console, labels, before, after)


def _decision_keys(report: Report) -> list[tuple[str, str, str | None, int]]:
    return [(d.block_id, d.action, d.level, d.block_count) for d in report.prune_decisions]


def _check_stored(
    console: Console, record: TurnRecord, rebuilt: PrepareResult, tokenizer_now: str | None
) -> None:
    """Print the recorded call's totals (from its report) and say when the call rebuilt under
    its stored config differs from it, and when the tokenizer it was counted with is not the
    one available now (``tokenizer_now``; None: unknown)."""
    recorded = record.report
    notes: list[str] = []
    if tokenizer_now is not None and record.tokenizer is None:
        notes.append(
            "the turn record does not say which tokenizer counted it; both sides below are "
            f"counted with {tokenizer_now}"
        )
    elif tokenizer_now is not None and record.tokenizer != tokenizer_now:
        hint = (
            " (install ce-core[tiktoken] and set TIKTOKEN_CACHE_DIR for its counts)"
            if str(record.tokenizer).startswith("tiktoken:")
            else ""
        )
        notes.append(
            f"the call was counted with {record.tokenizer}; this machine counts with "
            f"{tokenizer_now}, and so do both sides below{hint}"
        )
    if rebuilt.report.token_used != recorded.token_used:
        notes.append(
            f"rebuilt under its stored config the call uses {rebuilt.report.token_used:,} "
            f"tokens where {recorded.token_used:,} were recorded; the '(stored)' side below "
            "is the rebuilt call"
        )
    elif _decision_keys(rebuilt.report) != _decision_keys(recorded):
        notes.append(
            "rebuilt under its stored config the call keeps, degrades or drops other blocks "
            "than recorded; the '(stored)' side below is the rebuilt call"
        )
    totals = Text(
        f"{record.turn_id} as recorded: {recorded.token_used:,} tokens of "
        f"{recorded.token_budget:,} · "
    )
    totals.append_text(action_totals(recorded.prune_decisions))
    console.print(totals)
    for note in notes:
        console.print(Text(f"note: {note}", style="yellow"))
