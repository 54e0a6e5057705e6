"""``ce replay``: reassemble a stored turn under another budget and diff the two inputs (needs
rich and the engine)."""

from __future__ import annotations

import difflib

from rich.console import Console
from rich.text import Text

from ce.core.cli._inspect import action_totals
from ce.core.cli._turns import render_parts, replay_configs, replay_turn
from ce.core.schema import PrepareResult, Report, TurnRecord
from ce.core.stores import Store

__all__ = ["render_parts", "replay", "replay_configs", "show_replay"]

_DIFF_STYLES = {"+": "green", "-": "red", "@": "cyan"}


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
    result = await replay_turn(store, session_id, turn_id, budget, model_hint, reserve)
    _check_stored(console, result.record, result.before, result.tokenizer_now)
    show_replay(console, result.labels, result.before, result.after)


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
