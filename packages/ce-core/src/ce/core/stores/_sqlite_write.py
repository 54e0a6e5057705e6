"""The writes of :class:`~ce.core.stores.sqlite.SQLiteStore`: a commit's rows appended in its
session's order, a whole session replaced, compliance deletes (audited, the freed pages
scrubbed from the file and its write-ahead log)."""

from __future__ import annotations

import functools
import sqlite3

from ce.core.errors import StoreError
from ce.core.schema import SCHEMA_VERSION, SessionDocument
from ce.core.stores import _sqlite_sql as sql
from ce.core.stores._docops import user_id_of
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

__all__ = ["apply", "commit", "delete_evidence", "delete_session", "put"]


@functools.cache
def _insert_sql(table: str) -> str:
    """The statement appending one row of ``table`` after the session's stored ones (with the
    values of the table's ``_rows.TAGGED`` columns as parameters 5, 6, ...)."""
    id_column = RECORD_TABLES[table]
    on_conflict = (
        f"DO UPDATE SET body = excluded.body, version = excluded.version"
        f" WHERE {table}.body IS NOT excluded.body"
        if table in UPSERTED
        else "DO NOTHING"
    )
    tagged = TAGGED.get(table, ())
    extra = "".join(f", {column}" for column in tagged)
    slots = "".join(f", ?{5 + i}" for i in range(len(tagged)))
    # each row takes the session's next seq of the table in the same statement (an index
    # lookup: the table's key starts with (session_id, seq))
    return (
        f"INSERT INTO {table} (session_id, seq, {id_column}, version, body{extra})"
        f" SELECT ?1, COALESCE(MAX(seq) + 1, 0), ?2, ?3, ?4{slots}"
        f" FROM {table} WHERE session_id = ?1"
        f" ON CONFLICT (session_id, {id_column}) {on_conflict}"
    )


def _write_records(
    conn: sqlite3.Connection,
    table: str,
    session_id: str,
    version: int,
    rows: list[tuple[str, str]],
    tags: dict[str, dict[str, tuple[object, ...]]],
) -> int:
    """Insert ``(record_id, body)`` rows after the stored ones (with the values of the
    table's ``_rows.TAGGED`` columns in ``tags``); the number of rows changed.

    Appended tables skip ids already stored; upserted tables replace a differing body in place.
    """
    if not rows:
        return 0
    statement = _insert_sql(table)
    changed = 0
    values = tags.get(table)
    for record_id, body in rows:
        params = (session_id, record_id, version, body, *(values[record_id] if values else ()))
        changed += conn.execute(statement, params).rowcount
    return changed


def commit(
    conn: sqlite3.Connection,
    session_id: str,
    changes: SessionChanges,
    expected_version: int | None,
) -> tuple[int, str | None]:
    """Apply ``changes``; the version and epoch after the commit."""
    with sql.transaction(conn):
        version, epoch, changed = apply(conn, session_id, changes, expected_version)
        if not changed:
            conn.execute("ROLLBACK")
        return version, epoch


def apply(
    conn: sqlite3.Connection,
    session_id: str,
    changes: SessionChanges,
    expected_version: int | None,
) -> tuple[int, str | None, bool]:
    """Apply ``changes`` inside the caller's write transaction; the version and epoch after,
    and whether anything changed (when not, the caller rolls back what this wrote)."""
    row = conn.execute(
        "SELECT version, summary, run_state, meta, epoch FROM sessions WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    current = row[0] if row else 0
    BaseStore._check_version(session_id, expected_version, current)
    version = current + 1
    tags = row_tags(changes)
    changed = sum(
        _write_records(conn, table, session_id, version, rows, tags)
        for table, rows in record_rows(changes).items()
    )
    stored: dict[str, str | None] = (
        dict(zip(HEAD_COLUMNS, row[1:4], strict=True))
        if row
        else {"summary": None, "run_state": DEFAULT_RUN, "meta": None}
    )
    updates = head_updates(changes, stored)
    if "meta" in updates:
        updates["user_id"] = user_id_of(changes.meta)
    epoch: str | None = row[4] if row else None
    if not changed and not updates:
        return current, epoch, False
    if row is None:
        epoch = new_epoch()
        head = {**stored, "user_id": None, **updates}
        conn.execute(
            "INSERT INTO sessions (session_id, version, schema_version, user_id, summary,"
            " run_state, meta, epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                version,
                SCHEMA_VERSION,
                head["user_id"],
                *map(head.get, HEAD_COLUMNS),
                epoch,
            ),
        )
    else:
        assignments = "".join(f", {column} = ?" for column in updates)
        conn.execute(
            f"UPDATE sessions SET version = ?{assignments} WHERE session_id = ?",
            (version, *updates.values(), session_id),
        )
    return version, epoch, True


