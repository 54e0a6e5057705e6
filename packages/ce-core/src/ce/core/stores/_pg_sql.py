"""The SQL of :class:`~ce.core.stores.postgres.PostgresStore`: its layout, the layout
migration, and one function per store operation, each run on one pooled connection.

Every function takes an autocommit psycopg connection and ``s``, the quoted schema name the
store's tables live in (a name checked by ``postgres.py``, so it is safe to format into SQL).
Reads are single statements (one snapshot each), except :func:`read_tail`, which runs its two
statements in one read-only REPEATABLE READ transaction; writes are one transaction that first
locks the session's row, so writes to one session are serialized while other sessions proceed.
This module imports psycopg only inside functions that run on a connection, so it loads
without the driver installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError

from ce.core.errors import StoreError
from ce.core.schema import (
    SCHEMA_VERSION,
    Evidence,
    Message,
    SessionDocument,
    ToolCall,
    TurnRecord,
)
from ce.core.schema._document import evidence_link
from ce.core.stores._docops import user_id_of
from ce.core.stores._rows import (
    DEFAULT_RUN,
    DOCUMENT_TABLES,
    HEAD_COLUMNS,
    RECORD_TABLES,
    TAGGED,
    UPSERTED,
    changes_from_rows,
    check_schema_version,
    document_from_rows,
    head_updates,
    record_json,
    record_rows,
    row_tags,
)
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    SessionChanges,
    SessionSlice,
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
    "read_tail",
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


def _body_json(body: str) -> str:
    """A record's JSON ``body`` (an SQL expression) as text PostgreSQL can turn into ``json``
    / ``jsonb`` values: its ``\\u0000`` escapes (text cannot hold U+0000) read as
    ``\\u0001`` (neither is whitespace or a bracket). Escaped backslashes are first written
    ``\\u005c`` (the same character), so the text ``\\u0000`` after an escaped backslash is
    left as it is."""
    return rf"replace(replace({body}, E'\\\\', E'\\u005c'), E'\\u0000', E'\\u0001')"


_FACTS = """COALESCE(
    j->>'type' IS DISTINCT FROM 'llm_output'
    AND NOT COALESCE((j->'metadata') ? 'original_of', false)
    AND (
        (jsonb_typeof(j->'metadata'->'entity') = 'string'
            AND j->'metadata'->>'entity' <> ''
            AND jsonb_typeof(j->'metadata'->'field') = 'string'
            AND j->'metadata'->>'field' <> '')
        OR left(ltrim(COALESCE(j->>'content', ''), {whitespace}), 1) IN ('{{', '[')
    ), false)"""
"""``may_state_facts`` in SQL, of an evidence's body as ``jsonb`` ``j`` (formatted with the
layout's ``whitespace``)."""

_LINK = """COALESCE(
    NULLIF(j->'links'->>'tool_call_id', ''),
    CASE WHEN jsonb_typeof(j->'metadata'->'summary_of') = 'string'
        THEN NULLIF(j->'metadata'->>'summary_of', '') END
)"""
"""``evidence_link`` in SQL, of an evidence's body as ``jsonb`` ``j``."""

_DEDUP = """CASE WHEN jsonb_typeof(j->'metadata'->'dedup_key') = 'string'
    THEN NULLIF(j->'metadata'->>'dedup_key', '') END"""
"""``_rows.dedup_key`` in SQL, of an evidence's body as ``jsonb`` ``j``."""


def _version_index(table: str) -> str:
    # read_since finds the rows written after a version through it
    return f"CREATE INDEX {table}_by_version ON {{s}}.{table} (session_id, version)"


