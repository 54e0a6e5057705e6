"""``PostgresStore``: the scale-out store — sessions in PostgreSQL, a row per record, shared by
any number of processes on any number of machines.

Driver (extra ``ce-core[postgres]``: psycopg 3 and psycopg-pool): a thread-safe, synchronous
``psycopg_pool.ConnectionPool``, the pattern :class:`~ce.core.stores.SQLiteStore` uses:
awaited, a call's work runs in a worker thread; driven inline by ``engine.sync``, on the
calling thread. The engine drives ONE store object from any number of event loops and
threads, and asyncpg connections and async pools belong to the loop that created them, so a
second loop would fail on them; a pool used from threads belongs to no loop. This module
imports without the driver; :class:`PostgresStore` raises :class:`~ce.core.errors.StoreError`
naming the extra when it is missing.

DSN: a libpq URL (``postgresql://user:password@host:port/dbname?sslmode=require``, also
``postgres://``) or key/value string (``host=... dbname=...``). A URL may carry the extra
query parameter ``ce_schema=NAME``: the schema the store's tables live in (default ``ce``);
it is removed before connecting. Several independent stores can share one database, each in
its own schema. Schema names are lower-case SQL identifiers (``[a-z_][a-z0-9_]*``).

Layout (:data:`LAYOUT_VERSION`, recorded in the schema's ``layout`` table): ``sessions`` holds
one row per session (version, schema version, the ``summary`` / ``run_state`` / ``meta`` JSON,
``user_id`` from ``meta.actor.user_id`` for compliance queries, and the session's ``epoch`` —
see :class:`~ce.core.stores.base.SessionUpdate` — renewed when the session is created or its
records are replaced or removed); ``messages``, ``tool_calls``, ``model_usage``,
``evidences``, ``context_blocks``, ``tasks`` and ``turns`` hold one row per record
(``session_id``, an ordering ``seq``, the record id — unique per session — the version of the
commit that wrote it, and the record's JSON ``body``); ``audit`` holds the compliance log.
Bodies are TEXT, byte for byte the JSON every other store keeps: JSONB would reorder the keys
of user dicts and refuses ``\\u0000`` in strings. Each document table has an index on
``(session_id, version)``, so :meth:`PostgresStore.read_since` reads only the rows written
after a version.

Since layout 2, ``messages`` also keep the message's ``role`` and ``evidences`` whether the
evidence may state facts (``facts``, see :func:`~ce.core.schema._document.may_state_facts`) and
what it belongs to (``link``, see :func:`~ce.core.schema._document.evidence_link`), each with a
partial index (system messages; evidences stating facts; linked evidences), so
:meth:`PostgresStore.read_tail` reads a session's newest records without reading the rest.
Upgrading a layout-1 schema fills the three columns from the stored bodies.

Opening a store creates or upgrades the layout under a transaction-level advisory lock, so
many workers may open a fresh database at once. A commit locks the session's row
(``SELECT ... FOR UPDATE``), inserts only the new rows (``ON CONFLICT DO NOTHING``; blocks and
tasks are upserted) and bumps the version: appending costs the same at 10 and at 10,000
stored messages.

Compliance deletes ``DELETE`` the rows in the same transaction as their audit record; the
server reclaims the dead row versions at its next (auto)vacuum. Copies outside the database
(WAL archives, backups, replicas' lag) follow the operator's retention.
"""

from __future__ import annotations

import functools
import getpass
import os
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import unquote

from ce.core._drive import run_blocking
from ce.core.errors import StoreError
from ce.core.primitives import Clock, IdGenerator
from ce.core.schema import (
    ContextBlock,
    Evidence,
    Message,
    PutResult,
    SessionDocument,
    TurnRecord,
)
from ce.core.stores import _pg_read, _pg_sql
from ce.core.stores._pg_layout import LAYOUT_VERSION, migrate
from ce.core.stores._writers import SessionWriter
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    BlockFilter,
    EvidenceFilter,
    SessionChanges,
    SessionSlice,
    SessionUpdate,
    check_slice_size,
    filter_blocks,
    filter_evidences,
)

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

    Conn = Connection[tuple[Any, ...]]

