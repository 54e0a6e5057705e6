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
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

import ce.core.stores._pg_layout as pg_layout
import ce.core.stores._pg_sql as pg_sql
from ce.core.engine import ContextEngine
from ce.core.errors import StoreError
from ce.core.schema import (
    SCHEMA_VERSION,
    BlockType,
    ContextBlock,
    Evidence,
    EvidenceLinks,
    EvidenceSource,
    EvidenceType,
    Message,
    Priority,
    Ref,
    Role,
    RunState,
    RunStatus,
    SourceKind,
    ToolCallRequest,
)
from ce.core.schema._document import evidence_link, may_state_facts
from ce.core.stores import PostgresStore, SessionChanges, SQLiteStore, Store, open_store
from ce.core.stores._rows import record_json, record_rows
from ce.core.stores.base import SessionSlice
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


# -- read_tail ------------------------------------------------------------------------------------


def _assistant(key: str, *calls: str) -> Message:
    requests = [ToolCallRequest(tool_call_id=call, name="search") for call in calls]
    return records.message(key, Role.ASSISTANT, tool_calls=requests or None)


def _tool(key: str, call: str) -> Message:
    return records.message(key, Role.TOOL, tool_call_id=call, name="search")


def _linked(key: str, call: str, content: str = "a result") -> Evidence:
    """The result of tool call ``call``."""
    return records.evidence(
        key,
        EvidenceType.TOOL_RESULT,
        SourceKind.TOOL,
        content=content,
        links=EvidenceLinks(tool_call_id=call),
    )


def _gist(key: str, message_id: Any) -> Evidence:
    """A model-written summary of message ``message_id``."""
    return records.evidence(
        key, EvidenceType.LLM_OUTPUT, SourceKind.LLM, metadata={"summary_of": message_id}
    )


def _entity(key: str, entity: Any = "acme", field: Any = "price", **fields: Any) -> Evidence:
    """A document stating ``field`` of ``entity`` in its metadata (plain-text content)."""
    return records.evidence(key, metadata={"entity": entity, "field": field}, **fields)


_TAIL_COMMITS = [
    SessionChanges(
        messages=[records.message("sys", Role.SYSTEM), records.message("u1")],
        evidences=[
            records.evidence("e1", content='{"price": 1}'),  # JSON: states facts
            records.evidence("e2", content="plain text"),
        ],
    ),
    SessionChanges(
        messages=[_assistant("a1", "tc1"), _tool("t1", "tc1")],
        tool_calls=[records.tool_call("tc1")],
        model_usage=[records.usage("use1")],
        evidences=[
            _entity("e3"),  # entity / field metadata: states facts
            records.evidence("e4", EvidenceType.LLM_OUTPUT, content="[1, 2]"),  # never
            _linked("r1", "tc1", content='{"status": "shipped"}'),
            # linked to a call a later message declares; PostgreSQL text cannot hold its
            # U+0000, nor tell it from the U+0001 of the next one by the column alone
            _linked("n1", "c\x00x"),
            _linked("n0", "c\x01x"),
        ],
    ),
    SessionChanges(
        messages=[records.message("u2")],
        evidences=[records.evidence("e5", content=" \n\t\u2028[1]")],  # JSON after whitespace
        context_blocks=[
            ContextBlock(
                block_id="b1",
                block_type=BlockType.MEMORY,
                priority=Priority.HIGH,
                refs=[Ref(evidence_id="e2"), Ref(evidence_id="not-stored")],
            )
        ],
        tasks=[records.task("task1")],
        turns=[records.turn("turn1")],
    ),
    SessionChanges(
        # declared in the reverse of their stored order
        messages=[_assistant("a2", "tc3", "tc2"), _tool("t2", "tc2"), _tool("t3", "tc3")],
        tool_calls=[records.tool_call("tc2"), records.tool_call("tc3")],
        evidences=[
            _linked("r2", "tc2"),
            records.evidence("e6", content="plain again"),
            records.evidence("e7", content='{"price": 2}', metadata={"original_of": "e1"}),
        ],
    ),
    SessionChanges(
        messages=[records.message("sys2", Role.SYSTEM), records.message("u3")],
        evidences=[_gist("g1", "u1"), _gist("g2", "a2")],
        summary=records.rich_changes().summary,
        run=RunState(run_id="run-1", status=RunStatus.MODEL_RUNNING),
        meta=records.meta("user-1"),
    ),
    SessionChanges(
        messages=[_assistant("a3", "c\x00x")],
        tool_calls=[records.tool_call("tc-undeclared")],
        evidences=[_gist("g3", "u3"), records.evidence("e8", content="newest")],
    ),
]
"""A session stored over six commits (versions 1 to 6): system messages, tool calls with
their records, results linked to calls, summaries of messages, evidences stating facts or not,
a block referring to an old evidence, tasks, usage and a turn record."""


