"""The load checker: what the store holds against what the workers acknowledged. See
:mod:`ce.core.testing.load`."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ce.core.engine import ContextEngine
from ce.core.schema import Message, Role, SessionDocument, TurnRecord
from ce.core.stores import open_store
from ce.core.testing._load_worker import CONFIG, STEPS, prefix, step_records
from ce.core.testing.assertions import assert_tool_pairs_intact

__all__ = ["CheckReport", "KillReport", "check_sessions", "stored_keys"]


@dataclass
class KillReport:
    """Where the SIGKILL landed: the victim's last acknowledged step of ``turn``, the step it
    was running, and what the store holds of that step (``all``, ``none`` or ``partial``;
    ``-`` when nothing was in flight). ``unanswered_call``: the turn's tool call is stored
    without its result."""

    worker: int
    turn: int
    last_acknowledged: str
    in_flight: str
    in_flight_stored: str
    unanswered_call: bool


@dataclass
class CheckReport:
    """The checker's counts. ``lost``: acknowledged records the store lacks; ``duplicated``:
    records stored more than once (by id, and messages by role + content + tool ids);
    ``unacknowledged``: records of the run no log acknowledges (the killed workers' in-flight
    steps excepted); ``orphan_tool_results``: tool messages that do not answer exactly one
    declared call (or a second answer); ``unanswered_tool_calls``: declared calls without a
    tool message (only a killed turn may leave one); ``partial_operations``: engine calls
    stored in part; ``pair_failures``: assembled inputs that broke a tool pair. :attr:`ok`
    when ``problems`` is empty."""

    sessions: int = 0
    messages: int = 0
    operations_acknowledged: int = 0
    turns_acknowledged: int = 0
    turns_complete: int = 0
    lost: int = 0
    duplicated: int = 0
    unacknowledged: int = 0
    orphan_tool_results: int = 0
    unanswered_tool_calls: int = 0
    partial_operations: int = 0
    pair_failures: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def stored_keys(doc: SessionDocument, turns: Iterable[TurnRecord]) -> Counter[tuple[str, str]]:
    """Every record of the session as (kind, key), as :func:`step_records` names them:
    messages, tool calls and usage by id, evidences by the tool call or else the model usage
    they link to (else their id), turn records by the id of the last message they saw and by
    their own id."""
    session = doc.session
    keys: Counter[tuple[str, str]] = Counter()
    keys.update(("message", m.message_id or "") for m in session.messages)
    keys.update(("tool_call", c.tool_call_id) for c in session.tool_state.tool_calls)
    keys.update(("usage", u.model_usage_id) for u in session.model_usage)
    keys.update(
        ("evidence", (e.links and (e.links.tool_call_id or e.links.model_usage_id)) or eid)
        for eid, e in doc.evidences.items()
    )
    for record in turns:
        n = record.message_count
        seen = session.messages[n - 1].message_id if 0 < n <= len(session.messages) else None
        keys[("turn", seen or "")] += 1
        keys[("turn_id", record.turn_id)] += 1
    return keys


def _tool_messages(doc: SessionDocument, report: CheckReport) -> None:
    declared: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    for message in doc.session.messages:
        if message.role is Role.TOOL:
            call_id = message.tool_call_id or ""
            if declared[call_id] != 1 or answered[call_id]:
                report.orphan_tool_results += 1
            answered[call_id] += 1
        for request in message.tool_calls or ():
            declared[request.tool_call_id] += 1
    report.unanswered_tool_calls += sum(1 for call_id in declared if not answered[call_id])


def _content_duplicates(doc: SessionDocument) -> int:
    contents = Counter(
        (m.role, m.content, m.tool_call_id, *(c.tool_call_id for c in m.tool_calls or ()))
        for m in doc.session.messages
    )
    return sum(n - 1 for n in contents.values() if n > 1)


async def check_sessions(
    store_url: str,
    run_id: str,
    session_ids: Sequence[str],
    turns: int,
    logs: Sequence[Sequence[dict[str, Any]]],
    killed: Sequence[int] = (),
) -> tuple[CheckReport, list[KillReport]]:
    """Read the sessions back through a fresh store and compare them with the workers' logs
    (``logs[w]``: worker ``w``'s acknowledged steps and ``turn_done`` lines, in order). The
    step each ``killed`` worker was running (the one after its last acknowledged step) may be
    stored wholly or not at all. Then a fresh engine runs ``prepare_turn`` on each session (a
    new user message) and its assembled input must keep every tool pair whole."""
    report = CheckReport(sessions=len(session_ids))
    store = open_store(store_url)
    try:
        stored: Counter[tuple[str, str]] = Counter()
        for session_id in session_ids:
            doc = await store.get_session(session_id)
            if doc is None:
                report.problems.append(f"session {session_id} is missing")
                continue
            report.messages += len(doc.session.messages)
            stored.update(stored_keys(doc, await store.list_turns(session_id)))
            _tool_messages(doc, report)
            report.duplicated += _content_duplicates(doc)
        expected: set[tuple[str, str]] = set()
        kills = []
        for worker, entries in enumerate(logs):
            last = _acknowledged(run_id, worker, entries, stored, expected, report)
            if worker in killed:
                kills.append(_in_flight(run_id, worker, turns, last, stored, expected, report))
        _count(run_id, stored, expected, kills, report)
        engine = ContextEngine(store=store, config=CONFIG)
        try:
            for session_id in session_ids:
                check_id = f"{session_id}-check-{uuid.uuid4().hex[:8]}"
                check = Message(role=Role.USER, content=f"{check_id}?", message_id=check_id)
                result = await engine.prepare_turn(session_id, check)
                try:
                    assert_tool_pairs_intact(result.assembled_input.parts)
                except AssertionError as exc:
                    report.pair_failures += 1
                    report.problems.append(f"{session_id}: a fresh prepare_turn: {exc}")
        finally:
            await engine.close()
    finally:
        await store.close()
    return report, kills


def _acknowledged(
    run_id: str,
    worker: int,
    entries: Sequence[dict[str, Any]],
    stored: Counter[tuple[str, str]],
    expected: set[tuple[str, str]],
    report: CheckReport,
) -> tuple[int, str] | None:
    """Add the records the worker acknowledged to ``expected``; its last (turn, step)."""
    last = None
    for entry in entries:
        turn, step = entry["turn"], entry["step"]
        records = step_records(prefix(run_id, worker, turn))
        if step == "turn_done":
            report.turns_acknowledged += 1
            every = [key for keys in records.values() for key in keys]
            report.turns_complete += int(all(stored[key] == 1 for key in every))
            continue
        report.operations_acknowledged += 1
        expected.update(records[step])
        if "turn_id" in entry:  # the turn record this prepare_* call returned
            expected.add(("turn_id", entry["turn_id"]))
        last = (turn, step)
    return last


def _in_flight(
    run_id: str,
    worker: int,
    turns: int,
    last: tuple[int, str] | None,
    stored: Counter[tuple[str, str]],
    expected: set[tuple[str, str]],
    report: CheckReport,
) -> KillReport:
    turn, step = last if last is not None else (0, "")
    index = STEPS.index(step) + 1 if step else 0
    if index == len(STEPS):
        turn, index = turn + 1, 0
    in_flight, held, done = "-", "-", 0
    if turn < turns:
        in_flight = STEPS[index]
        records = step_records(prefix(run_id, worker, turn))[in_flight]
        present = sum(1 for key in records if stored[key])
        held = "all" if present == len(records) else "partial" if present else "none"
        if held == "partial":
            report.partial_operations += 1
        if held != "none":
            expected.update(records)
        done = index + (held == "all")
    return KillReport(
        worker=worker,
        turn=turn,
        last_acknowledged=step or "-",
        in_flight=in_flight,
        in_flight_stored=held,
        # the call is stored (model_call_tool done), its tool message not (prepare_call not)
        unanswered_call=STEPS.index("model_call_tool") < done <= STEPS.index("prepare_call"),
    )


def _count(
    run_id: str,
    stored: Counter[tuple[str, str]],
    expected: set[tuple[str, str]],
    kills: Sequence[KillReport],
    report: CheckReport,
) -> None:
    for key, count in stored.items():
        if key in expected:
            report.duplicated += count - 1
        elif key[1].startswith(f"{run_id}-w"):
            report.unacknowledged += count
    report.lost = sum(1 for key in expected if key not in stored)
    for name in ("lost", "duplicated", "unacknowledged", "orphan_tool_results"):
        if getattr(report, name):
            report.problems.append(f"{getattr(report, name)} records {name.replace('_', ' ')}")
    allowed = sum(kill.unanswered_call for kill in kills)
    if report.unanswered_tool_calls != allowed:
        report.problems.append(
            f"{report.unanswered_tool_calls} tool calls without a result ({allowed} expected)"
        )
    if report.partial_operations:
        report.problems.append(f"{report.partial_operations} engine calls stored in part")
