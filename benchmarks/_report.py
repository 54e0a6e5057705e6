"""What the benchmark scripts share: tiktoken's offline encodings, the machine line,
percentiles, package versions, the plugin-overhead table, full garbage collections and writing
their section of a doc."""

from __future__ import annotations

import gc
import os
import platform
import sqlite3
import statistics
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import TracebackType
from typing import Any

OFFLINE_ENCODINGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "tiktoken-cache"
"""tiktoken's encoding files, kept beside the checkout: every script reads them from there
(it imports this module before its first count), never from the network."""
if OFFLINE_ENCODINGS.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(OFFLINE_ENCODINGS))

__all__ = [
    "OFFLINE_ENCODINGS",
    "OVERHEAD_HEADER",
    "FullCollections",
    "cpu_model",
    "drop_schema",
    "overhead_row",
    "package_version",
    "percentile",
    "postgres_version",
    "schema_url",
    "section_head",
    "write_section",
]

OVERHEAD_HEADER = [
    "| call | without, median (ms) | without, p95 (ms) | with plugin, median (ms) "
    "| with plugin, p95 (ms) | overhead, median (ms) | overhead, p95 (ms) |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
]
"""The head of a plugin-overhead table (rows from :func:`overhead_row`)."""


class FullCollections:
    """The interpreter's full garbage collections (its oldest generation) during a ``with``
    block: how many, and how long they stopped the process in all. The block starts with a
    ``gc.collect()`` (outside the count), so that what earlier runs left for the collector is
    not collected during this one."""

    def __init__(self) -> None:
        self.count = 0
        self.paused = 0.0
        self._started = 0.0

    def __enter__(self) -> FullCollections:
        gc.collect()
        gc.callbacks.append(self._note)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.count += 1
            self.paused += time.perf_counter() - self._started


def postgres_version(dsn: str) -> str | None:
    """The server's version and commit durability setting, or None when psycopg is missing
    or the server does not answer."""
    try:
        import psycopg
    except ImportError:
        return None
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            durability = conn.execute("SHOW synchronous_commit").fetchone()
    except psycopg.Error:
        return None
    if not version or not durability:
        return None
    return f"{version[0]} (synchronous_commit={durability[0]})"


def schema_url(dsn: str, schema: str) -> str:
    """The store URL of ``schema`` (its own tables) in the database of ``dsn``."""
    return f"{dsn}{'&' if '?' in dsn else '?'}ce_schema={schema}"


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def section_head(
    command: str, versions: str, store: str | None = None, note: str = ""
) -> list[str]:
    """The lines a section starts with: the command, the date, the machine (``store``, default
    the SQLite library's version; the load average when the run ended, then ``note``) and the
    package ``versions``."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [
        f"Command: `{command}`  ",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {store or f'SQLite {sqlite3.sqlite_version}'}; "
        f"load average {load:.2f} at the end{note}  ",
        f"Versions: {versions}",
    ]


def write_section(path: Path, name: str, section: str) -> None:
    """Replace the part of ``path`` between ``<!-- bench:NAME:start -->`` and its end marker
    with ``section`` (appending it when the markers are missing); the rest stays."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{section}{end}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (``q`` in [0, 100])."""
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def package_version(name: str) -> str:
    """The installed version of distribution ``name``, or "not installed"."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def overhead_row(label: str, without: list[float], with_plugin: list[float]) -> str:
    """A row of the plugin-overhead table from call times in seconds."""
    ms = 1000.0
    base_med, base_p95 = statistics.median(without) * ms, percentile(without, 95) * ms
    plug_med, plug_p95 = statistics.median(with_plugin) * ms, percentile(with_plugin, 95) * ms
    return (
        f"| `{label}` | {base_med:.3f} | {base_p95:.3f} | {plug_med:.2f} | {plug_p95:.2f} "
        f"| **{plug_med - base_med:.2f}** | {plug_p95 - base_p95:.2f} |"
    )
