"""``ce.llamaindex.install(engine)`` on one event loop: 20 concurrent sessions, 5 ``achat`` calls
each, a model that answers after ``await asyncio.sleep(0.05)``.

Every session already holds a 50-message conversation (``history.py``, seed 20240601) and a
first reply in the engine's SQLite store; each call sends that conversation plus the turns of
this run and one new question, as a chat app does. Runs alternate without and with the plugin
(one untimed warm-up of each first); each run with the plugin uses sessions of its own, so
every run starts from the same stored state. Measured per run: the wall time of
``asyncio.gather`` over the sessions, and the event loop's max lateness, seen by a heartbeat
task that sleeps 5 ms at a time (how much later than asked it wakes up: how long the loop was
kept from running it). Not a test: numbers depend on the machine; run it with the latest
LlamaIndex virtualenv's python.

    python benchmarks/bench_async_llamaindex.py [--sessions 20] [--calls 5] [--runs 5]
        [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import history  # noqa: E402
from _report import FullCollections, package_version, section_head, write_section  # noqa: E402
from bench_llamaindex import InstantLLM  # noqa: E402
from llama_index.core.base.llms.types import (  # noqa: E402
    ChatMessage,
    ChatResponse,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.instrumentation.dispatcher import instrument_tags  # noqa: E402
from llama_index.core.llms.callbacks import llm_chat_callback  # noqa: E402

import ce.llamaindex  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

MESSAGES = 50
BUDGET = 8_000
REPLY_TOKENS = 1_024
LATENCY = 0.05  # the model's answer time (the workload, awaited)
HEARTBEAT = 0.005
PACKAGES = ("ce-core", "ce-llamaindex", "llama-index-core", "tiktoken", "pydantic")


class SleepyLLM(InstantLLM):
    """:class:`InstantLLM` (``"ok"`` with usage, spans and events like LlamaIndex's own
    LLMs) whose ``achat`` answers after ``await asyncio.sleep(0.05)``; ``chat`` answers at
    once (it only fills the store beforehand)."""

    @classmethod
    def class_name(cls) -> str:
        return "SleepyLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="sleepy", is_chat_model=True)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        await asyncio.sleep(LATENCY)
        return self._reply(messages)


@dataclass
class Run:
    """One run, in seconds: wall time of the gather, the loop's max lateness, CPU time of the
    loop's thread and of the whole process (all threads) during the gather, and the time the
    records still queued at the end took to flush on that loop afterwards (with the plugin);
    the full garbage collections during the run and how long they stopped it in all."""

    wall: float
    late: float
    loop_cpu: float
    cpu: float
    flushed: float = 0.0
    collections: int = 0
    paused: float = 0.0


class CountingSync:
    """Stands in for ``engine.sync`` during the timed runs: counts the blocking engine calls
    (there should be none on the async path) and lets them through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.inner, name)


