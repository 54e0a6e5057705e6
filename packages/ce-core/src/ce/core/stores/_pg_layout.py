"""The PostgreSQL layout of :class:`~ce.core.stores.postgres.PostgresStore`: its tables and
indexes, each layout version's statements and the migration that applies them, and how the
tagged columns hold their values."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ce.core.errors import StoreError
from ce.core.stores._rows import DOCUMENT_TABLES, RECORD_TABLES

if TYPE_CHECKING:
    from psycopg import Connection

    Conn = Connection[tuple[Any, ...]]

__all__ = [
    "LAYOUT_VERSION",
    "TAG_TYPES",
    "TAG_VALUES",
    "layout_version",
    "link_value",
    "migrate",
    "one_row",
]


def one_row(cursor: Any) -> tuple[Any, ...]:
    """The one row a statement returns."""
    row = cursor.fetchone()
    assert row is not None  # the statement always returns one row
    return tuple(row)


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
    (encoding,) = one_row(conn.execute("SELECT current_setting('server_encoding')"))
    chars = _WHITESPACE if encoding == "UTF8" else "".join(c for c in _WHITESPACE if c < "\x80")
    return "E'" + "".join(f"\\u{ord(c):04x}" for c in chars) + "'"


def link_value(link: str | None) -> str | None:
    """How the ``link`` column keeps an :func:`~ce.core.schema._document.evidence_link` (or
    a key looked up in it): PostgreSQL text cannot hold U+0000, which becomes U+0001, as in
    the layout upgrade (:func:`_body_json`); ``read_tail`` checks the links of the rows it
    finds, so two links that differ only there are told apart."""
    return None if link is None else link.replace("\x00", "\x01")


TAG_VALUES: dict[str, Callable[[Any], object]] = {
    "role": lambda role: role,
    "facts": bool,
    "link": link_value,
    "tokens": lambda tokens: tokens,
    "dedup": lambda key: key,
}
"""``_rows.TAGGED`` column -> its value in PostgreSQL from the value ``_rows.row_tags`` gives
(``facts`` is a BOOLEAN)."""

TAG_TYPES = {"role": "text", "facts": "boolean", "link": "text", "tokens": "text", "dedup": "text"}
"""``_rows.TAGGED`` column -> its SQL type."""


# -- layout ---------------------------------------------------------------------------------------


def layout_version(conn: Conn, s: str) -> int:
    """The layout version stored in schema ``s`` (0 when it has no ``layout`` table)."""
    (exists,) = one_row(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{s}.layout",)))
    if not exists:
        return 0
    (stored,) = one_row(conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {s}.layout"))
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
