"""Concurrent async LangChain calls on one event loop, with and without ``ce.langchain``.

20 sessions run at once on one event loop (``asyncio.gather``), each making 5 ``ainvoke``
calls one after the other the way a chat app does: its conversation so far (a 50-message
history, ``history.py``, seed 20240601, and a first reply, already in the engine's SQLite
store; then the turns of this run) and a new question, whose reply joins the conversation.
Each run with the plugin has sessions of its own, so every run starts from the same stored
state. The chat model answers after ``await
asyncio.sleep(0.05)`` (a provider's network latency; the loop is free meanwhile). Measured per
run: the wall time of all 100 calls (with the plugin: and the final ``await engine.flush()``
of the records still queued), the event loop's max lateness, from a heartbeat task that
sleeps 5 ms at a time (max of actual minus expected wake-up time), and the process CPU time
(all threads) per call. Runs alternate without /
with the plugin (after one untimed warm-up run of each); the medians are compared.

    python benchmarks/bench_async_langchain.py [--runs 5] [--sessions 20] [--calls 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import history  # noqa: E402
from _report import FullCollections, package_version, section_head, write_section  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402

import ce.langchain  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

MESSAGES = 50
BUDGET = 8_000
REPLY_TOKENS = 1_024
LATENCY = 0.05
HEARTBEAT = 0.005
PACKAGES = ("ce-core", "ce-langchain", "langchain-core", "tiktoken", "pydantic")


class SlowChatModel(BaseChatModel):
    """Answers "ok" (with usage metadata) after ``await asyncio.sleep(latency)``."""

    latency: float = LATENCY

    @property
    def _llm_type(self) -> str:
        return "slow"

    def _result(self) -> ChatResult:
        usage = {"input_tokens": 100, "output_tokens": 1, "total_tokens": 101}
        message = AIMessage(content="ok", usage_metadata=usage)  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kwargs: Any) -> ChatResult:
        return self._result()

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, **kwargs: Any
    ) -> ChatResult:
        await asyncio.sleep(self.latency)
        return self._result()


async def heartbeat(stop: asyncio.Event, lateness: list[float]) -> None:
    """Wake every ``HEARTBEAT`` seconds; note how late each wake-up is."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        expected = loop.time() + HEARTBEAT
        await asyncio.sleep(HEARTBEAT)
        lateness.append(loop.time() - expected)


class Bench:
    def __init__(self, directory: Path, sessions: int, calls: int, runs: int) -> None:
        self.sessions, self.runs = sessions, runs
        self.questions = [question for question, _ in history.next_turns(calls)]
        self.used = 0  # plugin runs so far: each takes the next block of sessions
        self.engine = ContextEngine(
            store=SQLiteStore(str(directory / "sessions.db")),
            config=RuntimeConfig(
                model_hint="gpt-4o",
                budget=BudgetConfig(
                    max_input_tokens=BUDGET + REPLY_TOKENS, reserved_reply_tokens=REPLY_TOKENS
                ),
            ),
        )
        self.model = SlowChatModel()
        self.messages = history.to_langchain(history.generate(MESSAGES, evidences=0))
        # each session's conversation as the app holds it: the history and the first reply
        self.conversations: dict[str, list[BaseMessage]] = {}

    def names(self, run: int) -> list[str]:
        return [f"async-{run}-{i}" for i in range(self.sessions)]

    def populate(self) -> None:
        """Every session of every plugin run (and of the warm-up) gets the 50 messages and one
        reply through the plugin, untimed."""
        ce.langchain.install(self.engine)
        try:
            for run in range(self.runs + 1):
                for session_id in self.names(run):
                    with self.engine.session(session_id):
                        reply = self.model.invoke(self.messages)
                    self.conversations[session_id] = [*self.messages, reply]
            self.engine.sync.flush()
        finally:
            ce.langchain.uninstall()
        for i in range(self.sessions):
            self.conversations[f"without-{i}"] = [*self.messages, AIMessage(content="ok")]

    async def _session(self, session_id: str) -> None:
        config: Any = {"metadata": {"ce_session_id": session_id}}
        conversation = list(self.conversations[session_id])
        for question in self.questions:
            conversation.append(HumanMessage(content=question))
            conversation.append(await self.model.ainvoke(conversation, config))

    async def _run(self, sessions: list[str], installed: bool) -> tuple[float, float, float]:
        stop = asyncio.Event()
        lateness: list[float] = []
        beat = asyncio.create_task(heartbeat(stop, lateness))
        await asyncio.sleep(0)  # the heartbeat is running
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(self._session(s) for s in sessions))
        if installed:
            await self.engine.flush()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        stop.set()
        await beat
        return wall, max(lateness), cpu / (len(sessions) * len(self.questions))

    def run(self, installed: bool) -> Run:
        """One run of every session's calls on a fresh event loop: (wall, max lateness, CPU
        per call, full garbage collections during the run and their pause)."""
        if installed:
            sessions = self.names(self.used)
            self.used += 1
            ce.langchain.install(self.engine)
        else:
            sessions = [f"without-{i}" for i in range(self.sessions)]
        try:
            with FullCollections() as collections:
                wall, late, cpu = asyncio.run(self._run(sessions, installed))
            return wall, late, cpu, collections.count, collections.paused
        finally:
            if installed:
                ce.langchain.uninstall()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


