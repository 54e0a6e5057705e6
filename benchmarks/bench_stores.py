"""Append and load cost of SQLiteStore and FileStore as a session grows.

For each store and each session size N, a session is first filled with N messages (one
``put_session``), then 200 messages are appended one per commit — as the engine does — and
each append is timed; then the whole session is loaded repeatedly. Run::

    python benchmarks/bench_stores.py [--sizes 100,1000,10000] [--appends 200]
                                      [--write docs/benchmarks.md]

``--write`` replaces the section between ``<!-- bench:stores:start -->`` and
``<!-- bench:stores:end -->`` of that file (appending it when absent).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from _report import cpu_model, write_section

from ce.core.schema import (
    SCHEMA_VERSION,
    Message,
    ModelInvocation,
    Role,
    Session,
    SessionDocument,
    ToolCallRequest,
)
from ce.core.stores import BaseStore, FileStore, SQLiteStore

STORES = {
    "SQLiteStore": lambda d: SQLiteStore(d / "ce.db"),
    "FileStore": lambda d: FileStore(d / "sessions"),
}


def message(n: int) -> Message:
    """A realistic history entry: user turns, assistant turns with a tool call, tool results."""
    text = f"Message {n}: " + "the quick brown fox jumps over the lazy dog; " * 8
    match n % 3:
        case 0:
            return Message(role=Role.USER, content=text, message_id=f"m{n}")
        case 1:
            return Message(
                role=Role.ASSISTANT,
                content=text,
                message_id=f"m{n}",
                tool_calls=[
                    ToolCallRequest(
                        tool_call_id=f"c{n}",
                        name="search",
                        raw_arguments='{"q": "fox"}',
                        arguments={"q": "fox"},
                    )
                ],
                invocation=ModelInvocation(provider="openai", model="gpt-4o"),
            )
        case _:
            return Message(
                role=Role.TOOL, content=text, message_id=f"m{n}", tool_call_id=f"c{n - 1}"
            )


@dataclass
class Row:
    store: str
    size: int
    append_median_us: float
    append_p90_us: float
    load_median_ms: float
    loads: int


async def measure(name: str, size: int, appends: int, directory: Path) -> Row:
    store: BaseStore = STORES[name](directory)
    doc = SessionDocument(
        schema_version=SCHEMA_VERSION,
        session=Session(session_id="bench", messages=[message(n) for n in range(size)]),
    )
    await store.put_session("bench", doc)
    del doc  # only the store holds the session, as in an application
    for n in range(20):  # warm up the worker thread and the statement cache, elsewhere
        await store.append_messages("warm-up", [message(n)])
    append_ns = []
    for n in range(size, size + appends):
        new = [message(n)]
        start = time.perf_counter_ns()
        await store.append_messages("bench", new)
        append_ns.append(time.perf_counter_ns() - start)
    loads = 20 if size + appends <= 2000 else 7
    load_ns = []
    for _ in range(loads):
        start = time.perf_counter_ns()
        loaded = await store.get_session("bench")
        load_ns.append(time.perf_counter_ns() - start)
        assert loaded is not None and len(loaded.session.messages) == size + appends
        del loaded  # one loaded copy at a time
    await store.close()
    deciles = statistics.quantiles(append_ns, n=10)
    return Row(
        store=name,
        size=size,
        append_median_us=statistics.median(append_ns) / 1e3,
        append_p90_us=deciles[8] / 1e3,
        load_median_ms=statistics.median(load_ns) / 1e6,
        loads=loads,
    )


def filesystem(path: Path) -> str:
    """The file-system type holding ``path`` (from /proc/mounts), or "unknown"."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    resolved = str(path.resolve())
    best = ("", "unknown")
    for fields in mounts:
        point, fstype = fields[1], fields[2]
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best[0]):
            best = (point, fstype)
    return best[1]


def growth(rows: list[Row], store: str) -> float:
    mine = sorted((r for r in rows if r.store == store), key=lambda r: r.size)
    return mine[-1].append_median_us / mine[0].append_median_us


def report(rows: list[Row], command: str, directory: Path, appends: int) -> str:
    sizes = sorted({r.size for r in rows})
    lines = [
        "## Stores: append and load as a session grows",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d}  ",
        f"Machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"files on {filesystem(directory)}",
        "",
        f"Each session first holds N messages; then {appends} messages are appended one per "
        "commit (as the engine does) and each append is timed, from the caller's `await` to "
        "its return (after 20 untimed appends to another session, to warm up). Load is "
        "`get_session` of the whole session, which validates every record. Store defaults "
        '(SQLite: WAL, `synchronous="NORMAL"`; FileStore: fsync of file and directory on '
        "every write).",
        "",
        "| store | N messages stored | append, median (µs) | append, p90 (µs) "
        "| full load, median (ms) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.store} | {r.size:,} | {r.append_median_us:,.0f} | {r.append_p90_us:,.0f} "
            f"| {r.load_median_ms:,.1f} |"
        )
    lo, hi = f"{sizes[0]:,}", f"{sizes[-1]:,}"
    lines += [
        "",
        f"SQLiteStore's append cost at {hi} messages is {growth(rows, 'SQLiteStore'):.2f}× its "
        f"cost at {lo}: a commit inserts one row per record and reads only the session row, "
        "so it stays flat however long the session is. FileStore rewrites the whole document "
        f"on every commit, so its append cost grows with the session "
        f"({growth(rows, 'FileStore'):.0f}× from {lo} to {hi}); it suits short sessions and "
        "human-readable files. Loading costs time proportional to the session in both.",
    ]
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="comma-separated session sizes")
    parser.add_argument("--appends", type=int, default=200, help="timed appends per size")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the store files")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        for name in STORES:
            for size in sizes:
                directory = root / f"{name}-{size}"
                directory.mkdir()
                row = await measure(name, size, args.appends, directory)
                print(
                    f"{name:12} N={size:>6,}: append {row.append_median_us:9,.0f} µs median, "
                    f"{row.append_p90_us:9,.0f} µs p90; load {row.load_median_ms:8,.1f} ms",
                    file=sys.stderr,
                )
                rows.append(row)
        command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
        section = report(rows, command, root, args.appends)
    print(section)
    if args.write:
        write_section(args.write, "stores", section)
        print(f"wrote {args.write}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
