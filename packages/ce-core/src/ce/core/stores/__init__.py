"""Session stores: the ``Store`` protocol, its implementations and
:func:`open_store`.

========================  =====================================================================
URL                       store
========================  =====================================================================
``memory://``             :class:`MemoryStore` (nothing survives the process)
``sqlite:///rel/x.db``    :class:`SQLiteStore` at ``rel/x.db``, relative to the working directory
``sqlite:////abs/x.db``   :class:`SQLiteStore` at ``/abs/x.db``
``file:///abs/dir``       :class:`FileStore` in ``/abs/dir`` (``file://rel/dir`` is relative)
``postgresql://...``      :class:`PostgresStore` (extra ``ce-core[postgres]``) on that libpq URL;
                          ``postgres://`` too. Its query string is passed to libpq, except
                          ``ce_schema=NAME``, the schema holding the tables (default ``ce``)
========================  =====================================================================

:func:`default_store_url` is the store used when none is given (the engine's and the CLI's).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import unquote

from ce.core.errors import StoreError
from ce.core.stores._writers import SessionWriter, WriterStore
from ce.core.stores.base import (
    AuditRecord,
    BaseStore,
    BlockFilter,
    EvidenceFilter,
    SessionChanges,
    SessionSlice,
    SessionUpdate,
    SliceStore,
    Store,
    filter_blocks,
    filter_evidences,
    turn_config,
)
from ce.core.stores.file import FileStore
from ce.core.stores.memory import MemoryStore
from ce.core.stores.postgres import PostgresStore
from ce.core.stores.sqlite import SQLiteStore

__all__ = [
    "DEFAULT_STORE_URL",
    "STORE_URL_ENV",
    "AuditRecord",
    "BaseStore",
    "BlockFilter",
    "EvidenceFilter",
    "FileStore",
    "MemoryStore",
    "PostgresStore",
    "SQLiteStore",
    "SessionChanges",
    "SessionSlice",
    "SessionUpdate",
    "SessionWriter",
    "SliceStore",
    "Store",
    "WriterStore",
    "default_store_url",
    "filter_blocks",
    "filter_evidences",
    "local_store_path",
    "open_store",
    "turn_config",
]

STORE_URL_ENV = "CE_STORE_URL"
"""The environment variable naming the default store URL."""

DEFAULT_STORE_URL = "sqlite:///.ce/sessions.db"
"""The store used when neither a store nor ``CE_STORE_URL`` is given: an SQLite file under
``./.ce/``."""


def default_store_url() -> str:
    """``$CE_STORE_URL`` when it is set and not empty, else :data:`DEFAULT_STORE_URL`."""
    return os.environ.get(STORE_URL_ENV) or DEFAULT_STORE_URL


def local_store_path(url: str) -> str | None:
    """The file (SQLite) or directory (FileStore) a store URL names on this machine, or
    ``None`` for a store that is not a local path (memory, PostgreSQL) or a malformed URL."""
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return unquote(url[len("sqlite:///") :])
    if url.startswith("file://") and len(url) > len("file://"):
        return unquote(url[len("file://") :])
    return None


def _memory(rest: str) -> Store:
    if rest:
        raise StoreError(f"memory:// takes no path, got {rest!r}")
    return MemoryStore()


def _sqlite(rest: str) -> Store:
    if not rest.startswith("/") or rest == "/":
        raise StoreError("an SQLite URL is sqlite:///relative/path.db or sqlite:////abs/path.db")
    return SQLiteStore(unquote(rest[1:]))


def _file(rest: str) -> Store:
    if not rest:
        raise StoreError("a file URL is file:///abs/dir or file://relative/dir")
    return FileStore(unquote(rest))


def _postgres(rest: str) -> Store:
    return PostgresStore(f"postgresql://{rest}")


# URL prefix (scheme plus "//") -> opener of the rest of the URL.
_OPENERS: dict[str, Callable[[str], Store]] = {
    "memory://": _memory,
    "sqlite://": _sqlite,
    "file://": _file,
    "postgresql://": _postgres,
    "postgres://": _postgres,
}
# The prefixes whose URLs may carry a query string (libpq parameters such as sslmode).
_TAKE_QUERIES = frozenset({"postgresql://", "postgres://"})


def open_store(url: str) -> Store:
    """Open the store that ``url`` names (see the module docstring for the forms).

    Parent directories of an SQLite file and a FileStore directory are created. Raises
    :class:`StoreError` for an unknown scheme (naming the supported ones), a malformed URL,
    or a store that cannot be opened. Only PostgreSQL URLs take a query string.
    """
    for prefix, opener in _OPENERS.items():
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            if "?" in rest and prefix not in _TAKE_QUERIES:
                raise StoreError(f"{url!r}: store URLs take no query string")
            return opener(rest)
    supported = ", ".join(_OPENERS)
    raise StoreError(f"unsupported store URL {url!r}; supported: {supported}")
