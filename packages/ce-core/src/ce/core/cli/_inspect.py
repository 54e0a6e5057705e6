"""``ce sessions``, ``ce show`` and ``ce report``: read-only views of a store (needs rich)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timezone

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ce.core.cli._common import first_line, session_or_fail, turn_or_fail
from ce.core.cli._turns import block_labels, last_activity
from ce.core.primitives import parse_iso
from ce.core.schema import (
    MESSAGES_BEFORE,
    Message,
    ModelUsage,
    PruneDecision,
    Role,
    ToolCall,
    ToolCallStatus,
)
from ce.core.state import usage_by_task
from ce.core.stores import Store

__all__ = ["action_totals", "block_labels", "report", "sessions", "show", "turns"]

_ACTION_STYLES = {"kept": "green", "dropped": "red", "degraded": "yellow"}


def _time(stamp: str | None) -> Text:
    """``stamp`` as ``YYYY-MM-DD HH:MM:SS`` in UTC (as stored when it does not parse)."""
    if not stamp:
        return Text("-")
    try:
        return Text(parse_iso(stamp).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return Text(stamp)


def _number(value: int) -> Text:
    return Text(f"{value:,}", justify="right")


def _tokens(decision: PruneDecision) -> Text:
    """A decision's tokens, and what degrading saved against Live."""
    saved = f" (saved {decision.saved_tokens:,})" if decision.saved_tokens else ""
    return Text(f"{decision.token_estimate:,}{saved}", justify="right")


async def sessions(store: Store, console: Console, user_id: str | None) -> None:
    """A table of the stored sessions (only ``user_id``'s when given)."""
    ids = await store.list_sessions(user_id=user_id)
    if not ids:
        console.print(Text(f"no sessions of user {user_id!r}" if user_id else "no sessions"))
        return
    table = Table(title=f"{len(ids)} session(s)", title_justify="left")
    table.add_column("session", overflow="fold")
    for name in ("messages", "tool calls", "evidences", "turns"):
        table.add_column(name, justify="right")
    table.add_column("last activity (UTC)")
    table.add_column("version", justify="right")
    for session_id in ids:
        doc = await store.get_session(session_id)
        if doc is None:  # deleted since it was listed
            continue
        table.add_row(
            Text(session_id),
            _number(len(doc.session.messages)),
            _number(len(doc.session.tool_state.tool_calls)),
            _number(len(doc.evidences)),
            _number(len(await store.list_turns(session_id))),
            _time(last_activity(doc)),
            _number(await store.get_version(session_id)),
        )
    console.print(table)


def _who(message: Message) -> Text:
    who = Text.assemble((message.role.value, "bold"))
    if message.author is not None:
        who.append(f" · {message.author.id}")
    elif message.name:
        who.append(f" · {message.name}")
    return who


def _tools(message: Message, calls: dict[str, ToolCall]) -> Text:
    """The tool calls a message requests, or the call whose result it carries, and the
    evidences it cites."""
    text = Text()
    for ref in message.refs or ():
        text.append(f"cites {ref.evidence_id}\n")
    for request in message.tool_calls or ():
        text.append(f"→ {request.name} [{request.tool_call_id}]\n")
    if message.role is Role.TOOL and message.tool_call_id:
        text.append(f"← [{message.tool_call_id}] ")
        call = calls.get(message.tool_call_id)
        if call is None:
            text.append("no tool-call record", style="dim")
        else:
            ok = call.status is ToolCallStatus.SUCCESS
            text.append(call.status.value, style="green" if ok else "red")
            text.append(f" {call.duration_ms:,} ms")
    text.rstrip()
    return text


def _usage_per_task(console: Console, records: list[ModelUsage]) -> None:
    """Tokens and calls summed per task, for usage records that name one (``task_id``)."""
    totals = usage_by_task(records)
    if not totals:
        return
    table = Table(title="model usage per task", title_justify="left")
    table.add_column("task", overflow="fold")
    for name in ("calls", "prompt", "completion", "total"):
        table.add_column(name, justify="right")
    for task_id, row in totals.items():
        numbers = (row.calls, row.prompt_tokens, row.completion_tokens, row.total_tokens)
        table.add_row(Text(task_id), *(_number(n) for n in numbers))
    console.print(table)


