"""PostgresStore on a real PostgreSQL server: the store contract, plus what is specific to it —
the layout and its migration under concurrent first opens, commits whose cost does not grow
with the session, content really deleted, several processes on one session, pooling, DSNs
and ``ce_schema``, and clear errors for servers that cannot be reached.

Needs the ``postgres_dsn`` fixture (tests/core/conftest.py), which skips without a server.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from multiprocessing.synchronize import Barrier
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

import ce.core.stores._pg_sql as pg_sql
from ce.core.engine import ContextEngine
from ce.core.errors import StoreError
from ce.core.schema import Evidence, EvidenceSource, EvidenceType, Message, Role, SourceKind
from ce.core.stores import PostgresStore, SessionChanges, Store, open_store
from ce.core.stores.postgres import DEFAULT_SCHEMA, LAYOUT_VERSION, split_schema
from ce.core.testing import InjectedFailure, StoreContract, records

psycopg = pytest.importorskip("psycopg", reason="needs psycopg: pip install 'ce-core[postgres]'")


def _schema() -> str:
    return f"t_{secrets.token_hex(6)}"


def _drop(dsn: str, *schemas: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def schema(postgres_dsn: str) -> Iterator[str]:
    """A schema name no store has used yet; dropped after the test."""
    name = _schema()
    yield name
    _drop(postgres_dsn, name)


@pytest.fixture
def sql(postgres_dsn: str) -> Iterator[Any]:
    """A plain autocommit connection to the test database, to look behind the store."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        yield conn


class TestPostgresStore(StoreContract):
    @pytest.fixture
    async def store(self, postgres_dsn: str, schema: str) -> AsyncIterator[Store]:
        store = PostgresStore(postgres_dsn, schema=schema)
        yield store
        await store.close()

    @pytest.fixture
    def fail_midway(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[Store], None]:
        # messages, tool calls and usage rows are inserted before the evidences
        def arm(store: Store) -> None:
            original = pg_sql.write_records

            def write_records(conn: Any, s: str, table: str, *args: Any) -> int:
                if table == "evidences":
                    monkeypatch.setattr(pg_sql, "write_records", original)
                    raise InjectedFailure("write_records failed on purpose")
                return original(conn, s, table, *args)

            monkeypatch.setattr(pg_sql, "write_records", write_records)

        return arm