class Bench:
    def __init__(self, directory: Path, sessions: int, calls: int, runs: int) -> None:
        self.sessions, self.calls, self.runs = sessions, calls, runs
        self.config = RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(
                max_input_tokens=BUDGET + REPLY_TOKENS, reserved_reply_tokens=REPLY_TOKENS
            ),
        )
        self.engine = ContextEngine(
            store=SQLiteStore(str(directory / "sessions.db")), config=self.config
        )
        self.llm = SleepyLLM()
        self.history = history.to_llamaindex(history.generate(MESSAGES, evidences=0))
        self.questions = [q for q, _ in history.next_turns(calls)]
        self.used = 0  # plugin runs so far: each takes the next block of sessions
        # each session's conversation as the app holds it: the history and the first reply
        self.conversations: dict[str, list[ChatMessage]] = {}

    def names(self, run: int) -> list[str]:
        return [f"async-{run}-{i}" for i in range(self.sessions)]

    def populate(self) -> None:
        """Every session of every plugin run (and of the warm-up) gets the 50 messages and one
        reply through the plugin, untimed."""
        ce.llamaindex.install(self.engine)
        try:
            for run in range(self.runs + 1):
                for session_id in self.names(run):
                    with instrument_tags({"ce_session_id": session_id}):
                        reply = self.llm.chat(list(self.history))
                    self.conversations[session_id] = [*self.history, reply.message]
            self.engine.sync.flush()
        finally:
            ce.llamaindex.uninstall()
        for i in range(self.sessions):
            first = ChatMessage(role=MessageRole.ASSISTANT, content="ok")
            self.conversations[f"without-{i}"] = [*self.history, first]

    async def _session(self, session_id: str) -> None:
        conversation = list(self.conversations[session_id])
        for question in self.questions:
            conversation.append(ChatMessage(role=MessageRole.USER, content=question))
            with instrument_tags({"ce_session_id": session_id}):
                reply = await self.llm.achat(list(conversation))
            conversation.append(reply.message)

    async def _run(self, sessions: list[str], installed: bool = False) -> Run:
        stop = asyncio.Event()
        lateness = [0.0]

        async def heartbeat() -> None:
            while not stop.is_set():
                asked = time.perf_counter()
                await asyncio.sleep(HEARTBEAT)
                lateness[0] = max(lateness[0], time.perf_counter() - asked - HEARTBEAT)

        beat = asyncio.create_task(heartbeat())
        await asyncio.sleep(HEARTBEAT)  # the heartbeat is running
        start, loop_cpu, cpu = time.perf_counter(), time.thread_time(), time.process_time()
        await asyncio.gather(*(self._session(s) for s in sessions))
        wall = time.perf_counter() - start
        loop_cpu, cpu = time.thread_time() - loop_cpu, time.process_time() - cpu
        stop.set()
        await beat
        run = Run(wall, lateness[0], loop_cpu, cpu)
        if installed:  # the records still queued (each session's last call), on this loop
            start = time.perf_counter()
            await self.engine.flush()
            run.flushed = time.perf_counter() - start
        return run

    def run(self, installed: bool, counting: CountingSync | None = None) -> Run:
        """One run on a fresh event loop (with the plugin, the records still queued at its end
        are flushed on that loop afterwards, timed apart). ``counting`` stands in for
        ``engine.sync`` during the run."""
        if not installed:
            with FullCollections() as collections:
                run = asyncio.run(self._run([f"without-{i}" for i in range(self.sessions)]))
            run.collections, run.paused = collections.count, collections.paused
            return run
        sessions = self.names(self.used)
        self.used += 1
        engine = self.engine
        real = engine.sync
        ce.llamaindex.install(engine)
        try:
            if counting is not None:
                counting.inner = real
                engine.sync = counting  # type: ignore[assignment]
            try:
                with FullCollections() as collections:
                    run = asyncio.run(self._run(sessions, installed=True))
                run.collections, run.paused = collections.count, collections.paused
            finally:
                engine.sync = real
        finally:
            ce.llamaindex.uninstall()
        return run

    def check(self, sessions: list[str]) -> None:
        """After the runs: the model got the engine's input (its system message first, within
        the budget, not the app's whole conversation) and every call was recorded."""
        received = self.llm.received
        assert received[0].role is MessageRole.SYSTEM, "the model got the app's messages"
        assert len(received) < MESSAGES, "the engine's input is not budgeted"
        for session_id in sessions:
            doc = self.engine.sync.get_session(session_id).session
            assert len(doc.model_usage) == 1 + self.calls, (session_id, len(doc.model_usage))


def _ms(seconds: float, digits: int = 1) -> str:
    return f"{seconds * 1000:.{digits}f}"


def _collected(label: str, runs: list[Run]) -> str:
    pauses = [f"{_ms(r.paused)} ms" for r in runs if r.collections]
    count = sum(r.collections for r in runs)
    return f"{label} {count}" + (f" ({', '.join(pauses)})" if pauses else "")