def _delete_rows(conn: sqlite3.Connection, session_id: str) -> None:
    """Delete every row of the session, its turn records included."""
    for table in (*RECORD_TABLES, "sessions"):
        conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))


def put(
    conn: sqlite3.Connection,
    session_id: str,
    doc: SessionDocument,
    expected_version: int | None,
) -> tuple[int, str]:
    """Replace the stored session with ``doc``; the version and the new epoch."""
    session = doc.session
    epoch = new_epoch()
    with sql.transaction(conn):
        current = sql.version(conn, session_id)
        BaseStore._check_version(session_id, expected_version, current)
        version = current + 1
        _delete_rows(conn, session_id)
        conn.execute(
            "INSERT INTO sessions (session_id, version, schema_version, user_id, summary,"
            " run_state, meta, epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                version,
                doc.schema_version,
                user_id_of(doc.meta),
                record_json(session.summary) if session.summary else None,
                record_json(session.run),
                record_json(doc.meta) if doc.meta else None,
                epoch,
            ),
        )
        changes = changes_of(doc)
        tags = row_tags(changes)
        for table, table_rows in record_rows(changes).items():
            tagged = TAGGED.get(table, ())
            values = tags.get(table, {})
            columns = "".join(f", {column}" for column in tagged)
            conn.executemany(
                f"INSERT INTO {table} (session_id, seq, {RECORD_TABLES[table]}, version, body"
                f"{columns}) VALUES (?, ?, ?, ?, ?{', ?' * len(tagged)})",
                [
                    (session_id, seq, rid, version, body, *values.get(rid, ()))
                    for seq, (rid, body) in enumerate(table_rows)
                ],
            )
        return version, epoch


def _insert_audit(conn: sqlite3.Connection, record: AuditRecord) -> None:
    conn.execute(
        "INSERT INTO audit (at, action, session_id, target) VALUES (?, ?, ?, ?)",
        (record.at, record.action, record.session_id, record.target),
    )


def _scrub(conn: sqlite3.Connection) -> None:
    """Move the zeroed pages into the database file and empty the write-ahead log."""
    (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        raise StoreError(
            "deleted, but readers kept the write-ahead log busy: the deleted bytes stay in it "
            "until the next checkpoint"
        )


def delete_session(conn: sqlite3.Connection, record: AuditRecord) -> bool:
    with sql.transaction(conn):
        if not sql.version(conn, record.session_id):
            conn.execute("ROLLBACK")
            return False
        _delete_rows(conn, record.session_id)
        _insert_audit(conn, record)
    _scrub(conn)
    return True


def delete_evidence(conn: sqlite3.Connection, record: AuditRecord) -> bool:
    with sql.transaction(conn):
        deleted = conn.execute(
            "DELETE FROM evidences WHERE session_id = ? AND evidence_id = ?",
            (record.session_id, record.target),
        ).rowcount
        if not deleted:
            conn.execute("ROLLBACK")
            return False
        conn.execute(
            "UPDATE sessions SET version = version + 1, epoch = ? WHERE session_id = ?",
            (new_epoch(), record.session_id),
        )
        _insert_audit(conn, record)
    _scrub(conn)
    return True
