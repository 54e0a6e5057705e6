"""What storing a framework's hook records costs: a drain of a session's deferred records.

A plugin hands the records a hook produced (a tool's result, a retrieved document, the model
call's usage and reply) to ``ContextEngine.defer`` without waiting; they run before the
session's next engine call, on ``flush()``, or in the background on the app's event loop. Here
an engine (on an SQLite file, and on PostgreSQL when a server answers) gets N such records of
one session queued, then ``await engine.flush(session)`` runs them: timed, with the commits it
made (``Persisted`` events). Run::

    python benchmarks/bench_deferred.py [--records 1,3,6] [--rounds 120]
                                        [--postgres postgresql://...] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path

from _report import cpu_model, percentile, postgres_version, write_section

from ce.core import ContextEngine, Message, Role, RuntimeConfig
from ce.core.schema import (
    EvidenceSource,
    EvidenceType,
    ModelInvocation,
    ModelUsage,
    SourceKind,
)
from ce.core.stores import SQLiteStore, open_store

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")
TOOL = EvidenceSource(kind=SourceKind.TOOL, name="lookup", uri="tool://lookup")
KB = EvidenceSource(kind=SourceKind.RAG, name="kb", uri="kb://docs")
WARM = 20


def records(
    engine: ContextEngine, session: str, n: int, count: int
) -> list[Callable[[], Awaitable[object]]]:
    """``count`` hook records of round ``n``: tool results and retrieved documents in turn,
    the model call (usage and reply) last."""

    def evidence(i: int) -> Callable[[], Awaitable[object]]:
        kind, source = (
            (EvidenceType.TOOL_RESULT, TOOL) if i % 2 == 0 else (EvidenceType.RAG_DOC, KB)
        )
        return lambda: engine.ingest_evidence(session, f"output {i} of round {n}", source, kind)

    async def model_call() -> object:
        usage = ModelUsage(
            model_usage_id=f"{session}-u{n}", provider="openai", model="gpt-4o", total_tokens=9
        )
        reply = Message(role=Role.ASSISTANT, content=f"answer {n}", invocation=INVOCATION)
        return await engine.record_model_call(session, usage, reply=reply)

    return [*(evidence(i) for i in range(count - 1)), model_call]


async def measure(
    url: str | None, path: Path, count: int, rounds: int
) -> tuple[float, float, float]:
    """Median and p95 (ms) of a drain of ``count`` records, and commits per drain."""
    store = open_store(url) if url else SQLiteStore(path)
    engine = ContextEngine(store=store, config=RuntimeConfig(model_hint="gpt-4o"))
    session = f"deferred-{uuid.uuid4()}"
    commits: list[object] = []
    engine.events.on("Persisted", commits.append)
    await engine.prepare_call(session, [Message(role=Role.USER, content="What is new?")])
    times: list[float] = []
    counted = 0
    for n in range(WARM + rounds):
        for work in records(engine, session, n, count):
            engine.defer(session, work)
        if n == WARM:
            counted = len(commits)
        start = time.perf_counter()
        await engine.flush(session)
        if n >= WARM:
            times.append(time.perf_counter() - start)
    made = (len(commits) - counted) / rounds
    await engine.close()
    return percentile(times, 50) * 1e3, percentile(times, 95) * 1e3, made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", default="1,3,6", help="records per drain")
    parser.add_argument("--rounds", type=int, default=120, help="timed drains per row")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="server to use")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    counts = [int(c) for c in args.records.split(",")]
    server = postgres_version(args.postgres)
    stores: list[tuple[str, str | None]] = [("SQLite", None)]
    if server is not None:
        stores.append(("PostgreSQL", args.postgres))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, url in stores:
            for count in counts:
                p50, p95, made = asyncio.run(
                    measure(url, Path(tmp) / f"{name}-{count}.db", count, args.rounds)
                )
                rows.append(f"| {name} | {count} | {p50:.2f} | {p95:.2f} | {made:.1f} |")
    machine = (
        f"{platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}"
        + (f", PostgreSQL {server} on 127.0.0.1" if server else ", no PostgreSQL server")
    )
    section = "\n".join(
        [
            "## Storing a hook's records: a drain of a session's deferred records",
            "",
            f"Command: `python {' '.join(['benchmarks/bench_deferred.py', *sys.argv[1:]])}`  ",
            f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  ",
            f"Machine: {machine}",
            "",
            "An engine (`gpt-4o` tokenizer, redaction on) gets N records of one session queued"
            " with `ContextEngine.defer`, as a plugin's hooks queue them: N - 1 evidences (tool"
            " results and retrieved documents in turn) and the model call's usage with its"
            " reply; then `await engine.flush(session)` runs them, timed with"
            " `time.perf_counter()` (after"
            f" {WARM} untimed drains; {args.rounds} timed drains per row; p95 interpolated)."
            " Commits: `Persisted` events per drain. Store defaults (SQLite: WAL,"
            ' `synchronous="NORMAL"`; PostgreSQL: its default durability).',
            "",
            "| store | records per drain | drain, median (ms) | drain, p95 (ms) "
            "| commits per drain |",
            "| --- | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
    print(section)
    if args.write:
        write_section(args.write, "deferred", section)


if __name__ == "__main__":
    main()