__all__ = ["DEFAULT_SCHEMA", "LAYOUT_VERSION", "SCHEMA_PARAM", "PostgresStore", "split_schema"]

DEFAULT_SCHEMA = "ce"
"""The schema a store uses when neither ``schema=`` nor the DSN names one."""

SCHEMA_PARAM = "ce_schema"
"""The DSN query parameter naming the schema (removed before connecting)."""

_INSTALL_HINT = "pip install 'ce-core[postgres]'"

_SCHEMES = ("postgresql://", "postgres://")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")
_DEFAULT_CONNECT_TIMEOUT = 5

_P = ParamSpec("_P")
_T = TypeVar("_T")


def split_schema(dsn: str) -> tuple[str, str | None]:
    """``dsn`` without its ``ce_schema`` query parameter, and that parameter's value (None
    when absent). The other parameters are kept exactly as written. Key/value DSNs are
    returned unchanged. Raises :class:`StoreError` when ``ce_schema`` is given twice."""
    if not dsn.startswith(_SCHEMES) or "?" not in dsn:
        return dsn, None
    base, query = dsn.split("?", 1)
    kept: list[str] = []
    found: list[str] = []
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if unquote(key) == SCHEMA_PARAM:
            found.append(unquote(value))
        elif item:
            kept.append(item)
    if len(found) > 1:
        raise StoreError(f"the DSN names {SCHEMA_PARAM} {len(found)} times")
    return (f"{base}?{'&'.join(kept)}" if kept else base), (found[0] if found else None)


_PASSWORDS = (
    re.compile(r"\A[a-z]+://[^:@/?#]*:([^@]*)@"),  # URL user info
    re.compile(r"[?&]password=([^&]*)"),  # URL query parameter
    re.compile(r"password\s*=\s*'((?:[^'\\]|\\.)*)'"),  # quoted key/value
    re.compile(r"password\s*=\s*([^\s']+)"),  # plain key/value
)


def _redact(text: str, dsn: str) -> str:
    """``text`` with the DSN's password (as written and decoded) replaced by ``***``, also
    from DSNs too malformed to parse."""
    secrets = {found for pattern in _PASSWORDS for found in pattern.findall(dsn) if found}
    secrets |= {unquote(secret) for secret in secrets}
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _describe(params: dict[str, Any], schema: str) -> str:
    """Where a store connects, as libpq resolves the parts the DSN leaves out; no password."""
    user = params.get("user") or os.environ.get("PGUSER") or getpass.getuser()
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "local"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    dbname = params.get("dbname") or os.environ.get("PGDATABASE") or user
    return f"PostgreSQL {user}@{host}:{port}/{dbname} (schema {schema})"


def _configure(conn: Conn) -> None:
    """Pin READ COMMITTED, whatever the server's default: writers are serialized by row and
    advisory locks, and a statement after a lock wait must see what the holder committed."""
    from psycopg import IsolationLevel

    conn.isolation_level = IsolationLevel.READ_COMMITTED