async def show(store: Store, console: Console, session_id: str) -> None:
    """The session's timeline: messages with their tool calls and results and the start of
    their block id in reports, other tool calls, model usage, evidences, turn records and the
    run status."""
    doc = await session_or_fail(store, session_id)
    session = doc.session
    run = session.run
    header = Text.assemble((f"session {session_id}", "bold"))
    header.append(f" · version {await store.get_version(session_id)} · run ")
    header.append(run.status.value, style="bold")
    if run.run_id:
        header.append(f" ({run.run_id})")
    if run.last_error:
        header.append(f" · last error: {first_line(run.last_error)}", style="red")
    console.print(header)

    calls = {c.tool_call_id: c for c in session.tool_state.tool_calls}
    timeline = Table(title=f"{len(session.messages)} message(s)", title_justify="left")
    timeline.add_column("#", justify="right")
    timeline.add_column("time (UTC)")
    timeline.add_column("who")
    timeline.add_column("content", overflow="fold")
    timeline.add_column("tools, sources", overflow="fold")
    # the start of the block id ce report names the message by (msg:<message id>)
    timeline.add_column("block")
    for index, message in enumerate(session.messages):
        timeline.add_row(
            str(index),
            _time(message.at),
            _who(message),
            Text(first_line(message.content, 60)),
            _tools(message, calls),
            Text(f"msg:{message.message_id[:8]}" if message.message_id else "-"),
        )
    console.print(timeline)

    mentioned = {m.tool_call_id for m in session.messages if m.role is Role.TOOL}
    mentioned.update(r.tool_call_id for m in session.messages for r in m.tool_calls or ())
    others = [c for c in session.tool_state.tool_calls if c.tool_call_id not in mentioned]
    if others:
        table = Table(title="tool calls without a message", title_justify="left")
        for name in ("id", "tool", "called at (UTC)", "status", "ms", "evidences"):
            table.add_column(name, overflow="fold")
        for call in others:
            table.add_row(
                Text(call.tool_call_id),
                Text(call.tool),
                _time(call.called_at),
                Text(call.status.value),
                _number(call.duration_ms),
                Text(", ".join(call.result_evidence_ids)),
            )
        console.print(table)

    if session.model_usage:
        usage = Table(title="model usage", title_justify="left")
        usage.add_column("id", overflow="fold")
        usage.add_column("model", overflow="fold")
        usage.add_column("stage")
        for name in ("prompt", "completion", "total", "latency ms"):
            usage.add_column(name, justify="right")
        usage.add_column("status")
        for record in session.model_usage:
            usage.add_row(
                Text(record.model_usage_id),
                Text(f"{record.provider}/{record.model}"),
                Text(record.stage.value),
                _number(record.prompt_tokens),
                _number(record.completion_tokens),
                _number(record.total_tokens),
                _number(record.latency_ms),
                Text(
                    f"{record.status.value}: {first_line(record.error, 40)}"
                    if record.error
                    else record.status.value
                ),
            )
        console.print(usage)
        _usage_per_task(console, session.model_usage)

    by_type = Counter(e.type.value for e in doc.evidences.values())
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(by_type.items()))
    console.print(Text(f"evidences: {len(doc.evidences)}" + (f" ({kinds})" if kinds else "")))
    if session.summary is not None:
        covered = session.summary.message_index_range
        if session.summary.removed_by_app:
            cleared = session.summary.cleared
            console.print(
                Text(f"removed by the app: messages 0..{session.summary.removed_by_app - 1}")
                + Text(
                    f", evidences 0..{cleared.evidences - 1}"
                    if cleared and cleared.evidences
                    else ""
                )
            )
        withdrawn = session.summary.withdraws_evidence
        for span in session.summary.withdrawn:
            documents = sum(
                withdrawn(e) and span.from_index <= e.metadata[MESSAGES_BEFORE] < span.to_index
                for e in doc.evidences.values()
            )
            console.print(
                Text(
                    f"taken back by the app: messages {span.from_index}..{span.to_index - 1}"
                    + (
                        f" and {documents} evidence{'s' * (documents > 1)} that came with them"
                        if documents
                        else ""
                    )
                    + " (it went back to an earlier point of its conversation)"
                )
            )
        if session.summary.source == "engine":
            console.print(
                Text(f"summary: messages {covered.from_index}..{covered.to_index}, "),
                Text(first_line(session.summary.content, 60)),
            )
    turns = await store.list_turns(session_id)
    newest = f" (newest {turns[-1].turn_id})" if turns else ""
    console.print(Text(f"turn records: {len(turns)}{newest}"))


def _decision_table(
    decisions: list[PruneDecision], label: Callable[[str], str] = lambda block_id: ""
) -> Table:
    table = Table(title=f"{len(decisions)} prune decision(s)", title_justify="left")
    # a message range is two ids: the preview of what it is stays short so the block fits
    table.add_column("block", overflow="fold")
    table.add_column("action")
    table.add_column("level")
    table.add_column("reason", overflow="fold")
    table.add_column("tokens", justify="right")
    table.add_column("blocks", justify="right")
    table.add_column("what", overflow="fold")
    for decision in decisions:
        table.add_row(
            Text(decision.block_id),
            Text(decision.action, style=_ACTION_STYLES[decision.action]),
            Text(decision.level or "-"),
            Text(decision.reason),
            _tokens(decision),
            Text(str(decision.block_count) if decision.block_count > 1 else ""),
            Text(_preview(label(decision.block_id))),
        )
    return table


