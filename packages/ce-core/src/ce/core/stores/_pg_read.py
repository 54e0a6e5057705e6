"""The reads of :class:`~ce.core.stores.postgres.PostgresStore`, one function per store
operation, each run on one pooled connection.

Every function takes an autocommit psycopg connection and ``s``, the quoted schema name the
store's tables live in (see ``_pg_sql``). Reads are single statements (one snapshot each),
except :func:`read_tail`, which runs its two statements in one read-only REPEATABLE READ
transaction. This module imports psycopg only inside functions that run on a connection, so it
loads without the driver installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError

from ce.core.errors import StoreError
from ce.core.schema import (
    Evidence,
    Message,
    SessionDocument,
    ToolCall,
    TurnRecord,
)
from ce.core.schema._document import evidence_link
from ce.core.stores._pg_layout import link_value
from ce.core.stores._rows import (
    DOCUMENT_TABLES,
    RECORD_TABLES,
    changes_from_rows,
    check_schema_version,
    document_from_rows,
)
from ce.core.stores.base import (
    AuditRecord,
    SessionSlice,
    SessionUpdate,
)

if TYPE_CHECKING:
    from psycopg import Connection

    Conn = Connection[tuple[Any, ...]]

__all__ = [
    "audit",
    "evidence",
    "evidences_by_dedup",
    "load",
    "messages_by_id",
    "read_since",
    "read_tail",
    "records",
    "session_ids",
    "turn",
    "turns",
    "version",
]

_M = TypeVar("_M", bound=BaseModel)


class _Head(NamedTuple):
    version: int
    epoch: str
    schema_version: str
    summary: str | None
    run_state: str
    meta: str | None
    since: int


def _read(
    conn: Conn, s: str, session_id: str, version: int, epoch: str, counts: dict[str, str]
) -> tuple[_Head, dict[str, list[tuple[str, str]]]] | None:
    """The session's head and the ``(record_id, body)`` rows of its document tables in stored
    order, in one statement (one snapshot), the token counts of the rows that have any added
    to ``counts``; None when the session does not exist.

    Only the rows written after ``version`` are read when ``epoch`` is the stored one and
    ``0 < version <= stored version`` (then ``since`` is ``version``), else every row
    (``since`` 0). Raises :class:`StoreError` when the session was written with another
    schema version.
    """
    same_history = (
        "CASE WHEN epoch = %(epoch)s AND %(version)s BETWEEN 1 AND version"
        " THEN %(version)s ELSE 0 END"
    )
    parts = [
        "SELECT '' AS kind, 0::bigint AS seq, NULL::text AS record_id, NULL::text AS body,"
        " NULL::text AS tokens,"
        " version, epoch, schema_version, summary, run_state, meta, since FROM head",
        *(
            f"SELECT '{table}', seq, {RECORD_TABLES[table]}, body,"
            f" {'tokens' if table in _COUNTED else 'NULL'},"
            " NULL, NULL, NULL, NULL, NULL, NULL, NULL"
            f" FROM {s}.{table} WHERE session_id = %(sid)s"
            " AND version > (SELECT since FROM head)"
            for table in DOCUMENT_TABLES
        ),
    ]
    rows = conn.execute(
        f"WITH head AS (SELECT *, {same_history}::bigint AS since FROM {s}.sessions"
        " WHERE session_id = %(sid)s) " + " UNION ALL ".join(parts) + " ORDER BY 1, 2",
        {"sid": session_id, "version": version, "epoch": epoch},
    )
    head: _Head | None = None
    bodies: dict[str, list[tuple[str, str]]] = {table: [] for table in DOCUMENT_TABLES}
    for kind, _, record_id, body, tokens, *head_columns in rows:
        if kind:
            bodies[kind].append((record_id, body))
            if tokens is not None:
                counts[record_id] = tokens
        else:
            head = _Head(*head_columns)
    if head is None:
        return None
    check_schema_version(session_id, head.schema_version)
    return head, bodies


def load(conn: Conn, s: str, session_id: str) -> SessionDocument | None:
    """The stored document, or None. Raises :class:`StoreError` when it was written with
    another schema version or does not validate."""
    read = _read(conn, s, session_id, 0, "", {})
    if read is None:
        return None
    head, rows = read
    return document_from_rows(
        session_id, (head.schema_version, head.summary, head.run_state, head.meta), rows
    )


def read_since(
    conn: Conn, s: str, session_id: str, version: int, epoch: str
) -> SessionUpdate | None:
    """What changed after ``version`` of ``epoch`` (see
    :class:`~ce.core.stores.base.SessionUpdate`): only the rows written since, found through
    the version indexes, in one statement; None when the session does not exist."""
    counts: dict[str, str] = {}
    read = _read(conn, s, session_id, version, epoch, counts)
    if read is None:
        return None
    head, rows = read
    changes = changes_from_rows(session_id, (head.summary, head.run_state, head.meta), rows, counts)
    return SessionUpdate(head.version, head.epoch, complete=head.since == 0, changes=changes)


_NO_END = 1 << 62
"""A ``seq`` past every row."""

_HEAD_PAD = ", NULL" * 10
"""The head columns of the rows of :func:`_tail_sql` that are not its head row."""

_COUNTED = ("messages", "evidences")
"""The record tables whose rows keep token counts (a ``tokens`` column)."""

_NO_COUNTS = ", NULL, NULL"
"""The record id and token counts of the rows of :func:`_tail_sql` that have none."""


def _tail_sql(s: str) -> str:
    """The first statement of :func:`read_tail`: the session's row (none when it does not
    exist) with ``m_seq`` (the ``seq`` of the tail's first message; past every row when the
    session has none), ``e_seq`` (where the run of newest evidences starts: the ``seq`` of the
    oldest of the newest ``%(evidences)s``, -1 when the session has none, past every row for
    no run), the counts of messages before ``m_seq`` and evidences before ``e_seq`` and of the
    system messages before ``m_seq``; then
    the rows (``kind``, ``seq``, ``body``) of the newest ``%(messages)s`` messages, the run of
    evidences, every context block and task, the newest system message before ``m_seq``
    (``instruction``) and every evidence that may state facts before ``e_seq``
    (``fact_sources``).

    The newest messages and evidences are read backwards along the primary key with a LIMIT
    (so a plan never expects more rows than the tail's), the instruction and the fact sources
    through their partial indexes; the counts read index entries only (no row once the table
    is vacuumed)."""
    return (
        f"WITH head AS (SELECT version, epoch, schema_version, summary, run_state, meta"
        f" FROM {s}.sessions WHERE session_id = %(sid)s),"
        f" newest AS (SELECT seq, body, message_id, tokens FROM {s}.messages"
        " WHERE session_id = %(sid)s ORDER BY seq DESC LIMIT %(messages)s),"
        f" run AS (SELECT seq, body, evidence_id, tokens FROM {s}.evidences"
        " WHERE session_id = %(sid)s"
        " ORDER BY seq DESC LIMIT %(evidences)s),"
        f" cut AS (SELECT COALESCE((SELECT min(seq) FROM newest), {_NO_END}) AS m_seq,"
        " CASE WHEN %(evidences)s > 0 THEN COALESCE((SELECT min(seq) FROM run), -1)"
        f" ELSE {_NO_END} END AS e_seq) "
        "SELECT '' AS kind, cut.e_seq AS seq, NULL::text AS body, head.version, head.epoch,"
        " head.schema_version, head.summary, head.run_state, head.meta, cut.m_seq,"
        f" (SELECT count(*) FROM {s}.messages WHERE session_id = %(sid)s AND seq < cut.m_seq),"
        f" (SELECT count(*) FROM {s}.evidences WHERE session_id = %(sid)s AND seq < cut.e_seq),"
        f" (SELECT count(*) FROM {s}.messages WHERE session_id = %(sid)s AND role = 'system'"
        " AND seq < cut.m_seq), NULL::text, NULL::text"
        " FROM head, cut"
        f" UNION ALL SELECT 'messages', seq, body{_HEAD_PAD}, message_id, tokens FROM newest"
        f" UNION ALL SELECT 'evidences', seq, body{_HEAD_PAD}, evidence_id, tokens FROM run"
        + "".join(
            f" UNION ALL SELECT '{table}', seq, body{_HEAD_PAD}{_NO_COUNTS} FROM {s}.{table}"
            " WHERE session_id = %(sid)s"
            for table in ("context_blocks", "tasks")
        )
        + f" UNION ALL (SELECT 'instruction', seq, body{_HEAD_PAD}{_NO_COUNTS} FROM {s}.messages"
        " WHERE session_id = %(sid)s AND role = 'system' AND seq < (SELECT m_seq FROM cut)"
        " ORDER BY seq DESC LIMIT 1)"
        f" UNION ALL SELECT 'fact_sources', seq, body{_HEAD_PAD}{_NO_COUNTS} FROM {s}.evidences"
        " WHERE session_id = %(sid)s AND facts AND seq < (SELECT e_seq FROM cut)"
    )


def _linked_sql(s: str) -> str:
    """The second statement of :func:`read_tail`: the rows (``kind``, ``seq``, ``body``) of
    the evidences before the run (``seq < %(e_seq)s``) whose ``link`` is one of
    ``%(links)s`` or whose id is one of ``%(refs)s``, and of the tool call records whose id is
    one of ``%(calls)s``. Each key is looked up on its own (``OFFSET 0`` keeps the lookup a
    subquery run per key), through the ``evidences_by_link`` partial index or the tables'
    unique ids: a plan never trades the lookups for a scan of the session's rows."""
    lookups = (
        ("link", "evidences", "link", "links", " AND seq < %(e_seq)s"),
        ("ref", "evidences", "evidence_id", "refs", " AND seq < %(e_seq)s"),
        ("tool_calls", "tool_calls", "tool_call_id", "calls", ""),
    )
    return " UNION ALL ".join(
        f"SELECT '{kind}' AS kind, found.seq, found.body"
        f" FROM unnest(%({keys})s::text[]) AS wanted (key), LATERAL ("
        f"SELECT seq, body FROM {s}.{table} WHERE session_id = %(sid)s"
        f" AND {column} = wanted.key{before} OFFSET 0) AS found"
        for kind, table, column, keys, before in lookups
    )


@contextmanager
def _snapshot(conn: Conn) -> Iterator[None]:
    """One read-only REPEATABLE READ transaction: its statements read one snapshot."""
    import psycopg
    from psycopg.pq import TransactionStatus

    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    try:
        yield
    except BaseException:
        # on a broken connection the pool discards it; the first error is the one raised
        if conn.info.transaction_status != TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _parsed(session_id: str, model: type[_M], body: str) -> _M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise StoreError(f"session {session_id!r} is corrupt: {exc}") from exc


def _storable(keys: list[str]) -> list[str]:
    """``keys`` without repeats and without those PostgreSQL text cannot hold (no stored id
    holds U+0000)."""
    return [key for key in dict.fromkeys(keys) if "\x00" not in key]


def read_tail(
    conn: Conn, s: str, session_id: str, messages: int, evidences: int
) -> SessionSlice | None:
    """The newest records of the session (see :class:`~ce.core.stores.base.SliceStore`), as
    ``SQLiteStore`` reads them, in one read-only REPEATABLE READ transaction of two
    statements: :func:`_tail_sql`, then (when the tail's messages or blocks name anything)
    :func:`_linked_sql` with the tool call ids and message ids of the tail's messages and
    the evidence ids its blocks refer to. Each reads only rows of the tail, through keys and
    partial indexes; None when the session does not exist."""
    kinds = ("messages", "evidences", "context_blocks", "tasks", "instruction", "fact_sources")
    rows: dict[str, list[tuple[int, str]]] = {kind: [] for kind in kinds}
    linked: dict[str, list[tuple[int, str]]] = {"link": [], "ref": [], "tool_calls": []}
    counts: dict[str, str] = {}
    with _snapshot(conn):
        head: tuple[Any, ...] | None = None
        for kind, seq, body, *head_columns, record_id, tokens in conn.execute(
            _tail_sql(s), {"sid": session_id, "messages": messages, "evidences": evidences}
        ):
            if kind:
                rows[kind].append((seq, body))
                if tokens is not None:
                    counts[record_id] = tokens
            else:
                head = (seq, *head_columns)
        if head is None:
            return None
        e_seq, stored, epoch, schema_version, summary, run_state, meta, _, older, before, system = (
            head
        )
        check_schema_version(session_id, schema_version)
        for part in rows.values():
            part.sort()
        changes = changes_from_rows(
            session_id,
            (summary, run_state, meta),
            {
                "messages": [("", body) for _, body in rows["messages"]],
                "tool_calls": [],
                "model_usage": [],
                "evidences": [],
                "context_blocks": [("", body) for _, body in rows["context_blocks"]],
                "tasks": [("", body) for _, body in rows["tasks"]],
            },
            counts,
        )
        calls = [c.tool_call_id for m in changes.messages for c in m.tool_calls or ()]
        own = [*calls, *(m.message_id for m in changes.messages if m.message_id)]
        refs = [ref.evidence_id for block in changes.context_blocks for ref in block.refs]
        if own or refs:
            params = {
                "sid": session_id,
                "e_seq": e_seq,
                "links": list(dict.fromkeys(map(link_value, own))),
                "refs": _storable(refs),
                "calls": _storable(calls),
            }
            for kind, seq, body in conn.execute(_linked_sql(s), params):
                linked[kind].append((seq, body))
    found = {seq: _parsed(session_id, Evidence, body) for seq, body in rows["evidences"]}
    links = set(own)
    for seq, body in linked["link"]:
        evidence = _parsed(session_id, Evidence, body)
        if evidence_link(evidence) in links:  # not one that differs only in a U+0000
            found[seq] = evidence
    found.update((seq, _parsed(session_id, Evidence, body)) for seq, body in linked["ref"])
    changes.evidences = [found[seq] for seq in sorted(found)]
    changes.tool_calls = [
        _parsed(session_id, ToolCall, body) for _, body in sorted(linked["tool_calls"])
    ]
    instruction = rows["instruction"]
    return SessionSlice(
        changes,
        int(stored),
        str(epoch),
        int(older),
        int(before) - sum(1 for seq in found if seq < e_seq),
        int(system),
        instruction=_parsed(session_id, Message, instruction[0][1]) if instruction else None,
        fact_sources=[_parsed(session_id, Evidence, body) for _, body in rows["fact_sources"]],
    )


def messages_by_id(conn: Conn, s: str, session_id: str, message_ids: list[str]) -> list[Message]:
    """The session's messages whose id is one of ``message_ids``, in stored order."""
    rows = conn.execute(
        f"SELECT body FROM {s}.messages WHERE session_id = %s AND message_id = ANY(%s)"
        " ORDER BY seq",
        (session_id, _storable(message_ids)),
    ).fetchall()
    return [_parsed(session_id, Message, body) for (body,) in rows]


def evidences_by_dedup(conn: Conn, s: str, session_id: str, keys: list[str]) -> list[Evidence]:
    """The session's evidences whose deduplication key is one of ``keys``, in stored order."""
    rows = conn.execute(
        f"SELECT body FROM {s}.evidences WHERE session_id = %s AND dedup = ANY(%s) ORDER BY seq",
        (session_id, _storable(keys)),
    ).fetchall()
    return [_parsed(session_id, Evidence, body) for (body,) in rows]


def version(conn: Conn, s: str, session_id: str) -> int:
    row = conn.execute(
        f"SELECT version FROM {s}.sessions WHERE session_id = %s", (session_id,)
    ).fetchone()
    return int(row[0]) if row else 0


def records(conn: Conn, s: str, table: str, model: type[_M], session_id: str) -> list[_M]:
    """The session's records of ``table`` in stored order, as ``model`` instances."""
    rows = conn.execute(
        f"SELECT body FROM {s}.{table} WHERE session_id = %s ORDER BY seq", (session_id,)
    )
    return [model.model_validate_json(body) for (body,) in rows]


def turns(conn: Conn, s: str, session_id: str, limit: int | None) -> list[TurnRecord]:
    # the newest ``limit`` rows (LIMIT NULL is no limit), then back in stored order
    rows = conn.execute(
        f"SELECT body FROM (SELECT seq, body FROM {s}.turns WHERE session_id = %s"
        " ORDER BY seq DESC LIMIT %s) AS newest ORDER BY seq",
        (session_id, limit),
    )
    return [TurnRecord.model_validate_json(body) for (body,) in rows]


def turn(conn: Conn, s: str, session_id: str, turn_id: str) -> TurnRecord | None:
    row = conn.execute(
        f"SELECT body FROM {s}.turns WHERE session_id = %s AND turn_id = %s",
        (session_id, turn_id),
    ).fetchone()
    return None if row is None else TurnRecord.model_validate_json(row[0])


def evidence(conn: Conn, s: str, session_id: str, evidence_id: str) -> Evidence | None:
    row = conn.execute(
        f"SELECT body FROM {s}.evidences WHERE session_id = %s AND evidence_id = %s",
        (session_id, evidence_id),
    ).fetchone()
    return None if row is None else Evidence.model_validate_json(row[0])


def session_ids(conn: Conn, s: str, user_id: str | None) -> list[str]:
    if user_id is None:
        rows = conn.execute(f"SELECT session_id FROM {s}.sessions ORDER BY session_id")
    else:
        rows = conn.execute(
            f"SELECT session_id FROM {s}.sessions WHERE user_id = %s ORDER BY session_id",
            (user_id,),
        )
    return [session_id for (session_id,) in rows]


def audit(conn: Conn, s: str, session_id: str | None) -> list[AuditRecord]:
    sql = f"SELECT at, action, session_id, target FROM {s}.audit"
    if session_id is None:
        rows = conn.execute(sql + " ORDER BY seq")
    else:
        rows = conn.execute(sql + " WHERE session_id = %s ORDER BY seq", (session_id,))
    return [AuditRecord(at=a, action=b, session_id=c, target=d) for a, b, c, d in rows]