class PostgresStore(BaseStore):
    """Sessions in a PostgreSQL schema, one row per record (see the module docstring).

    ``dsn`` is a libpq URL or key/value string; ``schema`` (or ``ce_schema=`` in a URL)
    selects the schema, created when missing (giving both with different values is an
    error). The store keeps a pool of at most ``pool_size`` connections; a call waits up to
    ``pool_timeout`` seconds for a free one. ``connect_timeout`` bounds each connection
    attempt in whole seconds (libpq waits at least 2); None uses the DSN's
    ``connect_timeout``, else 5. Writes to one session are serialized by a row lock, so any
    number of stores in any number of processes may share a schema, and one store may be
    used from several threads and event loops at once. Calls are not retried: a call that
    meets a connection the server dropped (a restart) raises :class:`StoreError`, and the
    pool replaces that connection.

    Opening connects, creates or upgrades the layout and opens the pool. Raises
    :class:`StoreError` naming user, host, port, database and schema (never the password)
    when psycopg is not installed, the DSN is malformed, the server cannot be reached in
    time, the login or database is refused, or the schema's layout is newer than this
    code's; :class:`ValueError` for a bad ``pool_size``, ``pool_timeout`` or
    ``connect_timeout``. Operations raise :class:`StoreError` when the server fails them or
    the store is closed.
    """

    keeps_json = True
    keeps_token_counts = True

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        pool_size: int = 10,
        pool_timeout: float = 30.0,
        connect_timeout: int | None = None,
        id_generator: IdGenerator | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(id_generator=id_generator, clock=clock)
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, not {pool_size}")
        if pool_timeout <= 0:
            raise ValueError(f"pool_timeout must be > 0, not {pool_timeout}")
        if connect_timeout is not None and connect_timeout < 1:
            raise ValueError(f"connect_timeout must be >= 1 second, not {connect_timeout}")
        conninfo, dsn_schema = split_schema(dsn)
        if schema is not None and dsn_schema is not None and schema != dsn_schema:
            raise StoreError(f"schema {schema!r} differs from the DSN's {SCHEMA_PARAM}")
        self.schema = schema or dsn_schema or DEFAULT_SCHEMA
        """The schema holding this store's tables."""
        if not _SCHEMA_NAME.match(self.schema):
            raise StoreError(
                f"invalid schema name {self.schema!r}: use a lower-case SQL identifier"
                " ([a-z_][a-z0-9_]*, at most 63 characters)"
            )
        self._s = f'"{self.schema}"'
        try:
            import psycopg
            import psycopg_pool
            from psycopg.conninfo import conninfo_to_dict
        except ImportError as exc:
            raise StoreError(f"PostgresStore needs psycopg 3: {_INSTALL_HINT}") from exc
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.Error as exc:
            raise StoreError(f"invalid PostgreSQL DSN: {_redact(str(exc), dsn)}") from None
        self._where = _describe(params, self.schema)
        try:
            timeout = connect_timeout or int(params.get("connect_timeout") or 0)
        except ValueError:
            raise StoreError(
                f"{self._where}: the DSN's connect_timeout is not an integer"
            ) from None
        timeout = timeout or _DEFAULT_CONNECT_TIMEOUT
        connect_kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": timeout}
        try:
            with psycopg.connect(conninfo, **connect_kwargs) as conn:
                _configure(conn)
                migrate(conn, self.schema, self._s)
        except (psycopg.Error, StoreError) as exc:
            reason = _redact(str(exc), dsn).strip()
            raise StoreError(f"{self._where}: cannot open the store: {reason}") from None
        pool: ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            conninfo,
            kwargs=connect_kwargs,
            min_size=1,
            max_size=pool_size,
            timeout=pool_timeout,
            configure=_configure,
            name=f"ce-{self.schema}",
            open=False,
        )
        try:
            pool.open(wait=True, timeout=timeout + 1)
        except psycopg.Error as exc:
            pool.close()
            reason = _redact(str(exc), dsn)
            raise StoreError(f"{self._where}: cannot open the pool: {reason}") from None
        self._pool: ConnectionPool[Conn] | None = pool

    def __repr__(self) -> str:
        return f"PostgresStore({self._where})"

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(
        self,
        fn: Callable[Concatenate[Conn, str, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        return await run_blocking(functools.partial(self._call, fn, *args, **kwargs))

    def _call(
        self,
        fn: Callable[Concatenate[Conn, str, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """Run ``fn`` on a pooled connection (in a worker thread); driver errors become
        :class:`StoreError` naming the server."""
        import psycopg

        pool = self._pool
        if pool is None:
            raise StoreError(f"{self._where}: store is closed")
        try:
            with pool.connection() as conn:
                return fn(conn, self._s, *args, **kwargs)
        except (psycopg.Error, StoreError) as exc:
            raise StoreError(f"{self._where}: {exc}") from exc

    def _on(
        self,
        conn: Conn,
        fn: Callable[Concatenate[Conn, str, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """Run ``fn`` on a connection the caller holds; driver errors become
        :class:`StoreError` naming the server."""
        import psycopg

        try:
            return fn(conn, self._s, *args, **kwargs)
        except (psycopg.Error, StoreError) as exc:
            raise StoreError(f"{self._where}: {exc}") from exc

    # -- a session held for one writer -------------------------------------------------------

    @asynccontextmanager
    async def writer(self, session_id: str) -> AsyncIterator[SessionWriter]:
        """Hold the session for one writer (see :class:`~ce.core.stores.WriterStore`): a
        transaction on a pooled connection holding the session's row lock from the read to
        the commit; other writers of the session wait for it, other sessions do not."""
        import psycopg

        pool = self._pool
        if pool is None:
            raise StoreError(f"{self._where}: store is closed")
        try:
            conn = await run_blocking(pool.getconn, undo=pool.putconn)
        except psycopg.Error as exc:
            raise StoreError(f"{self._where}: {exc}") from exc
        held = _Writer(self, conn, session_id)
        try:
            await held.hold()
            yield held
        finally:
            try:
                await run_blocking(functools.partial(self._on, conn, _end, "ROLLBACK"))
            finally:
                pool.putconn(conn)

    # -- writes -----------------------------------------------------------------------------

    async def _commit(
        self, session_id: str, changes: SessionChanges, expected_version: int | None
    ) -> PutResult:
        version, epoch = await self._run(_pg_sql.commit, session_id, changes, expected_version)
        return PutResult(success=True, version=version, epoch=epoch)

    async def _put_session(
        self, session_id: str, doc: SessionDocument, expected_version: int | None
    ) -> PutResult:
        version, epoch = await self._run(_pg_sql.put, session_id, doc, expected_version)
        return PutResult(success=True, version=version, epoch=epoch)

    async def delete_session(self, session_id: str) -> bool:
        record = self._audit_record("delete_session", session_id)
        return await self._run(_pg_sql.delete_session, record)

    async def delete_evidence(self, session_id: str, evidence_id: str) -> bool:
        record = self._audit_record("delete_evidence", session_id, evidence_id)
        return await self._run(_pg_sql.delete_evidence, record)

    # -- reads ------------------------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionDocument | None:
        return await self._run(_pg_read.load, session_id)

    async def get_version(self, session_id: str) -> int:
        return await self._run(_pg_read.version, session_id)

    async def read_since(
        self, session_id: str, version: int = 0, epoch: str = ""
    ) -> SessionUpdate | None:
        """What changed after ``version`` of ``epoch``: only the rows written since, found
        through the version indexes, in one statement (one snapshot)."""
        return await self._run(_pg_read.read_since, session_id, version, epoch)

    async def read_tail(
        self, session_id: str, *, messages: int, evidences: int
    ) -> SessionSlice | None:
        """The newest records of the session (see :class:`~ce.core.stores.base.SliceStore`),
        as :class:`~ce.core.stores.SQLiteStore` reads them: two statements in one read-only
        REPEATABLE READ transaction, reading the slice's rows through the tables' keys and
        partial indexes, never the whole session; None when it does not exist."""
        check_slice_size(messages, evidences)
        return await self._run(_pg_read.read_tail, session_id, messages, evidences)

    async def read_messages(self, session_id: str, message_ids: Sequence[str]) -> list[Message]:
        """The session's messages with one of ``message_ids`` (see
        :class:`~ce.core.stores.base.SliceStore`), through the messages' key."""
        if not message_ids:
            return []
        return await self._run(_pg_read.messages_by_id, session_id, list(message_ids))

    async def read_evidences(self, session_id: str, dedup_keys: Sequence[str]) -> list[Evidence]:
        """The session's evidences with one of ``dedup_keys`` (see
        :class:`~ce.core.stores.base.SliceStore`), through the ``dedup`` index."""
        if not dedup_keys:
            return []
        return await self._run(_pg_read.evidences_by_dedup, session_id, list(dedup_keys))

    async def get_evidence(self, session_id: str, evidence_id: str) -> Evidence | None:
        return await self._run(_pg_read.evidence, session_id, evidence_id)

    async def list_evidences(
        self, session_id: str, filter: EvidenceFilter | None = None
    ) -> list[Evidence]:
        evidences = await self._run(_pg_read.records, "evidences", Evidence, session_id)
        return filter_evidences(evidences, filter)

    async def list_context_blocks(
        self, session_id: str, filter: BlockFilter | None = None
    ) -> list[ContextBlock]:
        blocks = await self._run(_pg_read.records, "context_blocks", ContextBlock, session_id)
        return filter_blocks(blocks, filter)

    async def _list_turns(self, session_id: str, limit: int | None) -> list[TurnRecord]:
        return await self._run(_pg_read.turns, session_id, limit)

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord | None:
        return await self._run(_pg_read.turn, session_id, turn_id)

    async def list_sessions(self, user_id: str | None = None) -> list[str]:
        return await self._run(_pg_read.session_ids, user_id)

    async def audit_log(self, session_id: str | None = None) -> list[AuditRecord]:
        return await self._run(_pg_read.audit, session_id)

    async def close(self) -> None:
        """Close the pool's connections; later calls raise :class:`StoreError`."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await run_blocking(pool.close)


def _end(conn: Conn, _: str, statement: str) -> None:
    """End the writer's transaction (``COMMIT`` or ``ROLLBACK``), if it is still open."""
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status != TransactionStatus.IDLE:
        conn.execute(statement)


class _Writer:
    """The :class:`SessionWriter` of :meth:`PostgresStore.writer`."""

    def __init__(self, store: PostgresStore, conn: Conn, session_id: str) -> None:
        self._store = store
        self._conn = conn
        self._session_id = session_id
        self._held = False
        self._version: int | None = None  # after the block's last commit

    async def hold(self) -> None:
        await run_blocking(
            functools.partial(self._store._on, self._conn, _pg_sql.hold, self._session_id)
        )
        self._held = True

    async def read_since(self, version: int = 0, epoch: str = "") -> SessionUpdate | None:
        update = await run_blocking(
            functools.partial(
                self._store._on, self._conn, _pg_read.read_since, self._session_id, version, epoch
            )
        )
        # a session created by this block has only its version-0 row so far
        return update if update is not None and update.version else None

    async def commit(self, changes: SessionChanges) -> PutResult:
        checked = self._store._checked(self._session_id, changes)
        if not self._held:  # a second commit of the block: hold the session again
            await self.hold()
        self._held = False
        version, epoch = await run_blocking(
            functools.partial(
                self._store._on, self._conn, _commit_held, self._session_id, checked, self._version
            )
        )
        self._version = version
        return PutResult(success=True, version=version, epoch=epoch)


def _commit_held(
    conn: Conn, s: str, session_id: str, changes: SessionChanges, expected: int | None
) -> tuple[int, str | None]:
    """Apply ``changes`` in the held transaction and end it: ``COMMIT``, or ``ROLLBACK`` when
    the commit fails or stores nothing (no version-0 row of a new session is left)."""
    try:
        version, epoch = _pg_sql.commit(conn, s, session_id, changes, expected)
    except BaseException:
        _end(conn, s, "ROLLBACK")
        raise
    _end(conn, s, "COMMIT" if version else "ROLLBACK")
    return version, epoch
