"""The first LangChain model call of a process that has not seen the conversation.

A worker that was just started (a deploy, a scaled-out replica, a serverless function) gets a
request for a conversation stored earlier: its SQLite file holds N messages (and N retrieved
documents, from ``history.py``, seed 20240601, written by the engine's store beforehand). The
app passes its whole history as LangChain messages, the last one the new question, to a chat
model with ``ce.langchain.install(engine)``; the model answers at once. Timed in each new
process: that first ``invoke`` (the engine reads the session's newest records, assembles the
input, and records the reply, its output and usage before ``invoke`` returns), then a second
``invoke`` with the next question. Before the clock: the store opened, the engine built, the
tokenizer loaded, the app's LangChain messages built.

    python benchmarks/bench_cold_worker.py [--sizes 100,1000,10000] [--runs 5]
                                           [--write docs/benchmarks.md]

``--write`` replaces the section between ``<!-- bench:cold-worker:start -->`` and
``<!-- bench:cold-worker:end -->`` (appending it when absent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import history  # noqa: E402
from _report import cpu_model, package_version, percentile, write_section  # noqa: E402

SESSION_ID = "conversation"
BUDGET = 8_000
REPLY_TOKENS = 1_024
PACKAGES = ("ce-core", "ce-langchain", "langchain-core", "tiktoken")


def _copy(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{src}{suffix}").exists():
            shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")


async def _store(path: Path, n: int) -> None:
    """The conversation without its last message (the app's new question), as stored."""
    from ce.core.stores import SQLiteStore

    generated = history.generate(n, history.SEED)
    messages, evidences = history.to_ce_changes(generated, SESSION_ID)
    assert messages.messages[-1].role.value == "user"
    messages.messages.pop()
    store = SQLiteStore(path)
    for changes in (messages, evidences):
        await store.commit(SESSION_ID, changes)
    await store.close()


def child(db: Path, n: int) -> dict[str, float]:
    """One new process: the first and the second call."""
    from bench_langchain import InstantChatModel
    from langchain_core.messages import AIMessage, HumanMessage

    import ce.langchain
    from ce.core.config import BudgetConfig, RuntimeConfig
    from ce.core.engine import ContextEngine
    from ce.core.stores import SQLiteStore

    engine = ContextEngine(
        store=SQLiteStore(db),
        config=RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(
                max_input_tokens=BUDGET + REPLY_TOKENS, reserved_reply_tokens=REPLY_TOKENS
            ),
        ),
    )
    engine.estimator.estimate_text("the tokenizer is loaded before the clock", "gpt-4o")
    ce.langchain.install(engine)
    model = InstantChatModel()
    conversation = history.to_langchain(history.generate(n, history.SEED))
    start = time.perf_counter()
    with engine.session(SESSION_ID):
        reply = model.invoke(conversation)
    first = time.perf_counter() - start
    assert isinstance(reply, AIMessage)
    conversation += [reply, HumanMessage("And what about the second order?")]
    start = time.perf_counter()
    with engine.session(SESSION_ID):
        model.invoke(conversation)
    second = time.perf_counter() - start
    ce.langchain.uninstall()
    engine.sync.close()
    with sqlite3.connect(db) as conn:
        (stored,) = conn.execute("SELECT COUNT(*) FROM messages").fetchone()
    conn.close()
    # the N - 1 messages stored before, then both questions and both replies
    assert stored == len(history.generate(n, history.SEED).messages) + 3, stored
    return {"first": first, "second": second}


def run(sizes: list[int], runs: int, workdir: Path) -> dict[int, list[dict[str, float]]]:
    out: dict[int, list[dict[str, float]]] = {}
    for n in sizes:
        pristine = workdir / f"pristine-{n}.db"
        asyncio.run(_store(pristine, n))
        out[n] = []
        for i in range(runs):
            db = workdir / f"run-{n}-{i}.db"
            _copy(pristine, db)
            proc = subprocess.run(
                [sys.executable, str(HERE), "--child", str(db), "--n", str(n)],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )
            if proc.returncode != 0:
                raise RuntimeError(f"child failed:\n{proc.stderr[-4000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            out[n].append(result)
            print(
                f"N={n:,} #{i + 1}: first {result['first'] * 1e3:,.1f} ms, "
                f"second {result['second'] * 1e3:,.1f} ms",
                file=sys.stderr,
            )
    return out


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def report(results: dict[int, list[dict[str, float]]], runs: int, started: float) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{p} {package_version(p)}" for p in PACKAGES)
    lines = [
        "## LangChain plugin: the first model call of a new process",
        "",
        "Command: `python benchmarks/bench_cold_worker.py --write docs/benchmarks.md`  ",
        f"Date: {now}, total wall time {time.perf_counter() - started:.0f} s  ",
        f"Machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}; load average "
        f"{os.getloadavg()[0]:.2f} at the end  ",
        f"Versions: {versions}",
        "",
        "A new process (a deploy, a scaled-out worker, a serverless function) answers a "
        "conversation stored earlier: the SQLite file holds N messages and N retrieved "
        "documents (`benchmarks/history.py`, seed 20240601: user and assistant turns, tool "
        "calls and their results); the app passes its whole history as LangChain messages, the "
        "last one the new question, to a chat model that answers at once, with "
        "`ce.langchain.install(engine)` (`gpt-4o` tokenizer, budget 8,000 input tokens). Timed: "
        "that first `invoke` (the engine reads the session's newest records, assembles the "
        "input, and records the reply, its output and usage before `invoke` returns), then the "
        "next `invoke` of the same process. Before the clock: the store opened, the engine built, "
        "the tokenizer loaded, the app's messages built. Median and p95 (interpolated; with few "
        f"runs, near the slowest) over {runs} processes, each on a fresh copy of the file (in "
        "the OS page cache).",
        "",
        "| N messages / evidences | first call, median (ms) | first call, p95 (ms) "
        "| second call, median (ms) | second call, p95 (ms) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, rows in results.items():
        first = [r["first"] for r in rows]
        second = [r["second"] for r in rows]
        lines.append(
            f"| {n:,} / {n:,} | {_ms(statistics.median(first))} | "
            f"{_ms(percentile(first, 95))} | {_ms(statistics.median(second))} | "
            f"{_ms(percentile(second, 95))} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.n)))
        return
    started = time.perf_counter()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = run(sizes, args.runs, Path(tmp))
    section = report(results, args.runs, started)
    print(section)
    if args.write is not None:
        write_section(args.write, "cold-worker", section)


if __name__ == "__main__":
    main()