def _stored(kind: str) -> list[Any]:
    """The records of ``_TAIL_COMMITS`` of one kind, in stored order."""
    return [record for changes in _TAIL_COMMITS for record in getattr(changes, kind)]


def _ids(items: list[Any], id_field: str) -> list[str]:
    return [getattr(item, id_field) for item in items]


async def _tail_session(store: Store, session_id: str = "s1") -> None:
    for version, changes in enumerate(_TAIL_COMMITS, start=1):
        assert (await store.commit(session_id, changes)).version == version


def _same_slice(got: SessionSlice | None, expected: SessionSlice | None) -> None:
    """``got`` holds what ``expected`` holds (their epochs are their stores' own)."""
    assert (got is None) == (expected is None)
    if got is None or expected is None:
        return
    assert got.changes == expected.changes
    assert (got.version, got.older_messages, got.older_evidences) == (
        expected.version,
        expected.older_messages,
        expected.older_evidences,
    )
    assert got.instruction == expected.instruction
    assert got.fact_sources == expected.fact_sources


async def test_read_tail_reads_what_sqlite_reads(
    postgres_dsn: str, schema: str, tmp_path: Path
) -> None:
    store = PostgresStore(postgres_dsn, schema=schema)
    lite = SQLiteStore(tmp_path / "tail.db")
    await _tail_session(store)
    await _tail_session(lite)
    epoch = (await store.read_since("s1")).epoch  # type: ignore[union-attr]
    head = _TAIL_COMMITS[4]

    # u3 and a3: the newest evidence, what goes with the two messages (n1: the result of
    # the call a3 declares, not n0, whose link differs from it in one character; g3: a
    # summary of u3) and e2, which the block refers to
    tail = await store.read_tail("s1", messages=2, evidences=1)
    assert tail is not None and (tail.version, tail.epoch) == (6, epoch)
    assert _ids(tail.changes.messages, "message_id") == ["u3", "a3"]
    assert _ids(tail.changes.evidences, "evidence_id") == ["e2", "n1", "g3", "e8"]
    assert tail.changes.tool_calls == []  # tc-undeclared: no message of the tail declares it
    assert (tail.older_messages, tail.older_evidences) == (9, 11)
    assert tail.instruction == records.message("sys2", Role.SYSTEM)
    # before the run of evidences: JSON, entity / field metadata, JSON after whitespace; not
    # plain text, not the model's own output, not an unredacted original
    assert _ids(tail.fact_sources, "evidence_id") == ["e1", "e3", "r1", "e5"]
    assert (tail.changes.summary, tail.changes.run, tail.changes.meta) == (
        head.summary,
        head.run,
        head.meta,
    )
    assert tail.changes.context_blocks == _TAIL_COMMITS[2].context_blocks
    assert tail.changes.tasks == [records.task("task1")]
    assert tail.changes.model_usage == [] and tail.changes.turns == []

    # from a2 on: its calls' records in stored order, their results and its summary
    tail = await store.read_tail("s1", messages=6, evidences=1)
    assert tail is not None
    assert _ids(tail.changes.messages, "message_id") == ["a2", "t2", "t3", "sys2", "u3", "a3"]
    assert _ids(tail.changes.evidences, "evidence_id") == ["e2", "n1", "r2", "g2", "g3", "e8"]
    assert _ids(tail.changes.tool_calls, "tool_call_id") == ["tc2", "tc3"]
    assert (tail.older_messages, tail.older_evidences) == (5, 9)
    assert tail.instruction == records.message("sys", Role.SYSTEM)

    # a tail longer than the session: all of it, no instruction or fact sources before it;
    # no run of evidences: only those that go with the messages and blocks
    tail = await store.read_tail("s1", messages=50, evidences=50)
    assert tail is not None and (tail.older_messages, tail.older_evidences) == (0, 0)
    assert tail.changes.messages == _stored("messages")
    assert tail.changes.evidences == _stored("evidences")
    assert _ids(tail.changes.tool_calls, "tool_call_id") == ["tc1", "tc2", "tc3"]
    assert tail.instruction is None and tail.fact_sources == []
    tail = await store.read_tail("s1", messages=50, evidences=0)
    assert tail is not None
    assert _ids(tail.changes.evidences, "evidence_id") == ["e2", "r1", "n1", "r2", "g1", "g2", "g3"]
    assert tail.older_evidences == 8 and _ids(tail.fact_sources, "evidence_id") == [
        "e1",
        "e3",
        "r1",
        "e5",
    ]

    # every size reads what SQLiteStore reads
    messages, evidences = len(_stored("messages")), len(_stored("evidences"))
    for m in range(1, messages + 2):
        for e in range(evidences + 2):
            _same_slice(
                await store.read_tail("s1", messages=m, evidences=e),
                await lite.read_tail("s1", messages=m, evidences=e),
            )

    assert await store.read_tail("missing", messages=5, evidences=5) is None
    for m, e in [(0, 5), (5, -1)]:
        with pytest.raises(ValueError, match="at least"):
            await store.read_tail("s1", messages=m, evidences=e)
    await store.close()
    await lite.close()


