"""The writes of :class:`~ce.core.stores.postgres.PostgresStore`, one function per store
operation, each run on one pooled connection (its layout and migration are in ``_pg_layout``,
its reads in ``_pg_read``).

Every function takes an autocommit psycopg connection and ``s``, the quoted schema name the
store's tables live in (a name checked by ``postgres.py``, so it is safe to format into SQL).
A write is one transaction that first locks the session's row, so writes to one session are
serialized while other sessions proceed. This module imports psycopg only inside functions
that run on a connection, so it loads without the driver installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from ce.core.schema import (
    SCHEMA_VERSION,
    SessionDocument,
)
from ce.core.stores._docops import user_id_of
from ce.core.stores._pg_layout import TAG_TYPES, TAG_VALUES, one_row
from ce.core.stores._rows import (
    DEFAULT_RUN,
    HEAD_COLUMNS,
    RECORD_TABLES,
    TAGGED,
    UPSERTED,
    head_updates,
    record_json,
    record_rows,
    row_tags,
)
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    SessionChanges,
    changes_of,
    new_epoch,
)

if TYPE_CHECKING:
    from psycopg import Connection

    Conn = Connection[tuple[Any, ...]]

__all__ = [
    "RECORD_TABLES",
    "commit",
    "delete_evidence",
    "delete_session",
    "put",
    "write_records",
]

_M = TypeVar("_M", bound=BaseModel)


# -- writes ---------------------------------------------------------------------------------------


def write_records(
    conn: Conn,
    s: str,
    table: str,
    session_id: str,
    version: int,
    rows: list[tuple[str, str]],
    tags: dict[str, dict[str, tuple[object, ...]]],
) -> int:
    """Insert ``(record_id, body)`` rows (ids distinct) after the stored ones, in one statement,
    with the values of the table's ``_rows.TAGGED`` columns in ``tags`` (``_rows.row_tags``
    of the change set the rows come from); the number of rows changed.

    Appended tables skip ids already stored; upserted tables replace a differing body in place
    (the row keeps its ``seq``, so the record keeps its position). The next ``seq`` comes from
    the ``(session_id, seq)`` primary key, so the cost does not grow with the session.
    """
    if not rows:
        return 0
    id_column = RECORD_TABLES[table]
    on_conflict = (
        "DO UPDATE SET body = excluded.body, version = excluded.version"
        " WHERE t.body IS DISTINCT FROM excluded.body"
        if table in UPSERTED
        else "DO NOTHING"
    )
    params: dict[str, Any] = {
        "sid": session_id,
        "version": version,
        "ids": [record_id for record_id, _ in rows],
        "bodies": [body for _, body in rows],
    }
    tagged = TAGGED.get(table, ())
    values = tags.get(table, {})
    for i, column in enumerate(tagged):
        params[column] = [TAG_VALUES[column](values[record_id][i]) for record_id, _ in rows]
    columns = "".join(f", {column}" for column in tagged)
    arrays = "".join(f", %({column})s::{TAG_TYPES[column]}[]" for column in tagged)
    cursor = conn.execute(
        f"INSERT INTO {s}.{table} AS t (session_id, seq, {id_column}, version, body{columns})"
        " SELECT %(sid)s, top.seq + new.ord, new.record_id, %(version)s, new.body"
        + "".join(f", new.{column}" for column in tagged)
        + f" FROM unnest(%(ids)s::text[], %(bodies)s::text[]{arrays})"
        f" WITH ORDINALITY AS new (record_id, body{columns}, ord),"
        f" (SELECT COALESCE(MAX(seq), -1) AS seq FROM {s}.{table} WHERE session_id = %(sid)s)"
        " AS top"
        " ORDER BY new.ord"
        f" ON CONFLICT (session_id, {id_column}) {on_conflict}",
        params,
    )
    return cursor.rowcount


def _lock_head(conn: Conn, s: str, session_id: str) -> tuple[int, dict[str, str | None], str]:
    """Lock the session's row for the rest of the transaction; its version (0 for a new
    session), stored ``summary`` / ``run_state`` / ``meta`` and epoch.

    A new session gets a version-0 row first (concurrent creators wait on it), which the
    caller turns into the real row or rolls back with its transaction. A new session starts
    a new epoch (see :class:`~ce.core.stores.base.SessionUpdate`).
    """
    select = (
        f"SELECT version, summary, run_state, meta, epoch FROM {s}.sessions"
        " WHERE session_id = %s FOR UPDATE"
    )
    row = conn.execute(select, (session_id,)).fetchone()
    if row is None:
        conn.execute(
            f"INSERT INTO {s}.sessions (session_id, version, schema_version, run_state, epoch)"
            " VALUES (%s, 0, %s, %s, %s) ON CONFLICT (session_id) DO NOTHING",
            (session_id, SCHEMA_VERSION, DEFAULT_RUN, new_epoch()),
        )
        row = one_row(conn.execute(select, (session_id,)))
    return int(row[0]), dict(zip(HEAD_COLUMNS, row[1:4], strict=True)), str(row[4])


def hold(conn: Conn, s: str, session_id: str) -> None:
    """Begin a transaction on ``conn`` (an autocommit connection) holding the session's row
    lock until it ends: commits of other writers to the session wait for it. A new session
    gets its version-0 row, removed again when the transaction rolls back."""
    conn.execute("BEGIN")
    _lock_head(conn, s, session_id)


def commit(
    conn: Conn, s: str, session_id: str, changes: SessionChanges, expected_version: int | None
) -> tuple[int, str | None]:
    """Apply ``changes`` in one transaction; the session's version and epoch afterwards (no
    epoch for a session that still does not exist)."""
    from psycopg import Rollback

    epoch: str | None = None
    with conn.transaction() as transaction:
        current, stored, epoch = _lock_head(conn, s, session_id)
        BaseStore._check_version(session_id, expected_version, current)
        version = current + 1
        tags = row_tags(changes)
        changed = sum(
            write_records(conn, s, table, session_id, version, rows, tags)
            for table, rows in record_rows(changes).items()
        )
        updates = head_updates(changes, stored)
        if "meta" in updates:
            updates["user_id"] = user_id_of(changes.meta)
        if not changed and not updates:
            raise Rollback(transaction)  # also drops the version-0 row of a new session
        assignments = "".join(f", {column} = %s" for column in updates)
        conn.execute(
            f"UPDATE {s}.sessions SET version = %s{assignments} WHERE session_id = %s",
            (version, *updates.values(), session_id),
        )
        return version, epoch
    return current, epoch if current else None


def _delete_records(conn: Conn, s: str, session_id: str) -> None:
    for table in RECORD_TABLES:
        conn.execute(f"DELETE FROM {s}.{table} WHERE session_id = %s", (session_id,))


def put(
    conn: Conn, s: str, session_id: str, doc: SessionDocument, expected_version: int | None
) -> tuple[int, str]:
    """Replace the session by ``doc`` (its turn records go; a new epoch starts) in one
    transaction; the new version and epoch."""
    session = doc.session
    epoch = new_epoch()
    with conn.transaction():
        current, _, _ = _lock_head(conn, s, session_id)
        BaseStore._check_version(session_id, expected_version, current)
        version = current + 1
        _delete_records(conn, s, session_id)
        conn.execute(
            f"UPDATE {s}.sessions SET version = %s, schema_version = %s, user_id = %s,"
            " summary = %s, run_state = %s, meta = %s, epoch = %s WHERE session_id = %s",
            (
                version,
                doc.schema_version,
                user_id_of(doc.meta),
                record_json(session.summary) if session.summary else None,
                record_json(session.run),
                record_json(doc.meta) if doc.meta else None,
                epoch,
                session_id,
            ),
        )
        changes = changes_of(doc)
        tags = row_tags(changes)
        for table, table_rows in record_rows(changes).items():
            write_records(conn, s, table, session_id, version, table_rows, tags)
    return version, epoch


def _insert_audit(conn: Conn, s: str, record: AuditRecord) -> None:
    conn.execute(
        f"INSERT INTO {s}.audit (at, action, session_id, target) VALUES (%s, %s, %s, %s)",
        (record.at, record.action, record.session_id, record.target),
    )


def delete_session(conn: Conn, s: str, record: AuditRecord) -> bool:
    """Delete every row of the session and append ``record`` to the audit log, in one
    transaction; False (and nothing audited) when the session does not exist."""
    with conn.transaction():
        locked = conn.execute(
            f"SELECT 1 FROM {s}.sessions WHERE session_id = %s FOR UPDATE", (record.session_id,)
        ).fetchone()
        if locked is None:
            return False
        _delete_records(conn, s, record.session_id)
        conn.execute(f"DELETE FROM {s}.sessions WHERE session_id = %s", (record.session_id,))
        _insert_audit(conn, s, record)
    return True


def delete_evidence(conn: Conn, s: str, record: AuditRecord) -> bool:
    """Delete the evidence ``record.target``, bump the version, start a new epoch and audit, in
    one transaction; False (and nothing changed) when the session has no such evidence."""
    with conn.transaction():
        locked = conn.execute(
            f"SELECT 1 FROM {s}.sessions WHERE session_id = %s FOR UPDATE", (record.session_id,)
        ).fetchone()
        if locked is None:
            return False
        deleted = conn.execute(
            f"DELETE FROM {s}.evidences WHERE session_id = %s AND evidence_id = %s",
            (record.session_id, record.target),
        ).rowcount
        if not deleted:
            return False
        conn.execute(
            f"UPDATE {s}.sessions SET version = version + 1, epoch = %s WHERE session_id = %s",
            (new_epoch(), record.session_id),
        )
        _insert_audit(conn, s, record)
    return True
