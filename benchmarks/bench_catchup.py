"""What a turn costs a worker whose cached session another worker has written since.

Two ``ContextEngine`` objects (two workers) share one SQLite file. The session is filled with
N messages by worker B; worker A has it cached. Then, repeatedly, B commits one assistant
message and A runs ``prepare_turn``: A's copy is one commit behind. Timed: A's
``prepare_turn``, (1) as the engine does it, catching up through ``Store.read_since`` (only
the records written since A's version), and (2) with A's cache emptied before each turn, which
is what every stale turn cost before ``read_since``: reading and indexing the whole session.
Run::

    python benchmarks/bench_catchup.py [--sizes 100,1000,10000] [--turns 40]
                                       [--write docs/benchmarks.md]
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
from datetime import datetime, timezone
from pathlib import Path

from _report import cpu_model, write_section

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.schema import Message, ModelInvocation, Role
from ce.core.stores import SQLiteStore

CONFIG = RuntimeConfig(
    model_hint="gpt-4o",
    budget=BudgetConfig(max_input_tokens=8000 + 1024, reserved_reply_tokens=1024),
)
INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")
PAD = "the quick brown fox jumps over the lazy dog; " * 4


def reply(text: str) -> Message:
    return Message(role=Role.ASSISTANT, content=text, invocation=INVOCATION)


async def measure(size: int, turns: int) -> tuple[float, float, float, float]:
    """Median and p95 (ms) of A's stale ``prepare_turn``: caught up, then read whole."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ce.db"
        a = ContextEngine(SQLiteStore(path), config=CONFIG)
        b = ContextEngine(SQLiteStore(path), config=CONFIG)
        for i in range(size // 2):
            await b.prepare_turn("s", f"question {i}: {PAD}")
            await b.commit_assistant_message("s", reply(f"answer {i}: {PAD}"))
        await a.prepare_turn("s", "A reads the session once")
        results = []
        for whole in (False, True):
            times = []
            for i in range(turns + 5):
                await b.commit_assistant_message("s", reply(f"B's note {whole} {i}"))
                if whole:
                    a._entries.clear()  # forget the cached copy: the cost before read_since
                start = time.perf_counter()
                await a.prepare_turn("s", f"A's question {whole} {i}")
                if i >= 5:  # the first five warm up
                    times.append((time.perf_counter() - start) * 1000)
            times.sort()
            results += [statistics.median(times), times[int(0.95 * (len(times) - 1))]]
        await a.close()
        await b.close()
    return results[0], results[1], results[2], results[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--turns", type=int, default=40, help="timed turns per size and mode")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for size in sizes:
        caught_p50, caught_p95, whole_p50, whole_p95 = asyncio.run(measure(size, args.turns))
        rows.append(
            f"| {size:,} | {caught_p50:.1f} | {caught_p95:.1f} | {whole_p50:.1f} | "
            f"{whole_p95:.1f} | {whole_p50 / caught_p50:.1f}x |"
        )
        print(rows[-1], flush=True)
    machine = (
        f"{platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    head = [
        "## A worker catching up with what another worker stored",
        "",
        "Command: `python benchmarks/bench_catchup.py --write docs/benchmarks.md`  ",
        f"Date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine}",
        "",
        "Two engines (two workers) on one SQLite file; the session holds N messages (user and "
        "assistant turns of ~50 tokens) written by worker B, and worker A has it cached. Then B "
        "commits one message and A runs `prepare_turn` (8,000-token budget, `gpt-4o` "
        f"tokenizer), {args.turns} times per row after 5 warm-up turns. *Caught up*: the engine "
        "as it is — A's copy reads only the records stored since its version "
        "(`Store.read_since`). *Read whole*: A's cache is emptied before each turn, which is "
        "what every stale turn cost before `read_since` (the whole session read and indexed "
        "again).",
        "",
        "| messages | caught up, median (ms) | caught up, p95 (ms) | read whole, median (ms) "
        "| read whole, p95 (ms) | read whole ÷ caught up |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    section = "\n".join([*head, *rows]) + "\n"
    print(section)
    if args.write is not None:
        write_section(args.write, "catchup", section)


if __name__ == "__main__":
    sys.exit(main())
