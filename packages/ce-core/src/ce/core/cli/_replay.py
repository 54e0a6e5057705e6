"""``ce replay``: reassemble a stored turn under another budget and diff the two inputs (needs
rich and the engine)."""

from __future__ import annotations

import difflib

from rich.console import Console
from rich.text import Text

from ce.core.cli._inspect import action_totals
from ce.core.cli._turns import render_parts, replay_configs, replay_turn
from ce.core.schema import PrepareResult
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
    show_replay(console, result.labels, result.before, result.after)