def _as_user(dsn: str, userinfo: str) -> str:
    """``dsn`` (a URL) logging in as ``userinfo`` (``user`` or ``user:password``)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}"))


def _with_query(dsn: str, query: str) -> str:
    """``dsn`` (a URL) with the parameters ``query`` added to its query string."""
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}" if query else dsn


def _message(key: str, content: str | None = None) -> Message:
    return Message(role=Role.USER, content=content or f"content of {key}", message_id=key)


# -- layout ---------------------------------------------------------------------------------------


async def test_layout_is_row_per_record_in_its_schema(
    postgres_dsn: str, schema: str, sql: Any
) -> None:
    store = PostgresStore(postgres_dsn, schema=schema)
    for key in ("m1", "m2", "m3"):
        await store.append_messages("s1", [_message(key)])
    await store.commit("s1", SessionChanges(turns=[records.turn("t1")], meta=records.meta("u1")))
    await store.close()

    tables = sql.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
        " ORDER BY table_name",
        (schema,),
    ).fetchall()
    assert [t for (t,) in tables] == sorted(["audit", "layout", "sessions", *pg_sql.RECORD_TABLES])
    layout = sql.execute(f'SELECT version FROM "{schema}".layout').fetchall()
    assert layout == [(v,) for v in range(1, LAYOUT_VERSION + 1)]
    rows = sql.execute(
        f'SELECT message_id, version FROM "{schema}".messages ORDER BY seq'
    ).fetchall()
    assert rows == [("m1", 1), ("m2", 2), ("m3", 3)]
    head = sql.execute(f'SELECT version, user_id FROM "{schema}".sessions').fetchall()
    assert head == [(4, "u1")]
    turns = sql.execute(f'SELECT turn_id, version, body FROM "{schema}".turns').fetchall()
    assert [(t, v) for t, v, _ in turns] == [("t1", 4)]
    assert records.turn("t1").model_validate_json(turns[0][2]) == records.turn("t1")


async def test_schemas_keep_stores_apart(postgres_dsn: str, schema: str) -> None:
    other = _schema()
    try:
        first = PostgresStore(postgres_dsn, schema=schema)
        second = PostgresStore(postgres_dsn, schema=other)
        await first.append_messages("s1", [_message("only-in-first")])
        assert await second.list_sessions() == []
        assert await second.get_session("s1") is None
        await second.append_messages("s1", [_message("m1")])
        assert await first.get_version("s1") == await second.get_version("s1") == 1
        await first.close()
        await second.close()
    finally:
        _drop(postgres_dsn, other)


async def test_newer_layout_is_refused(postgres_dsn: str, schema: str, sql: Any) -> None:
    await PostgresStore(postgres_dsn, schema=schema).close()
    sql.execute(f'INSERT INTO "{schema}".layout (version) VALUES (99)')
    with pytest.raises(StoreError, match="layout version 99 is newer") as info:
        PostgresStore(postgres_dsn, schema=schema)
    assert f"schema {schema}" in str(info.value)


async def test_opening_a_current_layout_needs_no_ddl_rights(
    postgres_dsn: str, schema: str, sql: Any
) -> None:
    """A role that may only read and write the tables opens a schema created for it."""
    await PostgresStore(postgres_dsn, schema=schema).close()
    role = f"r_{secrets.token_hex(4)}"
    sql.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    try:
        sql.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        sql.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO {role}'
        )
        dsn = _as_user(postgres_dsn, f"{role}:pw")
        with psycopg.connect(dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE SCHEMA not_allowed")
        store = PostgresStore(dsn, schema=schema)
        assert (await store.append_messages("s1", [_message("m1")])).version == 1
        await store.close()
    finally:
        sql.execute(f"DROP OWNED BY {role}")
        sql.execute(f"DROP ROLE {role}")


def _open_when_released(dsn: str, schema: str, start: Barrier) -> None:
    start.wait(timeout=120)
    store = PostgresStore(dsn, schema=schema)
    asyncio.run(store.close())


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_several_processes_opening_a_fresh_schema_at_once_all_succeed(
    postgres_dsn: str, schema: str, sql: Any, isolation: str
) -> None:
    """Workers starting together race to create the schema; the advisory lock lets the first
    create it and the others find it current — also when the server's default isolation
    would give the waiters a snapshot from before the first one committed."""
    level = isolation.replace(" ", "\\ ")  # libpq options escape spaces with a backslash
    default = quote(f"-c default_transaction_isolation={level}")
    dsn = _with_query(postgres_dsn, f"options={default}")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(4)
    processes = [
        ctx.Process(target=_open_when_released, args=(dsn, schema, start)) for _ in range(4)
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=120)
        assert [p.exitcode for p in processes] == [0, 0, 0, 0]
    finally:
        for process in processes:
            process.kill()
    layout = sql.execute(f'SELECT version FROM "{schema}".layout').fetchall()
    assert layout == [(v,) for v in range(1, LAYOUT_VERSION + 1)]


# -- cost, deletes, several processes -------------------------------------------------------------


async def test_commit_cost_does_not_grow_with_the_session(
    postgres_dsn: str, schema: str, sql: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statements of a commit and the rows they touch are the same at 10 and at 10,000
    stored messages, and none of them scans the records table."""
    store = PostgresStore(postgres_dsn, schema=schema)
    executed: list[tuple[str, Any, int]] = []
    original = psycopg.Connection.execute

    def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        cursor = original(self, query, params, **kwargs)
        executed.append((str(query), params, cursor.rowcount))
        return cursor

    async def traced_commit(session_id: str, key: str) -> list[tuple[str, Any, int]]:
        executed.clear()
        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        try:
            changes = SessionChanges(messages=[_message(key)], turns=[records.turn(key)])
            await store.commit(session_id, changes)
        finally:
            monkeypatch.undo()
        return list(executed)

    await store.append_messages("small", [_message(f"m{i}") for i in range(10)])
    await store.append_messages("large", [_message(f"m{i}") for i in range(10_000)])
    sql.execute(f'ANALYZE "{schema}".messages')
    small = await traced_commit("small", "next")
    large = await traced_commit("large", "next")
    assert [(q, n) for q, _, n in small] == [(q, n) for q, _, n in large]
    # lock the session row, insert the message, insert the turn, bump the version
    assert [n for _, _, n in large] == [1, 1, 1, 1]

    for query, params, _ in large:
        if query.startswith(("SELECT", "INSERT", "UPDATE")):
            plan = sql.execute(f"EXPLAIN {query}", params).fetchall()
            text = "\n".join(line for (line,) in plan)
            assert not re.search(r"Seq Scan on (messages|turns)", text), text
    await store.close()


