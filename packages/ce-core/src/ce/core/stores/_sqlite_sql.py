"""The SQLite layout of :class:`~ce.core.stores.sqlite.SQLiteStore` (its tables, their
upgrades) and its reads; the writes are in :mod:`._sqlite_write`."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ce.core.errors import StoreError
from ce.core.schema import Evidence, Message, SessionDocument, ToolCall, TurnRecord
from ce.core.stores._rows import (
    DOCUMENT_TABLES,
    RECORD_TABLES,
    changes_from_rows,
    check_schema_version,
    counted_rows,
    document_from_rows,
)
from ce.core.stores.base import (
    AuditRecord,
    SessionChanges,
    SessionSlice,
    SessionUpdate,
)

__all__ = [
    "USER_VERSION",
    "audit",
    "busy",
    "evidence",
    "evidences_by_dedup",
    "load",
    "prepare",
    "read_since",
    "read_tail",
    "records",
    "session_ids",
    "transaction",
    "turn",
    "turns",
    "version",
]

_M = TypeVar("_M", bound=BaseModel)


USER_VERSION = 5
"""The layout version this module writes into ``PRAGMA user_version``."""


def _record_table(table: str) -> str:
    id_column = RECORD_TABLES[table]
    return f"""CREATE TABLE {table} (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        {id_column} TEXT NOT NULL,
        version INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session_id, seq),
        UNIQUE (session_id, {id_column})
    )"""


def _version_index(table: str) -> str:
    return f"CREATE INDEX {table}_by_version ON {table} (session_id, version)"


_TAG_COLUMNS = [
    "ALTER TABLE messages ADD COLUMN role TEXT",
    "ALTER TABLE evidences ADD COLUMN facts INTEGER",  # NULL: not computed (see _TAG_TRIGGERS)
    "ALTER TABLE evidences ADD COLUMN link TEXT",
]
"""The columns a partial read looks rows up by (see ``_rows.TAGGED``)."""


_TAG_INDEXES = [
    "CREATE INDEX messages_system ON messages (session_id, seq) WHERE role = 'system'",
    "CREATE INDEX evidences_facts ON evidences (session_id, seq) WHERE facts = 1",
    "CREATE INDEX evidences_by_link ON evidences (session_id, link) WHERE link IS NOT NULL",
]

_WHITESPACE = "' ' || char(9, 10, 11, 12, 13)"


def _role(body: str) -> str:
    """A message's role, in SQL, from its JSON ``body``."""
    return f"json_extract({body}, '$.role')"


def _facts(body: str) -> str:
    """``may_state_facts`` of an evidence, in SQL, from its JSON ``body``."""
    return f"""CASE
        WHEN json_extract({body}, '$.type') = 'llm_output'
            OR json_type({body}, '$.metadata.original_of') IS NOT NULL THEN 0
        WHEN json_type({body}, '$.metadata.entity') = 'text'
            AND json_extract({body}, '$.metadata.entity') <> ''
            AND json_type({body}, '$.metadata.field') = 'text'
            AND json_extract({body}, '$.metadata.field') <> '' THEN 1
        WHEN substr(ltrim(COALESCE(json_extract({body}, '$.content'), ''), {_WHITESPACE}), 1, 1)
            IN ('{{', '[') THEN 1
        ELSE 0 END"""


def _link(body: str) -> str:
    """``evidence_link`` of an evidence, in SQL, from its JSON ``body``."""
    return f"""COALESCE(
        NULLIF(json_extract({body}, '$.links.tool_call_id'), ''),
        CASE WHEN json_type({body}, '$.metadata.summary_of') = 'text'
            THEN NULLIF(json_extract({body}, '$.metadata.summary_of'), '') END)"""


_TAG_BACKFILL = [
    f"UPDATE messages SET role = {_role('body')}",
    f"UPDATE evidences SET facts = {_facts('body')}, link = {_link('body')}",
]
"""The tagged columns of the rows stored before they existed, from their bodies."""


def _dedup(body: str) -> str:
    """``_rows.dedup_key`` of an evidence, in SQL, from its JSON ``body``."""
    return f"""CASE WHEN json_type({body}, '$.metadata.dedup_key') = 'text'
        THEN NULLIF(json_extract({body}, '$.metadata.dedup_key'), '') END"""