# wall, max lateness, CPU per call (seconds), full collections, their pause (seconds)
Run = tuple[float, float, float, int, float]


def _row(label: str, runs: list[Run]) -> str:
    wall = statistics.median(r[0] for r in runs)
    late = statistics.median(r[1] for r in runs)
    cpu = statistics.median(r[2] for r in runs)
    return (
        f"| {label} | {_ms(wall)} | {', '.join(_ms(r[0]) for r in runs)} | {_ms(late)} "
        f"| {', '.join(_ms(r[1]) for r in runs)} | {cpu * 1000:.2f} |"
    )


def _collections(without: list[Run], with_plugin: list[Run]) -> str:
    def runs(label: str, variant: list[Run]) -> str:
        count = sum(r[3] for r in variant)
        pauses = [f"{_ms(r[4])} ms" for r in variant if r[3]]
        return f"{label} {count}" + (f" ({', '.join(pauses)})" if pauses else "")

    return (
        "Each run starts after `gc.collect()` (untimed), so what one run leaves for the "
        "garbage collector is not collected in the next one's time. Full collections during "
        f"the runs (they stop the loop): {runs('without the plugin', without)}; "
        f"{runs('with it', with_plugin)}."
    )


def report(
    args: argparse.Namespace, without: list[Run], with_plugin: list[Run], command: str
) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    ratio = statistics.median(r[0] for r in with_plugin) / statistics.median(r[0] for r in without)
    delta = statistics.median(r[1] for r in with_plugin) - statistics.median(r[1] for r in without)
    calls = args.sessions * args.calls
    lines = [
        "## LangChain plugin: concurrent async calls on one event loop",
        "",
        *section_head(command, versions),
        "",
        f"{args.sessions} sessions x {args.calls} `ainvoke` calls ({calls} calls) gathered on one "
        f"event loop, each call with the session's conversation so far and a new question, "
        f"whose reply joins it; a {MESSAGES}-message conversation and a first reply already "
        f"stored per session (SQLite file, budget {BUDGET:,} tokens, `gpt-4o` tokenizer), "
        "each run with the plugin on sessions of its own; the model answers after "
        f"`await asyncio.sleep({LATENCY})`; heartbeat every {HEARTBEAT * 1000:.0f} ms; "
        f"{args.runs} alternating runs each (after one warm-up run each), medians.",
        "",
        "| | wall (ms) | runs (ms) | loop max lateness (ms) | runs (ms) | CPU per call (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        _row("without plugin", without),
        _row("with plugin", with_plugin),
        "",
        f"Wall with / without: **{ratio:.2f}x** (target <= 1.15x). Max lateness with - without: "
        f"**{delta * 1000:+.1f} ms** (target <= +5 ms).",
        "",
        _collections(without, with_plugin),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per variant")
    parser.add_argument("--sessions", type=int, default=20, help="concurrent sessions")
    parser.add_argument("--calls", type=int, default=5, help="ainvoke calls per session")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/bench_async_langchain.py"
    for name, default in (("runs", 5), ("sessions", 20), ("calls", 5)):
        if getattr(args, name) != default:
            command += f" --{name} {getattr(args, name)}"
    if args.write:
        command += f" --write {args.write}"

    without: list[Run] = []
    with_plugin: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), args.sessions, args.calls, args.runs)
        bench.populate()
        for index in range(args.runs + 1):
            for installed, sink in ((False, without), (True, with_plugin)):
                result = bench.run(installed)
                if index:  # the first run of each warms up
                    sink.append(result)
        bench.engine.sync.close()
    section = report(args, without, with_plugin, command)
    print(section)
    if args.write:
        write_section(args.write, "langchain-async", section)


if __name__ == "__main__":
    main()