async def test_read_since_reads_only_the_rows_written_after_the_version(
    postgres_dsn: str, schema: str
) -> None:
    store = PostgresStore(postgres_dsn, schema=schema)
    await store.append_messages("s1", [_message(f"m{i}") for i in range(50)])
    first = await store.read_since("s1")
    assert first is not None and first.complete and len(first.changes.messages) == 50
    await store.append_messages("s1", [_message("m50")])
    await store.put_context_blocks("s1", [records.block("b1")])
    update = await store.read_since("s1", first.version, first.epoch)
    assert update is not None and not update.complete
    assert (update.version, update.epoch) == (3, first.epoch)
    assert [m.message_id for m in update.changes.messages] == ["m50"]
    assert update.changes.context_blocks == [records.block("b1")]

    await store.put_evidence("s1", records.evidence("e1"))
    assert await store.delete_evidence("s1", "e1")
    rewritten = await store.read_since("s1", update.version, update.epoch)
    assert rewritten is not None and rewritten.complete and rewritten.epoch != first.epoch
    assert len(rewritten.changes.messages) == 51
    await store.close()


async def test_deleted_content_is_gone_from_every_table(
    postgres_dsn: str, schema: str, sql: Any
) -> None:
    store = PostgresStore(postgres_dsn, schema=schema)
    secret, private = "SECRET-evidence-7f3a9c", "PRIVATE-message-51be02"
    evidence = Evidence(
        evidence_id="e1",
        type=EvidenceType.TOOL_RESULT,
        source=EvidenceSource(kind=SourceKind.TOOL),
        content=secret * 200,
    )
    await store.put_evidence("s1", evidence)
    await store.append_messages("s1", [_message("m", private)])
    await store.commit("s1", SessionChanges(turns=[records.turn("t-" + private)]))
    await store.append_messages("s2", [_message("kept")])

    def stored_text() -> str:
        tables = sql.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        return "\n".join(
            str(row)
            for (table,) in tables
            for row in sql.execute(f'SELECT t::text FROM "{schema}"."{table}" AS t')
        )

    assert secret in stored_text() and private in stored_text()
    assert await store.delete_evidence("s1", "e1")
    assert secret not in stored_text() and private in stored_text()
    assert await store.delete_session("s1")
    assert private not in stored_text()
    assert "content of kept" in stored_text()
    await store.close()


async def test_unreadable_session_raises_store_error(
    postgres_dsn: str, schema: str, sql: Any
) -> None:
    store = PostgresStore(postgres_dsn, schema=schema)
    await store.append_messages("s1", [_message("m1")])
    await store.append_messages("s2", [_message("m1")])
    sql.execute(
        f'UPDATE "{schema}".messages SET body = %s WHERE session_id = %s', ('{"role": 5}', "s1")
    )
    sql.execute(
        f'UPDATE "{schema}".sessions SET schema_version = %s WHERE session_id = %s', ("0.9", "s2")
    )
    with pytest.raises(StoreError, match=re.escape("session 's1' is corrupt")) as info:
        await store.get_session("s1")
    assert f"schema {schema}" in str(info.value)
    with pytest.raises(StoreError, match=re.escape("schema version '0.9'")):
        await store.get_session("s2")
    await store.close()


async def test_bodies_keep_every_character_and_key_order(postgres_dsn: str, schema: str) -> None:
    """Bodies are the JSON text itself: NUL characters (which JSONB refuses) survive, and the
    keys of user dicts keep their order."""
    store = PostgresStore(postgres_dsn, schema=schema)
    content = 'NUL \x00, emoji \U0001f642, quote " and backslash \\'
    message = records.message("m1", content=content, meta={"zeta": 1, "alpha": {"b": 2, "a": 1}})
    await store.append_messages("s1", [message])
    doc = await store.get_session("s1")
    assert doc is not None
    [stored] = doc.session.messages
    assert stored == message and stored.content == content
    assert list(stored.meta) == ["zeta", "alpha"] and list(stored.meta["alpha"]) == ["b", "a"]
    await store.close()