_TAG_TRIGGERS = [
    f"""CREATE TRIGGER messages_role AFTER INSERT ON messages WHEN NEW.role IS NULL BEGIN
        UPDATE messages SET role = {_role("NEW.body")}
        WHERE session_id = NEW.session_id AND seq = NEW.seq; END""",
    f"""CREATE TRIGGER evidences_tags AFTER INSERT ON evidences WHEN NEW.facts IS NULL BEGIN
        UPDATE evidences SET facts = {_facts("NEW.body")}, link = {_link("NEW.body")}
        WHERE session_id = NEW.session_id AND seq = NEW.seq; END""",
]
"""A row inserted without the tagged columns gets them from its body: a process still
running an older ce-core (a rolling deploy) keeps writing rows a partial read finds. This
ce-core writes them itself, so the triggers' condition is false for its rows."""

_LAYOUT_5 = [
    # the token counts written with a record (``SessionChanges.token_counts``; NULL: none)
    "ALTER TABLE messages ADD COLUMN tokens TEXT",
    "ALTER TABLE evidences ADD COLUMN tokens TEXT",
    # an evidence's deduplication key, looked up by a reader of the newest records
    "ALTER TABLE evidences ADD COLUMN dedup TEXT",
    f"UPDATE evidences SET dedup = {_dedup('body')}",
    "CREATE INDEX evidences_by_dedup ON evidences (session_id, dedup) WHERE dedup IS NOT NULL",
    "DROP TRIGGER evidences_tags",
    f"""CREATE TRIGGER evidences_tags AFTER INSERT ON evidences WHEN NEW.facts IS NULL BEGIN
        UPDATE evidences SET facts = {_facts("NEW.body")}, link = {_link("NEW.body")},
            dedup = {_dedup("NEW.body")}
        WHERE session_id = NEW.session_id AND seq = NEW.seq; END""",
]
"""Layout 5: token counts, and the deduplication key of an evidence (filled for the rows
stored before; the trigger of a row from an older ce-core fills it too)."""


_DDL = [
    """CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        schema_version TEXT NOT NULL,
        user_id TEXT,
        summary TEXT,
        run_state TEXT NOT NULL,
        meta TEXT,
        epoch TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX sessions_by_user ON sessions (user_id)",
    *map(_record_table, RECORD_TABLES),
    *map(_version_index, DOCUMENT_TABLES),
    """CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        action TEXT NOT NULL,
        session_id TEXT NOT NULL,
        target TEXT NOT NULL
    )""",
    "CREATE INDEX audit_by_session ON audit (session_id)",
    *_TAG_COLUMNS,
    *_TAG_INDEXES,
    *_TAG_TRIGGERS,
    *_LAYOUT_5,
]
"""The statements that create the current layout in an empty file."""


_MIGRATIONS: dict[int, list[str]] = {
    1: [_record_table("turns")],
    # sessions stored before epochs existed keep the empty epoch
    2: [
        "ALTER TABLE sessions ADD COLUMN epoch TEXT NOT NULL DEFAULT ''",
        *map(_version_index, DOCUMENT_TABLES),
    ],
    # files written before partial reads: their rows get the columns' values from the bodies
    3: [*_TAG_COLUMNS, *_TAG_BACKFILL, *_TAG_INDEXES, *_TAG_TRIGGERS],
    # files written before token counts were kept: their rows have none (NULL)
    4: _LAYOUT_5,
}
"""Layout version -> the statements that upgrade it to the next version."""


def busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says the database was locked by another connection."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
    return "locked" in str(exc) or "busy" in str(exc)


def _enable_wal(conn: sqlite3.Connection, busy_timeout: float) -> str:
    """Switch to WAL, retrying while another process holds the lock.

    SQLite does not call the busy handler for a journal-mode change, so several workers
    opening a new database at once get "database is locked" at once; retry with a bounded
    backoff for up to ``busy_timeout`` seconds instead.
    """
    deadline = time.monotonic() + busy_timeout
    delay = 0.002
    while True:
        try:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return str(mode)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


@contextmanager
def transaction(conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """Run the body in one transaction: committed when the body ends normally, rolled back
    when it raises. A body that ends the transaction itself (``ROLLBACK`` when it wrote
    nothing) is left as it is."""
    conn.execute(begin)
    try:
        yield
        if conn.in_transaction:
            conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def prepare(conn: sqlite3.Connection, synchronous: str, busy_timeout: float) -> None:
    """Set the connection's pragmas and create, upgrade or check the layout."""
    mode = _enable_wal(conn, busy_timeout)
    if mode.lower() != "wal":
        raise StoreError(f"cannot enable WAL (journal_mode is {mode})")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA secure_delete = ON")
    with transaction(conn):
        (user_version,) = conn.execute("PRAGMA user_version").fetchone()
        if user_version > USER_VERSION:
            raise StoreError(
                f"layout version {user_version} is newer than this ce-core's {USER_VERSION}"
            )
        if user_version == 0:
            statements = _DDL
        else:
            statements = [
                statement
                for version in range(user_version, USER_VERSION)
                for statement in _MIGRATIONS[version]
            ]
        for statement in statements:
            conn.execute(statement)
        if user_version != USER_VERSION:
            conn.execute(f"PRAGMA user_version = {USER_VERSION}")


