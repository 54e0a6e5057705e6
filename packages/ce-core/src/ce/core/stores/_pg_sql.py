"""The SQL of :class:`~ce.core.stores.postgres.PostgresStore`: its layout, the layout
migration, and one function per store operation, each run on one pooled connection.

Every function takes an autocommit psycopg connection and ``s``, the quoted schema name the
store's tables live in (a name checked by ``postgres.py``, so it is safe to format into SQL).
Reads are single statements (one snapshot each); writes are one transaction that first locks
the session's row, so writes to one session are serialized while other sessions proceed.
This module imports psycopg only inside functions that run on a connection, so it loads
without the driver installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from pydantic import BaseModel

from ce.core.errors import StoreError
from ce.core.schema import (
    SCHEMA_VERSION,
    Evidence,
    SessionDocument,
    TurnRecord,
)
from ce.core.stores._docops import user_id_of
from ce.core.stores._rows import (
    DEFAULT_RUN,
    DOCUMENT_TABLES,
    HEAD_COLUMNS,
    RECORD_TABLES,
    UPSERTED,
    changes_from_rows,
    check_schema_version,
    document_from_rows,
    head_updates,
    record_json,
    record_rows,
)
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    SessionChanges,
    SessionUpdate,
    changes_of,
    new_epoch,
)

if TYPE_CHECKING:
    from psycopg import Connection

    Conn = Connection[tuple[Any, ...]]

__all__ = [
    "LAYOUT_VERSION",
    "RECORD_TABLES",
    "audit",
    "commit",
    "delete_evidence",
    "delete_session",
    "evidence",
    "layout_version",
    "load",
    "migrate",
    "put",
    "read_since",
    "records",
    "session_ids",
    "turn",
    "turns",
    "version",
    "write_records",
]

_M = TypeVar("_M", bound=BaseModel)


def _record_table(table: str) -> str:
    # ids and session ids compare byte-wise (COLLATE "C"): ordering does not depend on the
    # database's locale and matches Python's sorted().
    return f"""CREATE TABLE {{s}}.{table} (
        session_id TEXT COLLATE "C" NOT NULL,
        seq BIGINT NOT NULL,
        {RECORD_TABLES[table]} TEXT COLLATE "C" NOT NULL,
        version BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session_id, seq),
        UNIQUE (session_id, {RECORD_TABLES[table]})
    )"""


def _version_index(table: str) -> str:
    # read_since finds the rows written after a version through it
    return f"CREATE INDEX {table}_by_version ON {{s}}.{table} (session_id, version)"


_LAYOUTS: list[list[str]] = [
    [
        """CREATE TABLE {s}.sessions (
            session_id TEXT COLLATE "C" PRIMARY KEY,
            version BIGINT NOT NULL,
            schema_version TEXT NOT NULL,
            user_id TEXT,
            summary TEXT,
            run_state TEXT NOT NULL,
            meta TEXT,
            epoch TEXT NOT NULL
        )""",
        "CREATE INDEX sessions_by_user ON {s}.sessions (user_id, session_id)",
        *map(_record_table, RECORD_TABLES),
        *map(_version_index, DOCUMENT_TABLES),
        """CREATE TABLE {s}.audit (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            at TEXT NOT NULL,
            action TEXT NOT NULL,
            session_id TEXT COLLATE "C" NOT NULL,
            target TEXT NOT NULL
        )""",
        "CREATE INDEX audit_by_session ON {s}.audit (session_id, seq)",
    ],
]
"""``_LAYOUTS[n]`` holds the statements that take a schema from layout ``n`` to ``n + 1``
(layout 0 is an empty schema). A later layout appends its upgrade step here."""

LAYOUT_VERSION = len(_LAYOUTS)
"""The layout version this module creates and reads."""


# -- layout ---------------------------------------------------------------------------------------


def layout_version(conn: Conn, s: str) -> int:
    """The layout version stored in schema ``s`` (0 when it has no ``layout`` table)."""
    (exists,) = _one(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{s}.layout",)))
    if not exists:
        return 0
    (stored,) = _one(conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {s}.layout"))
    return int(stored)


def _check_not_newer(stored: int) -> None:
    if stored > LAYOUT_VERSION:
        raise StoreError(
            f"layout version {stored} is newer than this ce-core's {LAYOUT_VERSION}; "
            "upgrade ce-core"
        )


def migrate(conn: Conn, schema: str, s: str) -> None:
    """Create or upgrade the layout of schema ``schema`` (quoted: ``s``) to
    :data:`LAYOUT_VERSION`.

    An up-to-date schema is only read, so a role without DDL rights can open a schema created
    for it. Otherwise the upgrade runs in one transaction holding a transaction-level advisory
    lock keyed on the schema name: workers opening a fresh database at once queue on the lock,
    the first creates the tables, the others then find the layout current and change nothing.
    Raises :class:`StoreError` when the stored layout is newer than this code's.
    """
    stored = layout_version(conn, s)
    _check_not_newer(stored)
    if stored == LAYOUT_VERSION:
        return
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"ce.core.stores.postgres layout {schema}",),
        )
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.layout ("
            " version INTEGER PRIMARY KEY,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        stored = layout_version(conn, s)
        _check_not_newer(stored)
        for step in range(stored, LAYOUT_VERSION):
            for statement in _LAYOUTS[step]:
                conn.execute(statement.format(s=s))
            conn.execute(f"INSERT INTO {s}.layout (version) VALUES (%s)", (step + 1,))


# -- writes ---------------------------------------------------------------------------------------


def write_records(
    conn: Conn, s: str, table: str, session_id: str, version: int, rows: list[tuple[str, str]]
) -> int:
    """Insert ``(record_id, body)`` rows (ids distinct) after the stored ones, in one statement;
    the number of rows changed.

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
    cursor = conn.execute(
        f"INSERT INTO {s}.{table} AS t (session_id, seq, {id_column}, version, body)"
        " SELECT %(sid)s, top.seq + new.ord, new.record_id, %(version)s, new.body"
        " FROM unnest(%(ids)s::text[], %(bodies)s::text[])"
        " WITH ORDINALITY AS new (record_id, body, ord),"
        f" (SELECT COALESCE(MAX(seq), -1) AS seq FROM {s}.{table} WHERE session_id = %(sid)s)"
        " AS top"
        " ORDER BY new.ord"
        f" ON CONFLICT (session_id, {id_column}) {on_conflict}",
        {
            "sid": session_id,
            "version": version,
            "ids": [record_id for record_id, _ in rows],
            "bodies": [body for _, body in rows],
        },
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
        row = _one(conn.execute(select, (session_id,)))
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
        changed = sum(
            write_records(conn, s, table, session_id, version, rows)
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
        for table, table_rows in record_rows(changes_of(doc)).items():
            write_records(conn, s, table, session_id, version, table_rows)
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


# -- reads ----------------------------------------------------------------------------------------


def _one(cursor: Any) -> tuple[Any, ...]:
    row = cursor.fetchone()
    assert row is not None  # the statement always returns one row
    return tuple(row)


class _Head(NamedTuple):
    version: int
    epoch: str
    schema_version: str
    summary: str | None
    run_state: str
    meta: str | None
    since: int


def _read(
    conn: Conn, s: str, session_id: str, version: int, epoch: str
) -> tuple[_Head, dict[str, list[tuple[str, str]]]] | None:
    """The session's head and the ``(record_id, body)`` rows of its document tables in stored
    order, in one statement (one snapshot); None when the session does not exist.

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
        " version, epoch, schema_version, summary, run_state, meta, since FROM head",
        *(
            f"SELECT '{table}', seq, {RECORD_TABLES[table]}, body,"
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
    for kind, _, record_id, body, *head_columns in rows:
        if kind:
            bodies[kind].append((record_id, body))
        else:
            head = _Head(*head_columns)
    if head is None:
        return None
    check_schema_version(session_id, head.schema_version)
    return head, bodies


def load(conn: Conn, s: str, session_id: str) -> SessionDocument | None:
    """The stored document, or None. Raises :class:`StoreError` when it was written with
    another schema version or does not validate."""
    read = _read(conn, s, session_id, 0, "")
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
    read = _read(conn, s, session_id, version, epoch)
    if read is None:
        return None
    head, rows = read
    changes = changes_from_rows(session_id, (head.summary, head.run_state, head.meta), rows)
    return SessionUpdate(head.version, head.epoch, complete=head.since == 0, changes=changes)


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