async def test_engine_drives_one_store_from_several_loops(postgres_dsn: str, schema: str) -> None:
    """The engine uses its store from the caller's loop and from the private loop behind
    ``engine.sync``, and from plain threads: one pool serves them all."""
    store = PostgresStore(postgres_dsn, schema=schema)
    engine = ContextEngine(store)
    await engine.prepare_turn("s1", "from the test's loop")
    engine.sync.prepare_turn("s1", "through engine.sync inside a running loop")
    worker = threading.Thread(target=engine.sync.prepare_turn, args=("s1", "from a thread"))
    worker.start()
    worker.join()
    doc = await store.get_session("s1")
    assert doc is not None
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "from the test's loop",
        "through engine.sync inside a running loop",
        "from a thread",
    ]
    assert len(await store.list_turns("s1")) == 3
    await engine.close()
    await store.close()


def _append_in_process(dsn: str, writer: str, count: int, start: Barrier) -> None:
    async def run() -> None:
        store = open_store(dsn)
        start.wait(timeout=120)
        for i in range(count):
            await store.append_messages("shared", [_message(f"{writer}-{i:03d}")])
        await store.close()

    asyncio.run(run())


@pytest.mark.slow
async def test_two_processes_appending_to_one_session_lose_nothing(
    postgres_dsn: str, schema: str
) -> None:
    url = _with_query(postgres_dsn, f"ce_schema={schema}")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    writers = ["p1", "p2"]
    processes = [ctx.Process(target=_append_in_process, args=(url, w, 200, start)) for w in writers]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=300)
            assert process.exitcode == 0
    finally:
        for process in processes:
            process.kill()
    store = open_store(url)
    doc = await store.get_session("shared")
    assert doc is not None
    ids = [m.message_id for m in doc.session.messages]
    assert len(ids) == len(set(ids)) == 400
    for writer in writers:
        assert [i for i in ids if i and i.startswith(writer)] == [
            f"{writer}-{i:03d}" for i in range(200)
        ]
    assert await store.get_version("shared") == 400
    await store.close()


# -- pooling and closing --------------------------------------------------------------------------


async def test_pool_is_bounded(postgres_dsn: str, schema: str, sql: Any) -> None:
    name = f"ce-pool-{secrets.token_hex(3)}"
    dsn = _with_query(postgres_dsn, f"application_name={name}")
    store = PostgresStore(dsn, schema=schema, pool_size=2)

    async def write(n: int) -> None:
        for i in range(5):
            await store.append_messages(f"s{n}", [_message(f"m{i}")])

    await asyncio.gather(*(write(n) for n in range(12)))
    assert len(await store.list_sessions()) == 12
    (connections,) = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchone()
    assert 1 <= connections <= 2
    await store.close()


async def test_closed_store_raises_store_error(postgres_dsn: str, schema: str) -> None:
    store = PostgresStore(postgres_dsn, schema=schema)
    await store.close()
    await store.close()  # closing twice is harmless
    with pytest.raises(StoreError, match="closed"):
        await store.get_session("s1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pool_size": 0}, "pool_size"),
        ({"pool_timeout": 0}, "pool_timeout"),
        ({"connect_timeout": 0}, "connect_timeout"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PostgresStore("postgresql://postgres@127.0.0.1:1/x", **kwargs)


# -- DSNs, ce_schema and open_store ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://h/db", ("postgresql://h/db", None)),
        ("postgresql://h/db?ce_schema=abc", ("postgresql://h/db", "abc")),
        (
            "postgres://u:p%3Fw@h:5/db?sslmode=require&ce_schema=x_1&options=-c%20a%3Db",
            ("postgres://u:p%3Fw@h:5/db?sslmode=require&options=-c%20a%3Db", "x_1"),
        ),
        (
            "postgresql://h/db?application_name=a+b",
            ("postgresql://h/db?application_name=a+b", None),
        ),
        ("postgresql://h/db?ce%5Fschema=enc%5Fd", ("postgresql://h/db", "enc_d")),
        ("host=h dbname=db", ("host=h dbname=db", None)),
    ],
)
def test_split_schema_keeps_the_other_parameters_verbatim(
    dsn: str, expected: tuple[str, str | None]
) -> None:
    assert split_schema(dsn) == expected


def test_split_schema_rejects_a_repeated_schema() -> None:
    with pytest.raises(StoreError, match="ce_schema 2 times"):
        split_schema("postgresql://h/db?ce_schema=a&ce_schema=b")