def _tag_evidence(create: str, columns: dict[str, str]) -> str:
    """The statement that creates (``CREATE``, ``CREATE OR REPLACE``) the trigger function
    giving an evidence row inserted without its tagged columns the ``columns`` (column ->
    its SQL, of the body as ``jsonb`` ``j``)."""
    assignments = "".join(f"\n                NEW.{c} := {sql};" for c, sql in columns.items())
    return f"""{create} FUNCTION {{s}}.ce_tag_evidence() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE j jsonb;
        BEGIN
            IF NEW.facts IS NULL THEN
                j := {_body_json("NEW.body")}::jsonb;{assignments}
            END IF;
            RETURN NEW;
        END $$"""


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
    [
        # what read_tail looks rows up by (``_rows.TAGGED``): a message's role (the newest
        # system message before a tail), whether an evidence may state facts
        # (``may_state_facts``) and what it belongs to (``evidence_link``)
        "ALTER TABLE {s}.messages ADD COLUMN role TEXT",
        # NULL until computed: a row an older ce-core inserts gets it by trigger (below)
        "ALTER TABLE {s}.evidences ADD COLUMN facts BOOLEAN",
        'ALTER TABLE {s}.evidences ADD COLUMN link TEXT COLLATE "C"',
        # rows stored before: the values from their bodies
        f"UPDATE {{s}}.messages SET role = {_body_json('body')}::json->>'role'",
        f"""UPDATE {{s}}.evidences AS t SET facts = tags.facts, link = tags.link
        FROM (
            SELECT session_id, seq, {_FACTS} AS facts, {_LINK} AS link
            FROM (SELECT session_id, seq, {_body_json("body")}::jsonb AS j FROM {{s}}.evidences)
                AS parsed
        ) AS tags
        WHERE t.session_id = tags.session_id AND t.seq = tags.seq""",
        # a row inserted without them (a process of the previous ce-core, during a rolling
        # deploy) gets them from its body; this ce-core writes them itself
        f"""CREATE FUNCTION {{s}}.ce_tag_message() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.role IS NULL THEN
                NEW.role := {_body_json("NEW.body")}::json->>'role';
            END IF;
            RETURN NEW;
        END $$""",
        _tag_evidence("CREATE", {"facts": _FACTS, "link": _LINK}),
        "CREATE TRIGGER messages_role BEFORE INSERT ON {s}.messages"
        " FOR EACH ROW EXECUTE FUNCTION {s}.ce_tag_message()",
        "CREATE TRIGGER evidences_tags BEFORE INSERT ON {s}.evidences"
        " FOR EACH ROW EXECUTE FUNCTION {s}.ce_tag_evidence()",
        "CREATE INDEX messages_system ON {s}.messages (session_id, seq) WHERE role = 'system'",
        "CREATE INDEX evidences_facts ON {s}.evidences (session_id, seq) WHERE facts",
        "CREATE INDEX evidences_by_link ON {s}.evidences (session_id, link) WHERE link IS NOT NULL",
    ],
    [
        # the token counts written with a record (``SessionChanges.token_counts``); rows
        # stored before have none (NULL)
        "ALTER TABLE {s}.messages ADD COLUMN tokens TEXT",
        "ALTER TABLE {s}.evidences ADD COLUMN tokens TEXT",
        # an evidence's deduplication key, looked up by a reader of the newest records;
        # filled from the bodies of the rows stored before, and by the trigger for a row
        # of the previous ce-core
        'ALTER TABLE {s}.evidences ADD COLUMN dedup TEXT COLLATE "C"',
        f"""UPDATE {{s}}.evidences AS t SET dedup = keys.dedup
        FROM (
            SELECT session_id, seq, {_DEDUP} AS dedup
            FROM (SELECT session_id, seq, {_body_json("body")}::jsonb AS j FROM {{s}}.evidences)
                AS parsed
        ) AS keys
        WHERE t.session_id = keys.session_id AND t.seq = keys.seq AND keys.dedup IS NOT NULL""",
        _tag_evidence("CREATE OR REPLACE", {"facts": _FACTS, "link": _LINK, "dedup": _DEDUP}),
        "CREATE INDEX evidences_by_dedup ON {s}.evidences (session_id, dedup)"
        " WHERE dedup IS NOT NULL",
    ],
]
"""``_LAYOUTS[n]`` holds the statements that take a schema from layout ``n`` to ``n + 1``
(layout 0 is an empty schema). A later layout appends its upgrade step here. Statements are
formatted with ``s`` (the quoted schema) and ``whitespace`` (:func:`_whitespace_literal`)."""

LAYOUT_VERSION = len(_LAYOUTS)
"""The layout version this module creates and reads."""

_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004"
    "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""The characters ``str.isspace()`` holds, which ``str.lstrip()`` removes (``may_state_facts``
looks past them in the layout upgrade's SQL)."""


def _whitespace_literal(conn: Conn) -> str:
    """:data:`_WHITESPACE` as an SQL string literal; only its ASCII characters when the server
    encoding cannot hold the others (escapes above U+007F need UTF8)."""
    (encoding,) = _one(conn.execute("SELECT current_setting('server_encoding')"))
    chars = _WHITESPACE if encoding == "UTF8" else "".join(c for c in _WHITESPACE if c < "\x80")
    return "E'" + "".join(f"\\u{ord(c):04x}" for c in chars) + "'"


def _link_value(link: str | None) -> str | None:
    """How the ``link`` column keeps an :func:`~ce.core.schema._document.evidence_link` (or
    a key looked up in it): PostgreSQL text cannot hold U+0000, which becomes U+0001, as in
    the layout upgrade (:func:`_body_json`); ``read_tail`` checks the links of the rows it
    finds, so two links that differ only there are told apart."""
    return None if link is None else link.replace("\x00", "\x01")


_TAG_VALUES: dict[str, Callable[[Any], object]] = {
    "role": lambda role: role,
    "facts": bool,
    "link": _link_value,
    "tokens": lambda tokens: tokens,
    "dedup": lambda key: key,
}
"""``_rows.TAGGED`` column -> its value in PostgreSQL from the value ``_rows.row_tags`` gives
(``facts`` is a BOOLEAN)."""

_TAG_TYPES = {"role": "text", "facts": "boolean", "link": "text", "tokens": "text", "dedup": "text"}
"""``_rows.TAGGED`` column -> its SQL type."""


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
        whitespace = _whitespace_literal(conn)
        for step in range(stored, LAYOUT_VERSION):
            for statement in _LAYOUTS[step]:
                conn.execute(statement.format(s=s, whitespace=whitespace))
            conn.execute(f"INSERT INTO {s}.layout (version) VALUES (%s)", (step + 1,))


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
        params[column] = [_TAG_VALUES[column](values[record_id][i]) for record_id, _ in rows]
    columns = "".join(f", {column}" for column in tagged)
    arrays = "".join(f", %({column})s::{_TAG_TYPES[column]}[]" for column in tagged)
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
                "links": list(dict.fromkeys(map(_link_value, own))),
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