async def test_rows_keep_the_role_facts_and_link_of_their_records(
    postgres_dsn: str, schema: str, sql: Any
) -> None:
    """Commits, held writers and put_session fill the columns read_tail looks rows up by."""
    store = PostgresStore(postgres_dsn, schema=schema)
    await _tail_session(store)
    async with store.writer("s2") as writer:
        await writer.commit(
            SessionChanges(
                messages=[records.message("w-sys", Role.SYSTEM)],
                evidences=[_gist("w-gist", "w-sys")],
            )
        )
    doc = await store.get_session("s1")
    assert doc is not None
    await store.put_session(
        "s3",
        doc.model_copy(update={"session": doc.session.model_copy(update={"session_id": "s3"})}),
    )
    roles = sql.execute(
        f'SELECT session_id, message_id, role FROM "{schema}".messages ORDER BY 1, seq'
    ).fetchall()
    expected = [(m.message_id, m.role.value) for m in _stored("messages")]
    assert roles == [
        *(("s1", *row) for row in expected),
        ("s2", "w-sys", "system"),
        *(("s3", *row) for row in expected),
    ]
    tags = sql.execute(
        f'SELECT session_id, evidence_id, facts, link FROM "{schema}".evidences ORDER BY 1, seq'
    ).fetchall()
    expected = [
        (e.evidence_id, may_state_facts(e), pg_layout.link_value(evidence_link(e)))
        for e in _stored("evidences")
    ]
    assert tags == [
        *(("s1", *row) for row in expected),
        ("s2", "w-gist", False, "w-sys"),
        *(("s3", *row) for row in expected),
    ]
    assert [(i, f, link) for i, f, link in expected if f or link] == [
        ("e1", True, None),
        ("e3", True, None),
        ("r1", True, "tc1"),
        ("n1", False, "c\x01x"),
        ("n0", False, "c\x01x"),
        ("e5", True, None),
        ("r2", False, "tc2"),
        ("g1", False, "u1"),
        ("g2", False, "a2"),
        ("g3", False, "u3"),
    ]
    await store.close()


def _plans(conn: Any, query: str, params: dict[str, Any]) -> list[str]:
    """The plans of ``query`` with ``params``: the one for these values, and the generic one
    that a statement prepared by the driver (after a few runs) may get."""
    custom = "\n".join(line for (line,) in conn.execute(f"EXPLAIN {query}", params))
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", query)
    conn.execute(f"PREPARE tail_plan AS {numbered}")
    try:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        slots = ", ".join("%s" for _ in names)
        generic = psycopg.ClientCursor(conn).execute(  # EXECUTE's arguments are not bound
            f"EXPLAIN EXECUTE tail_plan({slots})", [params[name] for name in names]
        )
        return [custom, "\n".join(line for (line,) in generic)]
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE tail_plan")