_PREVIEW = 48


def _preview(text: str) -> str:
    """A label short enough that a decision (a message range is two ids long) keeps to one
    line of a wide terminal."""
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def action_totals(decisions: list[PruneDecision]) -> Text:
    """Blocks and tokens per action, e.g. ``kept 3 blocks / 120 tokens``."""
    text = Text()
    for action, style in _ACTION_STYLES.items():
        mine = [d for d in decisions if d.action == action]
        if mine:
            blocks = sum(d.block_count for d in mine)
            tokens = sum(d.token_estimate for d in mine)
            if text:
                text.append(" · ")
            text.append(action, style=style)
            text.append(f" {blocks:,} block(s) / {tokens:,} tokens")
    return text


def _section(console: Console, title: str, lines: list[str]) -> None:
    if lines:
        console.print(Text(f"{title} ({len(lines)}):", style="bold"))
        for line in lines:
            console.print(Text(f"  - {line}"))


async def turns(store: Store, console: Console, session_id: str) -> None:
    """The session's turns, oldest first, with the index ``ce report`` and ``ce replay``
    accept, time, kind, tokens and what the pruner did."""
    records = await store.list_turns(session_id)
    if not records:
        await session_or_fail(store, session_id)
        console.print(Text(f"session {session_id} has no turn records"))
        return
    table = Table(title=f"turns of {session_id}", title_justify="left")
    for column in ("#", "turn", "kind", "at", "tokens", "kept", "degraded", "dropped"):
        right = column in ("#", "tokens", "kept", "degraded", "dropped")
        table.add_column(column, justify="right" if right else "left")
    for index, record in enumerate(records, 1):
        rep = record.report
        counts = {
            action: sum(d.block_count for d in rep.prune_decisions if d.action == action)
            for action in ("kept", "degraded", "dropped")
        }
        table.add_row(
            str(index),
            record.turn_id[:8],
            record.kind,
            _time(record.at),
            f"{rep.token_used:,}/{rep.token_budget:,}",
            *(str(counts[a]) for a in ("kept", "degraded", "dropped")),
        )
    console.print(table)


async def report(store: Store, console: Console, session_id: str, turn_id: str | None) -> None:
    """The report of the turn ``turn_id`` (the newest when None)."""
    record = await turn_or_fail(store, session_id, turn_id)
    rep = record.report
    header = Text.assemble((f"turn {record.turn_id}", "bold"))
    header.append(f" ({record.kind}) at {record.at} · session {session_id}")
    console.print(header)
    share = f" ({rep.token_used / rep.token_budget:.0%})" if rep.token_budget else ""
    console.print(
        Text(f"budget {rep.token_budget:,} tokens · used {rep.token_used:,}{share}"),
        Text(
            f"· history {record.message_count:,} message(s), "
            f"{record.evidence_count:,} evidence(s)"
            + (" + summary" if record.summary is not None else "")
        ),
    )
    doc = await store.get_session(session_id)
    console.print(_decision_table(rep.prune_decisions, block_labels(doc)))
    if doc is not None:  # what each task of the session cost so far
        _usage_per_task(console, doc.session.model_usage)
    totals = action_totals(rep.prune_decisions)
    if totals:
        console.print(totals)
    if rep.new_evidence_ids:
        console.print(Text(f"new evidences: {', '.join(rep.new_evidence_ids)}"))
    if rep.new_block_ids:
        console.print(Text(f"new blocks: {', '.join(rep.new_block_ids)}"))
    _section(console, "degradations", rep.degradations)
    _section(console, "errors", rep.errors)
    _section(
        console,
        "conflicts",
        [
            f"{c.field_path}: {', '.join(c.evidence_ids)} -> {c.resolution}"
            + (f" ({c.detail})" if c.detail else "")
            for c in rep.conflicts
        ],
    )
    if rep.redactions:
        fields = sum(r.fields_redacted for r in rep.redactions)
        rules = sorted({rule for r in rep.redactions for rule in r.rules_applied})
        console.print(
            Text(
                f"redactions: {fields:,} field(s) in {len(rep.redactions)} evidence(s); "
                f"rules: {', '.join(rules) or '-'}",
                style="bold",
            )
        )
        for r in rep.redactions:
            console.print(
                Text(
                    f"  - {r.evidence_id}: {r.fields_redacted} field(s), "
                    f"{', '.join(r.rules_applied)}"
                )
            )