async def test_open_store_opens_postgres_urls_with_their_query(
    postgres_dsn: str, schema: str, sql: Any
) -> None:
    name = f"ce-open-{secrets.token_hex(3)}"
    url = _with_query(postgres_dsn, f"sslmode=disable&ce_schema={schema}&application_name={name}")
    store = open_store(url)
    assert isinstance(store, PostgresStore) and store.schema == schema
    await store.append_messages("s1", [_message("m1")])
    (connected,) = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchone()
    assert connected >= 1
    await store.close()

    short = open_store(url.replace("postgresql://", "postgres://", 1))
    assert isinstance(short, PostgresStore)
    assert await short.get_version("s1") == 1
    await short.close()


async def test_default_schema_is_ce(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn)
    try:
        assert store.schema == DEFAULT_SCHEMA == "ce"
    finally:
        await store.close()
        _drop(postgres_dsn, DEFAULT_SCHEMA)


@pytest.mark.parametrize(
    ("query", "schema", "message"),
    [
        ("ce_schema=a", "b", "differs"),
        ("ce_schema=Upper", None, "invalid schema name 'Upper'"),
        ("", "x; DROP TABLE y", "invalid schema name"),
        ("", "a" * 64, "invalid schema name"),
    ],
)
def test_bad_schema_names_are_refused(
    postgres_dsn: str, query: str, schema: str | None, message: str
) -> None:
    with pytest.raises(StoreError, match=message):
        PostgresStore(_with_query(postgres_dsn, query), schema=schema)


def test_other_schemes_still_refuse_query_strings() -> None:
    with pytest.raises(StoreError, match="no query string"):
        open_store("sqlite:///ce.db?mode=ro")


# -- errors ---------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_unreachable_server_raises_store_error_naming_it() -> None:
    port = _closed_port()
    dsn = f"postgresql://postgres:hunter2-secret@127.0.0.1:{port}/somedb"
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        open_store(dsn)
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"127.0.0.1:{port}/somedb" in message and "postgres@" in message
    assert "hunter2" not in message and "hunter2" not in repr(info.value.__cause__)


def test_silent_server_times_out_with_store_error() -> None:
    """A server that accepts the connection but never answers: the open gives up after
    ``connect_timeout`` instead of hanging."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreError, match=re.escape(f"127.0.0.1:{port}/db")):
            PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/db", connect_timeout=2)
        assert 1.5 < time.monotonic() - started < 10


def test_wrong_database_or_user_raises_store_error_naming_it(postgres_dsn: str) -> None:
    missing_db = urlunsplit(urlsplit(postgres_dsn)._replace(path="/no_such_database_here"))
    with pytest.raises(StoreError, match="no_such_database_here") as info:
        open_store(missing_db)
    assert "does not exist" in str(info.value)

    missing_user = _as_user(postgres_dsn, "no_such_role:pw-xyz")
    with pytest.raises(StoreError, match="no_such_role@") as info:
        PostgresStore(missing_user)
    assert "pw-xyz" not in str(info.value)


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("postgresql://u:s3cr3t-pw@[127.0.0.1/db", "invalid PostgreSQL DSN"),
        ("postgresql://u:s3cr3t-pw@127.0.0.1/db?nonsense=1", "invalid PostgreSQL DSN"),
        ("host=127.0.0.1 password='s3cr3t-pw", "invalid PostgreSQL DSN"),
        ("postgresql://u:s3cr3t-pw@127.0.0.1:notaport/db", 'invalid integer value "notaport"'),
        ("host=127.0.0.1 password=s3cr3t-pw port=notaport", 'invalid integer value "notaport"'),
    ],
)
def test_malformed_dsn_raises_store_error_without_the_password(dsn: str, reason: str) -> None:
    with pytest.raises(StoreError, match=re.escape(reason)) as info:
        PostgresStore(dsn)
    assert "s3cr3t" not in str(info.value)


_WITHOUT_PSYCOPG = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("psycopg", "psycopg_pool", "psycopg_binary"):
            raise ImportError(f"no module named {name!r}")

sys.meta_path.insert(0, Block())
from ce.core.errors import StoreError
from ce.core.stores import PostgresStore, open_store

try:
    open_store("postgresql://postgres@127.0.0.1:5432/test")
except StoreError as exc:
    print(exc)
"""


def test_stores_import_without_the_driver_and_name_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PSYCOPG], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "ce-core[postgres]" in done.stdout