async def test_read_tail_reads_the_slice_not_the_session(
    postgres_dsn: str, schema: str, sql: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """read_tail runs two statements in one read-only REPEATABLE READ transaction; neither
    scans a large table (with the values' plan or the generic one a statement the driver
    prepares may get), and neither takes more rows from the tables than it returns."""
    store = PostgresStore(postgres_dsn, schema=schema)
    lite = SQLiteStore(tmp_path / "large.db")
    for c in range(20):
        # every commit: a call and its result, 249 more messages, a summary of each one of
        # half of them, documents (every 50th states facts as JSON), a block
        changes = SessionChanges(
            messages=[
                _assistant(f"a{c}", f"tc{c}"),
                *(_message(f"m{c}-{i}", "x" * 200) for i in range(249)),
            ],
            tool_calls=[records.tool_call(f"tc{c}")],
            evidences=[
                _linked(f"e{c}-{i}", f"tc{c}", "{}")
                if i == 0
                else _gist(f"e{c}-{i}", f"m{c}-{i}")
                if i % 2
                else records.evidence(f"e{c}-{i}", content="{}" if i % 50 == 0 else "y" * 200)
                for i in range(250)
            ],
            context_blocks=[records.block(f"b{c}")],
        )
        await store.commit("large", changes)
        await lite.commit("large", changes)
    executed: list[tuple[str, Any]] = []
    original = psycopg.Connection.execute

    def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        executed.append((str(query), params))
        return original(self, query, params, **kwargs)

    async def traced_tail() -> SessionSlice | None:
        for table in ("sessions", "messages", "evidences", "tool_calls"):
            sql.execute(f'VACUUM ANALYZE "{schema}".{table}')
        executed.clear()
        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        try:
            return await store.read_tail("large", messages=300, evidences=10)
        finally:
            monkeypatch.undo()

    # the session alone in its tables (a plan may then expect to read much of them), then
    # among others, as in any real database
    for others in (0, 3):
        for n in range(others):
            await store.commit(
                f"other-{n}",
                SessionChanges(
                    messages=[_message(f"m{i}") for i in range(5000)],
                    tool_calls=[records.tool_call(f"tc{i}") for i in range(2000)],
                    evidences=[_gist(f"e{i}", f"m{i}") for i in range(5000)],
                ),
            )
        tail = await traced_tail()
        # the newest 300 messages: the last 50 of commit 18 and all of commit 19 (a19
        # declares tc19); the summaries of those messages, tc19's result and the newest 10
        # evidences
        _same_slice(tail, await lite.read_tail("large", messages=300, evidences=10))
        assert tail is not None
        assert (tail.older_messages, len(tail.changes.messages)) == (4700, 300)
        assert _ids(tail.changes.tool_calls, "tool_call_id") == ["tc19"]
        expected = [
            *(f"e18-{i}" for i in range(199, 249, 2)),
            "e19-0",
            *(f"e19-{i}" for i in range(1, 240, 2)),
            *(f"e19-{i}" for i in range(240, 250)),
        ]
        assert _ids(tail.changes.evidences, "evidence_id") == expected
        assert tail.older_evidences == 5000 - len(expected)
        assert len(tail.fact_sources) == 100 and len(tail.changes.context_blocks) == 20
        queries = [query for query, _ in executed]
        assert queries[0] == "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
        assert queries[1].startswith("WITH head AS")
        assert queries[2].startswith("SELECT 'link' AS kind")
        assert queries[3:] == ["COMMIT"]
        # the rows each statement takes from the tables (index entries aside) are rows of
        # the tail: those it returns, and for the second the linked ones of the run of 10
        # newest evidences (the first returned them), never the rest of the session's
        # (tables of a few pages aside: a scan is the fastest way to read those)
        large = ["messages", "evidences", "tool_calls"] if others else ["messages", "evidences"]
        for (query, params), run in zip(executed[1:3], (0, 10), strict=True):
            for plan in _plans(sql, query, params):
                assert not re.search(rf"Seq Scan on ({'|'.join(large)})\b", plan), plan
            with sql.transaction():  # the backend reports its counts between transactions
                before = _rows_read(sql, schema, large)
                returned = len(sql.execute(query, params).fetchall())
                read = _rows_read(sql, schema, large) - before
            assert 0 < read <= returned + run, (query, read, returned)
    await store.close()
    await lite.close()


def _rows_read(conn: Any, schema: str, tables: list[str]) -> int:
    """How many rows of the ``tables`` of ``schema`` the connection's backend has read from
    the tables themselves (scanned, or fetched through an index) and not yet reported."""
    (read,) = conn.execute(
        "SELECT COALESCE(sum(seq_tup_read + idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
        " WHERE schemaname = %s AND relname = ANY(%s)",
        (schema, tables),
    ).fetchone()
    return int(read)


# -- layout upgrade -------------------------------------------------------------------------------


_UPGRADED_MESSAGES = [
    records.message("sys-old", Role.SYSTEM),
    records.message("u1", content="NUL \x00 and a backslash \\u0000 in the content"),
    _assistant("a1", "tc1", "c\x00x", "c\\u0000x"),
    _tool("t1", "tc1"),
    records.message("sys-new", Role.SYSTEM, content="the newest instruction"),
    records.message("u2"),
]

_UPGRADED_EVIDENCES = [
    records.evidence("old", content="the oldest"),  # a block refers to it
    records.evidence("json-object", content='{"a": 1}'),
    records.evidence("json-array", content="[1]"),
    records.evidence("plain", content="no facts here"),
    records.evidence("keyed", content="ingested", metadata={"dedup_key": "rag_doc|k1"}),
    records.evidence("key-not-text", content="odd", metadata={"dedup_key": 5}),
    records.evidence("spaces", content=" \t\r\n\x0b\x0c\x1c\x85\xa0\u2028\u3000{}"),
    records.evidence("nul-first", content="\x00{}"),
    records.evidence("backslash-first", content="\\u0000{}"),
    records.evidence("zero-width-first", content="\u200b[]"),  # not whitespace to Python
    records.evidence("nul-inside", content='{"a": "\x00"}', metadata={"note": "b\x00"}),
    _entity("entity"),
    _entity("entity-with-nul", entity="a\x00"),
    _entity("empty-entity", entity=""),
    _entity("entity-not-text", entity=1),
    records.evidence("entity-only", metadata={"entity": "acme"}),
    records.evidence("model-output", EvidenceType.LLM_OUTPUT, content='{"a": 1}'),
    records.evidence("original", content="{}", metadata={"original_of": None}),
    records.evidence("empty", content=""),
    _linked("tool-result", "tc1", content='["x"]'),
    _linked("nul-link", "c\x00x"),
    _linked("backslash-link", "c\\u0000x"),
    records.evidence(
        "empty-link", links=EvidenceLinks(tool_call_id=""), metadata={"summary_of": "u1"}
    ),
    _gist("gist", "u2"),
    _gist("gist-not-text", 5),
    _gist("gist-empty", ""),
]


def _layout_1(conn: Any, schema: str) -> None:
    """Create schema ``schema`` at layout 1, as ``migrate`` did before layout 2."""
    s = f'"{schema}"'
    with conn.transaction():
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(
            f"CREATE TABLE {s}.layout (version INTEGER PRIMARY KEY,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for statement in pg_layout._LAYOUTS[0]:
            conn.execute(statement.format(s=s))
        conn.execute(f"INSERT INTO {s}.layout (version) VALUES (1)")


def _insert_layout_1(conn: Any, schema: str, session_id: str, changes: SessionChanges) -> None:
    """Store ``changes`` as one commit (version 1), as the layout-1 write path did."""
    s = f'"{schema}"'
    conn.execute(
        f"INSERT INTO {s}.sessions (session_id, version, schema_version, run_state, epoch)"
        " VALUES (%s, 1, %s, %s, %s)",
        (session_id, SCHEMA_VERSION, record_json(RunState()), "epoch-1"),
    )
    for table, rows in record_rows(changes).items():
        for seq, (record_id, body) in enumerate(rows):
            conn.execute(
                f"INSERT INTO {s}.{table} (session_id, seq, {pg_sql.RECORD_TABLES[table]},"
                " version, body) VALUES (%s, %s, %s, 1, %s)",
                (session_id, seq, record_id, body),
            )


async def test_layout_1_is_upgraded_with_role_facts_and_link_from_the_bodies(
    postgres_dsn: str, schema: str, sql: Any, tmp_path: Path
) -> None:
    changes = SessionChanges(
        messages=_UPGRADED_MESSAGES,
        tool_calls=[records.tool_call("tc1")],
        evidences=_UPGRADED_EVIDENCES,
        context_blocks=[
            ContextBlock(
                block_id="pin",
                block_type=BlockType.MEMORY,
                priority=Priority.HIGH,
                refs=[Ref(evidence_id="old")],
            )
        ],
    )
    _layout_1(sql, schema)
    _insert_layout_1(sql, schema, "s1", changes)
    columns = """SELECT table_name, column_name FROM information_schema.columns
        WHERE table_schema = %s AND column_name IN ('role', 'facts', 'link') ORDER BY 1, 2"""
    assert sql.execute(columns, (schema,)).fetchall() == []

    store = PostgresStore(postgres_dsn, schema=schema)
    assert pg_layout.LAYOUT_VERSION == LAYOUT_VERSION == 3
    layout = sql.execute(f'SELECT version FROM "{schema}".layout ORDER BY 1').fetchall()
    assert layout == [(1,), (2,), (3,)]
    assert sql.execute(columns, (schema,)).fetchall() == [
        ("evidences", "facts"),
        ("evidences", "link"),
        ("messages", "role"),
    ]
    indexes = sql.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND indexdef LIKE %s",
        (schema, "% WHERE %"),
    ).fetchall()
    assert sorted(indexes) == [
        ("evidences_by_dedup",),
        ("evidences_by_link",),
        ("evidences_facts",),
        ("messages_system",),
    ]
    keys = sql.execute(
        f'SELECT evidence_id, dedup FROM "{schema}".evidences WHERE dedup IS NOT NULL'
    ).fetchall()
    assert keys == [("keyed", "rag_doc|k1")]
    roles = sql.execute(f'SELECT message_id, role FROM "{schema}".messages ORDER BY seq')
    assert roles.fetchall() == [(m.message_id, m.role.value) for m in _UPGRADED_MESSAGES]
    tags = sql.execute(f'SELECT evidence_id, facts, link FROM "{schema}".evidences ORDER BY seq')
    assert tags.fetchall() == [
        (e.evidence_id, may_state_facts(e), pg_layout.link_value(evidence_link(e)))
        for e in _UPGRADED_EVIDENCES
    ]
    assert [e.evidence_id for e in _UPGRADED_EVIDENCES if may_state_facts(e)] == [
        "json-object",
        "json-array",
        "spaces",
        "nul-inside",
        "entity",
        "entity-with-nul",
        "tool-result",
    ]
    assert {e.evidence_id: evidence_link(e) for e in _UPGRADED_EVIDENCES if evidence_link(e)} == {
        "tool-result": "tc1",
        "nul-link": "c\x00x",
        "backslash-link": "c\\u0000x",
        "empty-link": "u1",
        "gist": "u2",
    }

    assert await store.get_session("s1") == records.expected_document("s1", changes)
    lite = SQLiteStore(tmp_path / "upgraded.db")
    await lite.commit("s1", changes)
    tail = await store.read_tail("s1", messages=1, evidences=1)
    assert tail is not None and tail.version == 1 and tail.epoch == "epoch-1"
    assert _ids(tail.changes.messages, "message_id") == ["u2"]
    assert _ids(tail.changes.evidences, "evidence_id") == ["old", "gist", "gist-empty"]
    assert tail.instruction == _UPGRADED_MESSAGES[4]
    for m in range(1, len(_UPGRADED_MESSAGES) + 2):
        for e in (0, 1, 2, 5, 10, 30):
            _same_slice(
                await store.read_tail("s1", messages=m, evidences=e),
                await lite.read_tail("s1", messages=m, evidences=e),
            )
    tail = await store.read_tail("s1", messages=4, evidences=0)
    assert tail is not None
    assert _ids(tail.changes.evidences, "evidence_id") == [
        "old",
        "tool-result",
        "nul-link",
        "backslash-link",
        "gist",
    ]

    # later commits write the three columns; the tail reaches back to the upgraded rows
    later = SessionChanges(
        messages=[records.message("u3")], evidences=[records.evidence("new", content="x")]
    )
    await store.commit("s1", later)
    await lite.commit("s1", later)
    tail = await store.read_tail("s1", messages=1, evidences=1)
    assert tail is not None and tail.version == 2
    assert _ids(tail.changes.evidences, "evidence_id") == ["old", "new"]
    assert tail.older_evidences == len(_UPGRADED_EVIDENCES) - 1
    assert tail.instruction == _UPGRADED_MESSAGES[4]
    assert tail.fact_sources == [e for e in _UPGRADED_EVIDENCES if may_state_facts(e)]
    _same_slice(tail, await lite.read_tail("s1", messages=1, evidences=1))
    await store.close()
    await lite.close()

    # opening the upgraded schema again changes nothing
    await PostgresStore(postgres_dsn, schema=schema).close()
    layout = sql.execute(f'SELECT version FROM "{schema}".layout ORDER BY 1').fetchall()
    assert layout == [(1,), (2,), (3,)]
    counts = sql.execute(
        "SELECT table_name FROM information_schema.columns"
        " WHERE table_schema = %s AND column_name = 'tokens' ORDER BY 1",
        (schema,),
    ).fetchall()
    assert counts == [("evidences",), ("messages",)]  # none stored for the upgraded rows
    assert sql.execute(f'SELECT count(tokens) FROM "{schema}".messages').fetchone() == (0,)


def test_upgrade_whitespace_is_what_python_strips() -> None:
    spaces = "".join(c for c in map(chr, range(0x110000)) if c.isspace())
    assert spaces == pg_layout._WHITESPACE


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


async def test_rows_an_older_ce_core_writes_get_their_tags(
    postgres_dsn: str, schema: str, sql: Any
) -> None:
    """During a rolling deploy a process of the previous ce-core keeps inserting rows
    without the tag columns: a trigger fills them in, so a partial read still finds them."""
    store = PostgresStore(postgres_dsn, schema=schema)
    await store.commit("s1", SessionChanges(messages=[_message("m1")]))
    system = Message(role=Role.SYSTEM, content="be brief", message_id="m0")
    linked = _linked("e1", "c9", content='{"order_id": 1, "status": "x"}')
    linked = linked.model_copy(update={"metadata": {"dedup_key": "tool_result|k9"}})
    s = f'"{schema}"'
    for table, column, record_id, body in (
        ("messages", "message_id", "m0", system.model_dump_json(exclude_none=True)),
        ("evidences", "evidence_id", "e1", linked.model_dump_json(exclude_none=True)),
    ):  # the previous layout's insert
        sql.execute(
            f"INSERT INTO {s}.{table} (session_id, seq, {column}, version, body)"
            f" SELECT 's1', COALESCE(MAX(seq) + 1, 0), %s, 2, %s FROM {s}.{table}"
            " WHERE session_id = 's1'",
            (record_id, body),
        )
    sql.execute(f"UPDATE {s}.sessions SET version = 2 WHERE session_id = 's1'")
    roles = sql.execute(f"SELECT role FROM {s}.messages ORDER BY seq").fetchall()
    assert roles == [("user",), ("system",)]
    tags = sql.execute(f"SELECT facts, link, dedup FROM {s}.evidences").fetchall()
    assert tags == [(True, "c9", "tool_result|k9")]
    await store.commit("s1", SessionChanges(messages=[_message("m2")]))
    part = await store.read_tail("s1", messages=1, evidences=0)
    assert part is not None and part.instruction == system
    assert [e.evidence_id for e in part.fact_sources] == ["e1"]
    assert await store.read_evidences("s1", ["tool_result|k9"]) == [linked]
    # this ce-core's own rows keep the values it wrote
    assert sql.execute(f"SELECT role FROM {s}.messages WHERE message_id = 'm2'").fetchone() == (
        "user",
    )
    await store.close()