def _rows(
    conn: sqlite3.Connection, session_id: str, since: int = 0, counts: dict[str, str] | None = None
) -> dict[str, list[tuple[str, str]]]:
    """The ``(record_id, body)`` rows of the document tables written after ``since``; with
    ``counts``, the token counts of their messages and evidences are added to it."""
    rows: dict[str, list[tuple[str, str]]] = {}
    for table in DOCUMENT_TABLES:
        counted = counts is not None and table in ("messages", "evidences")
        found = conn.execute(
            f"SELECT {RECORD_TABLES[table]}, body{', tokens' if counted else ''} FROM {table}"
            " WHERE session_id = ? AND version > ? ORDER BY seq",
            (session_id, since),
        ).fetchall()
        rows[table] = counted_rows(found, counts) if counts is not None and counted else found
    return rows


def load(conn: sqlite3.Connection, session_id: str) -> SessionDocument | None:
    with transaction(conn, "BEGIN"):  # one read snapshot across the tables
        head = conn.execute(
            "SELECT schema_version, summary, run_state, meta FROM sessions WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        if head is None:
            return None
        rows = _rows(conn, session_id)
    return document_from_rows(session_id, head, rows)


def read_since(
    conn: sqlite3.Connection, session_id: str, version: int, epoch: str
) -> SessionUpdate | None:
    if version:  # a reader at the stored version (the usual case) needs one statement
        head = conn.execute(
            "SELECT version, epoch, schema_version FROM sessions WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        if head is not None and head[0] == version and head[1] == epoch:
            check_schema_version(session_id, head[2])
            return SessionUpdate(version, epoch, complete=False, changes=SessionChanges())
    with transaction(conn, "BEGIN"):  # one read snapshot across the tables
        return read_since_in(conn, session_id, version, epoch)


def read_since_in(
    conn: sqlite3.Connection, session_id: str, version: int, epoch: str
) -> SessionUpdate | None:
    """:func:`read_since` inside a transaction the caller holds."""
    head = _head(conn, session_id)
    if head is None:
        return None
    stored, stored_epoch, _, summary, run_state, meta = head
    same_history = stored_epoch == epoch and 0 < version <= stored
    if same_history and version == stored:
        return SessionUpdate(stored, stored_epoch, complete=False, changes=SessionChanges())
    counts: dict[str, str] = {}
    rows = _rows(conn, session_id, version if same_history else 0, counts)
    changes = changes_from_rows(session_id, (summary, run_state, meta), rows, counts)
    return SessionUpdate(stored, stored_epoch, complete=not same_history, changes=changes)


def read_tail(
    conn: sqlite3.Connection, session_id: str, messages: int, evidences: int
) -> SessionSlice | None:
    """The newest records of the session (see :class:`~ce.core.stores.base.SliceStore`), in
    one read snapshot; every statement goes through a key or an index of the session's
    newest rows, the tagged columns or the record ids."""
    with transaction(conn, "BEGIN"):  # one read snapshot across the tables
        head = _head(conn, session_id)
        if head is None:
            return None
        stored, epoch, _, summary, run_state, meta = head
        newest = conn.execute(
            "SELECT seq, body, message_id, tokens FROM messages WHERE session_id = ?"
            " ORDER BY seq DESC LIMIT ?",
            (session_id, messages),
        ).fetchall()
        newest.reverse()
        counts = {rid: tokens for _, _, rid, tokens in newest if tokens is not None}
        message_seq = newest[0][0] if newest else _NO_END
        run = (
            conn.execute(
                "SELECT seq FROM evidences WHERE session_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
                (session_id, evidences - 1),
            ).fetchone()
            if evidences
            else None
        )
        evidence_seq = (run[0] if run else -1) if evidences else _NO_END
        blocks = _all_rows(conn, "context_blocks", session_id)
        changes = changes_from_rows(
            session_id,
            (summary, run_state, meta),
            {
                "messages": [("", body) for _, body, _, _ in newest],
                "tool_calls": [],
                "model_usage": [],
                "evidences": [],
                "context_blocks": blocks,
                "tasks": _all_rows(conn, "tasks", session_id),
            },
            counts,
        )
        calls = [c.tool_call_id for m in changes.messages for c in m.tool_calls or ()]
        links = [*calls, *(m.message_id for m in changes.messages if m.message_id)]
        refs = [ref.evidence_id for block in changes.context_blocks for ref in block.refs]
        found: dict[int, str] = {}
        for seq, body, evidence_id, tokens in conn.execute(
            "SELECT seq, body, evidence_id, tokens FROM evidences"
            " WHERE session_id = ? AND seq >= ?",
            (session_id, evidence_seq),
        ):
            found[seq] = body
            if tokens is not None:
                counts[evidence_id] = tokens
        found.update(_where_in(conn, "evidences", "link", session_id, links))
        found.update(_where_in(conn, "evidences", "evidence_id", session_id, refs))
        changes.evidences = [_parsed(session_id, Evidence, found[seq]) for seq in sorted(found)]
        records = _where_in(conn, "tool_calls", "tool_call_id", session_id, calls)
        changes.tool_calls = [_parsed(session_id, ToolCall, body) for _, body in sorted(records)]
        (older_messages,) = conn.execute(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND seq < ?",
            (session_id, message_seq),
        ).fetchone()
        (older_system,) = conn.execute(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND role = 'system' AND seq < ?",
            (session_id, message_seq),
        ).fetchone()
        (before_run,) = conn.execute(
            "SELECT COUNT(*) FROM evidences WHERE session_id = ? AND seq < ?",
            (session_id, evidence_seq),
        ).fetchone()
        older_evidences = before_run - sum(1 for seq in found if seq < evidence_seq)
        instruction = conn.execute(
            "SELECT body FROM messages WHERE session_id = ? AND role = 'system' AND seq < ?"
            " ORDER BY seq DESC LIMIT 1",
            (session_id, message_seq),
        ).fetchone()
        sources = conn.execute(
            "SELECT body FROM evidences WHERE session_id = ? AND facts = 1 AND seq < ?"
            " ORDER BY seq",
            (session_id, evidence_seq),
        ).fetchall()
    return SessionSlice(
        changes,
        stored,
        epoch,
        older_messages,
        older_evidences,
        older_system,
        instruction=_parsed(session_id, Message, instruction[0]) if instruction else None,
        fact_sources=[_parsed(session_id, Evidence, body) for (body,) in sources],
    )


def evidences_by_dedup(
    conn: sqlite3.Connection, session_id: str, keys: list[str]
) -> list[Evidence]:
    """The session's evidences whose deduplication key is one of ``keys``, in stored order."""
    rows = _where_in(conn, "evidences", "dedup", session_id, keys)
    return [_parsed(session_id, Evidence, body) for _, body in sorted(rows)]


def messages_by_id(
    conn: sqlite3.Connection, session_id: str, message_ids: list[str]
) -> list[Message]:
    """The session's messages whose id is one of ``message_ids``, in stored order."""
    rows = _where_in(conn, "messages", "message_id", session_id, message_ids)
    return [_parsed(session_id, Message, body) for _, body in sorted(rows)]


_NO_END = 1 << 62  # a seq past every row


def _head(conn: sqlite3.Connection, session_id: str) -> tuple[Any, ...] | None:
    """The session's row: version, epoch, schema version (checked), summary, run, meta."""
    head: tuple[Any, ...] | None = conn.execute(
        "SELECT version, epoch, schema_version, summary, run_state, meta FROM sessions"
        " WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    if head is not None:
        check_schema_version(session_id, head[2])
    return head


def _where_in(
    conn: sqlite3.Connection, table: str, column: str, session_id: str, keys: list[str]
) -> list[tuple[int, str]]:
    """``(seq, body)`` of the session's rows of ``table`` whose ``column`` is one of
    ``keys`` (an index lookup per key), in as many statements as SQLite's bound-parameter
    limit needs."""
    unique = list(dict.fromkeys(keys))
    rows: list[tuple[int, str]] = []
    for i in range(0, len(unique), 500):
        chunk = unique[i : i + 500]
        rows.extend(
            conn.execute(
                f"SELECT seq, body FROM {table} WHERE session_id = ? AND {column} IN"
                f" ({', '.join('?' * len(chunk))})",
                (session_id, *chunk),
            ).fetchall()
        )
    return rows


def _all_rows(conn: sqlite3.Connection, table: str, session_id: str) -> list[tuple[str, str]]:
    return conn.execute(
        f"SELECT {RECORD_TABLES[table]}, body FROM {table} WHERE session_id = ? ORDER BY seq",
        (session_id,),
    ).fetchall()


def _parsed(session_id: str, model: type[_M], body: str) -> _M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise StoreError(f"session {session_id!r} is corrupt: {exc}") from exc


def version(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute(
        "SELECT version FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    return int(row[0]) if row else 0


def _bodies(conn: sqlite3.Connection, table: str, session_id: str) -> list[str]:
    rows = conn.execute(
        f"SELECT body FROM {table} WHERE session_id = ? ORDER BY seq", (session_id,)
    ).fetchall()
    return [body for (body,) in rows]


def records(conn: sqlite3.Connection, table: str, model: type[_M], session_id: str) -> list[_M]:
    return [model.model_validate_json(body) for body in _bodies(conn, table, session_id)]


def turns(conn: sqlite3.Connection, session_id: str, limit: int | None) -> list[TurnRecord]:
    # the newest ``limit`` rows (LIMIT -1 is no limit), then back in stored order
    rows = conn.execute(
        "SELECT body FROM (SELECT seq, body FROM turns WHERE session_id = ?"
        " ORDER BY seq DESC LIMIT ?) ORDER BY seq",
        (session_id, -1 if limit is None else limit),
    ).fetchall()
    return [TurnRecord.model_validate_json(body) for (body,) in rows]


def turn(conn: sqlite3.Connection, session_id: str, turn_id: str) -> TurnRecord | None:
    row = conn.execute(
        "SELECT body FROM turns WHERE session_id = ? AND turn_id = ?", (session_id, turn_id)
    ).fetchone()
    return None if row is None else TurnRecord.model_validate_json(row[0])


def evidence(conn: sqlite3.Connection, session_id: str, evidence_id: str) -> Evidence | None:
    row = conn.execute(
        "SELECT body FROM evidences WHERE session_id = ? AND evidence_id = ?",
        (session_id, evidence_id),
    ).fetchone()
    return None if row is None else Evidence.model_validate_json(row[0])


def session_ids(conn: sqlite3.Connection, user_id: str | None) -> list[str]:
    if user_id is None:
        rows = conn.execute("SELECT session_id FROM sessions ORDER BY session_id").fetchall()
    else:
        rows = conn.execute(
            "SELECT session_id FROM sessions WHERE user_id = ? ORDER BY session_id", (user_id,)
        ).fetchall()
    return [session_id for (session_id,) in rows]


def audit(conn: sqlite3.Connection, session_id: str | None) -> list[AuditRecord]:
    sql = "SELECT at, action, session_id, target FROM audit"
    if session_id is None:
        rows = conn.execute(sql + " ORDER BY seq").fetchall()
    else:
        rows = conn.execute(sql + " WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
    return [AuditRecord(at=a, action=b, session_id=c, target=d) for a, b, c, d in rows]
