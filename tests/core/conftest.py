"""Fixtures shared by the ce.core tests: a throw-away PostgreSQL database, and store objects
on one fresh SQLite file or PostgreSQL schema."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

POSTGRES_DSN_ENV = "CE_TEST_POSTGRES_DSN"
DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The URL of a fresh, empty database created for this test run and dropped after it.

    The server is the one ``$CE_TEST_POSTGRES_DSN`` names (a ``postgresql://`` URL of a role
    that may create databases), else ``postgresql://postgres@127.0.0.1:5432/test``. Other
    processes may connect to the URL too. It keeps the query string of the server's URL
    (none by default) and names no ``ce_schema``: give each store its own schema
    (``PostgresStore(dsn, schema=...)`` or a ``ce_schema`` query parameter). Skips, after at
    most ~3 s, when psycopg is not installed, the server does not answer or the role may not
    create databases.
    """
    admin_dsn = os.environ.get(POSTGRES_DSN_ENV) or DEFAULT_POSTGRES_DSN
    how = (
        f"PostgreSQL tests need psycopg (pip install 'ce-core[postgres]') and a server at "
        f"{DEFAULT_POSTGRES_DSN} (trust auth) or the URL in ${POSTGRES_DSN_ENV}"
    )
    try:
        import psycopg
    except ImportError:
        pytest.skip(f"{how}: psycopg is not installed")
    try:
        admin = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"{how}: {str(exc).strip()}")
    name = f"ce_test_{os.getpid()}_{secrets.token_hex(4)}"
    with admin:
        try:
            admin.execute(f'CREATE DATABASE "{name}"')
        except psycopg.Error as exc:
            pytest.skip(f"{how}: the role cannot create a database: {str(exc).strip()}")
        try:
            yield urlunsplit(urlsplit(admin_dsn)._replace(path=f"/{name}"))
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


Opener = Callable[[], Any]
"""Opens another store object on the same storage (another worker's)."""


@pytest.fixture(params=["sqlite", "sqlite-no-lock-files", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens store objects on one fresh SQLite file (with its per-session lock files, where
    the platform has them, and without) or PostgreSQL schema."""
    from ce.core.stores import PostgresStore, SQLiteStore

    if request.param.startswith("sqlite"):
        path = tmp_path / "shared.db"
        lock_files = request.param == "sqlite"
        yield lambda: SQLiteStore(path, lock_files=lock_files)
        return
    psycopg = pytest.importorskip("psycopg")
    dsn = request.getfixturevalue("postgres_dsn")
    schema = f"w_{secrets.token_hex(6)}"
    yield lambda: PostgresStore(dsn, schema=schema, pool_size=4)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