def report(
    command: str, bench: Bench, without: list[Run], with_plugin: list[Run], blocking: list[str]
) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    calls = bench.sessions * bench.calls

    def medians(value: Callable[[Run], float]) -> tuple[float, float]:
        return (
            statistics.median(value(r) for r in without),
            statistics.median(value(r) for r in with_plugin),
        )

    wall, late = medians(lambda r: r.wall), medians(lambda r: r.late)
    worst = (max(r.late for r in without), max(r.late for r in with_plugin))
    loop_cpu, cpu = medians(lambda r: r.loop_cpu / calls), medians(lambda r: r.cpu / calls)
    flush = statistics.median(r.flushed for r in with_plugin)
    blocked = ", ".join(sorted(set(blocking)))
    lines = [
        "## LlamaIndex plugin: concurrent async sessions on one event loop",
        "",
        *section_head(command, versions),
        "",
        f"{bench.sessions} sessions × {bench.calls} `achat` calls ({calls} calls) under "
        f"`asyncio.gather` on one loop; the model answers after `await asyncio.sleep("
        f"{LATENCY})`; each call with the session's conversation so far and a new question, "
        f"whose reply joins it; a {MESSAGES}-message history and a first reply already stored "
        "per session (SQLite file, "
        f"`gpt-4o` tokenizer, {BUDGET:,}-token budget); {bench.runs} runs each, alternating, "
        "median. Lateness: how much later than asked a 5 ms heartbeat task woke up (max per "
        "run). CPU: `time.thread_time()` of the loop's thread and `time.process_time()` (all "
        "threads) over the gather, per call. Blocking engine calls (`engine.sync`) during the "
        f"runs with the plugin: {len(blocking)}{f' ({blocked})' if blocking else ''}.",
        "",
        "| | without | with plugin | ratio / difference |",
        "| --- | ---: | ---: | ---: |",
        f"| wall time, median (ms) | {_ms(wall[0])} | {_ms(wall[1])} "
        f"| **{wall[1] / wall[0]:.2f}×** |",
        f"| max loop lateness, median of runs (ms) | {_ms(late[0])} | {_ms(late[1])} "
        f"| **+{_ms(late[1] - late[0])}** |",
        f"| max loop lateness, worst run (ms) | {_ms(worst[0])} | {_ms(worst[1])} "
        f"| +{_ms(worst[1] - worst[0])} |",
        f"| CPU on the loop's thread per call (ms) | {_ms(loop_cpu[0], 2)} "
        f"| {_ms(loop_cpu[1], 2)} | +{_ms(loop_cpu[1] - loop_cpu[0], 2)} |",
        f"| CPU, all threads, per call (ms) | {_ms(cpu[0], 2)} | {_ms(cpu[1], 2)} "
        f"| +{_ms(cpu[1] - cpu[0], 2)} |",
        "",
        "Target (issue 11): wall ≤ 1.15× without; lateness ≤ without + 5 ms. The records "
        "still queued when a run ends (each session's last call) were flushed after it on "
        f"the same loop (`await engine.flush()`), not in the wall time: {_ms(flush)} ms median.",
        "",
        "Each run starts after `gc.collect()` (untimed), so what one run leaves for the "
        "garbage collector is not collected in the next one's time. Full collections during "
        f"the runs (they stop the loop): {_collected('without the plugin', without)}; "
        f"{_collected('with it', with_plugin)}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--calls", type=int, default=5, help="achat calls per session")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per variant")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/bench_async_llamaindex.py"
    for name, default in (("sessions", 20), ("calls", 5), ("runs", 5)):
        if getattr(args, name) != default:
            command += f" --{name} {getattr(args, name)}"
    if args.write:
        command += f" --write {args.write}"

    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), args.sessions, args.calls, args.runs)
        bench.populate()
        bench.run(False)  # warm-up
        bench.run(True)
        counting = CountingSync(bench.engine.sync)
        without: list[Run] = []
        with_plugin: list[Run] = []
        for _ in range(args.runs):
            without.append(bench.run(False))
            with_plugin.append(bench.run(True, counting))
        bench.check(bench.names(args.runs))
        bench.engine.sync.close()
    section = report(command, bench, without, with_plugin, counting.calls)
    print(section)
    if args.write:
        write_section(args.write, "llamaindex-async", section)


if __name__ == "__main__":
    main()
