"""Overhead of ``ce.langchain.install(engine)`` per chat-model call.

A LangChain chat model that answers instantly (no network, no tokenizer of its own) is called
the way a chat app calls it: with its conversation so far (a 50-message history from
``history.py``, seed 20240601, already in the engine's SQLite store, plus the turns since) and
a new user question; the reply joins the conversation. The same calls without the plugin, then
with it installed. The difference of the medians is what the plugin adds to every model call:
``prepare_call`` (the new question recorded, the assembled input built within the budget) and
the recording of the run (model usage, the committed reply).

    python benchmarks/bench_langchain.py [--calls 300] [--sessions 50] [--messages 50]
                                         [--loaded] [--postgres DSN] [--write docs/benchmarks.md]

``--postgres postgresql://postgres@127.0.0.1:5432/test`` runs the same calls on that
PostgreSQL server (in a schema of their own, dropped afterwards) instead of an SQLite file.
``--loaded``: before each call (untimed) the app loads its conversation anew, as a
database-backed chat history does: every message a new object with the same values.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import history  # noqa: E402
from _report import (  # noqa: E402
    OVERHEAD_HEADER,
    drop_schema,
    overhead_row,
    package_version,
    postgres_version,
    schema_url,
    section_head,
    write_section,
)
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402

import ce.langchain  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.stores import SQLiteStore, open_store  # noqa: E402

MESSAGES = 50  # the history length, unless --messages says otherwise
LOADED = False  # --loaded: the app loads its conversation anew before every call
BUDGET = 8_000
REPLY_TOKENS = 1_024
PACKAGES = ("ce-core", "ce-langchain", "langchain-core", "tiktoken", "pydantic")
BLOCK = 20  # calls per block; blocks alternate without / with the plugin


class InstantChatModel(BaseChatModel):
    """Answers "ok" at once, with usage metadata, sync and async."""

    @property
    def _llm_type(self) -> str:
        return "instant"

    def _result(self) -> ChatResult:
        usage = {"input_tokens": 100, "output_tokens": 1, "total_tokens": 101}
        message = AIMessage(content="ok", usage_metadata=usage)  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kwargs: Any) -> ChatResult:
        return self._result()

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, **kwargs: Any
    ) -> ChatResult:
        return self._result()


class Bench:
    def __init__(
        self, directory: Path, calls: int, sessions: int, store_url: str | None = None
    ) -> None:
        self.calls = calls
        self.sessions = [f"bench-{i}" for i in range(sessions)]
        self.engine = ContextEngine(
            store=open_store(store_url)
            if store_url
            else SQLiteStore(str(directory / "sessions.db")),
            config=RuntimeConfig(
                model_hint="gpt-4o",
                budget=BudgetConfig(
                    max_input_tokens=BUDGET + REPLY_TOKENS, reserved_reply_tokens=REPLY_TOKENS
                ),
            ),
        )
        self.model = InstantChatModel()
        self.messages = history.to_langchain(history.generate(MESSAGES, evidences=0))
        self.questions = (q for q, _ in history.turns_after())
        # each variant's own copy of every conversation, as the app holds it
        self.apps: dict[bool, dict[str, list[BaseMessage]]] = {
            installed: {s: list(self.messages) for s in self.sessions}
            for installed in (False, True)
        }
        self.installed = False
        self.turn = 0

    def next_call(self) -> tuple[str, list[BaseMessage]]:
        """The next session (round-robin) and its conversation with a new user question
        appended (the app's list, which gets the reply after the call)."""
        self.turn += 1
        session_id = self.sessions[self.turn % len(self.sessions)]
        conversation = self.apps[self.installed][session_id]
        if LOADED:  # as a database-backed chat history reads it: new objects, equal values
            conversation[:] = messages_from_dict(messages_to_dict(conversation))
        conversation.append(HumanMessage(next(self.questions)))
        return session_id, conversation

    def populate(self) -> None:
        """Every session gets the 50 messages (and one reply) through the plugin, untimed."""
        ce.langchain.install(self.engine)
        for session_id in self.sessions:
            with self.engine.session(session_id):
                reply = self.model.invoke(self.messages)
            for installed in (False, True):
                self.apps[installed][session_id].append(reply)
        ce.langchain.uninstall()

    def time_sync(self) -> float:
        session_id, conversation = self.next_call()
        with self.engine.session(session_id):
            start = time.perf_counter()
            reply = self.model.invoke(conversation)
            elapsed = time.perf_counter() - start
        conversation.append(reply)
        return elapsed

    async def time_async(self) -> float:
        session_id, conversation = self.next_call()
        with self.engine.session(session_id):
            start = time.perf_counter()
            reply = await self.model.ainvoke(conversation)
            elapsed = time.perf_counter() - start
        conversation.append(reply)
        return elapsed

    def sync_block(self) -> list[float]:
        """``BLOCK`` calls of ``invoke``, outside any event loop (as a script or a worker
        thread calls it)."""
        return [self.time_sync() for _ in range(BLOCK)]

    def async_block(self) -> list[float]:
        """``BLOCK`` calls of ``ainvoke``, one after the other on one event loop."""

        async def block() -> list[float]:
            return [await self.time_async() for _ in range(BLOCK)]

        return asyncio.run(block())

    def run(self, measure: Callable[[], list[float]]) -> tuple[list[float], list[float]]:
        """Alternating blocks of ``BLOCK`` calls without and with the plugin (after one
        untimed block of each, to warm up); seconds per call."""
        without: list[float] = []
        with_plugin: list[float] = []
        blocks = -(-self.calls // BLOCK)
        for block in range(blocks + 1):
            for installed, sink in ((False, without), (True, with_plugin)):
                self.installed = installed
                if installed:
                    ce.langchain.install(self.engine)
                try:
                    times = measure()
                finally:
                    if installed:
                        ce.langchain.uninstall()
                if block:  # the first block warms up
                    sink.extend(times)
        return without[: self.calls], with_plugin[: self.calls]


def store_text(dsn: str | None) -> tuple[str, str]:
    """How the report names the store: ``(machine line part, setup sentence part)``."""
    if not dsn:
        return f"SQLite {sqlite3.sqlite_version}", "an `SQLiteStore` file"
    return (
        f"PostgreSQL {postgres_version(dsn)} on 127.0.0.1, psycopg {package_version('psycopg')}",
        "a `PostgresStore` (its own schema, the server on the same machine)",
    )


def report(
    rows: list[str],
    command: str,
    bench: Bench,
    session_sizes: list[int],
    dsn: str | None = None,
) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    low, high = min(session_sizes), max(session_sizes)
    held = f"{low}" if low == high else f"{low}-{high}"
    chars = sum(len(str(m.content)) for m in bench.messages)
    database, store = store_text(dsn)
    lines = [
        "## LangChain plugin: overhead per model call"
        + ("" if MESSAGES == 50 else f", {MESSAGES:,}-message history")
        + (", history loaded anew for every call" if LOADED else "")
        + (", PostgreSQL" if dsn else ""),
        "",
        *section_head(command, versions, database),
        "",
        " ".join(
            [
                "A LangChain chat model that answers at once (a `BaseChatModel` whose",
                "`_generate` / `_agenerate` return `AIMessage('ok')` with usage metadata) is",
                "called the way a chat app calls it: with its conversation so far (a",
                f"{MESSAGES}-message history from `benchmarks/history.py`, seed {history.SEED}:",
                "system prompt, user and assistant turns, tool calls and their results;",
                f"{chars:,} characters; plus the turns since) and a new user question, whose",
                "reply then joins the conversation. Without the plugin that is LangChain's own",
                f"cost of a call. With `ce.langchain.install(engine)` (engine on {store},",
                f"`gpt-4o` tokenizer `o200k_base`, budget {BUDGET:,} input tokens) the same",
                "call also runs the plugin: `prepare_call` of the app's messages (the new",
                "question is the one new record; the assembled input replaces the model's",
                "input), and the recording of the run (model usage, the committed reply). The",
                f"history is already in the store: {len(bench.sessions)} sessions each got the",
                f"{MESSAGES} messages and a first reply through the plugin beforehand; the timed",
                "calls go round-robin over them (named with `engine.session(...)`; each variant",
                f"continues its own copy of every conversation), so a session holds {held}",
                f"messages at the end. Blocks of {BLOCK} calls alternate without and with",
                "the plugin (install / uninstall between blocks, untimed; the first block of",
                f"each is a warm-up); {bench.calls} timed calls each; `time.perf_counter()`",
                "around the call. Uninstalling lets go of the plugin's memo of each",
                "session's converted history, so a session's first call in a block builds it",
                "again (from the message objects the process converted before, except those",
                "loaded anew);",
                "p95 interpolated. `invoke` runs the engine inline on the",
                "calling thread (`engine.sync`); `ainvoke` runs on an event loop and awaits the",
                "engine there, whose SQLite work runs inline unless it would wait (then in a",
                "worker thread; every PostgreSQL round trip goes to a worker thread; see",
                "docs/integrations/langchain.md for the seams). The call's input is committed",
                "with its reply and usage: one commit per model call.",
                *(
                    [
                        "Before each call (untimed) the app loads its conversation anew, as a",
                        "database-backed chat history does (`messages_from_dict(messages_to_dict",
                        "(...))`: every message a new object with the same values).",
                    ]
                    if LOADED
                    else []
                ),
            ]
        ),
        "",
        *OVERHEAD_HEADER,
        *rows,
    ]
    return "\n".join(lines) + "\n"


def session_sizes(bench: Bench) -> list[int]:
    run = bench.engine.sync.run
    return [len(run(bench.engine.get_session(s)).session.messages) for s in bench.sessions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per variant")
    parser.add_argument("--sessions", type=int, default=50, help="sessions the calls rotate over")
    parser.add_argument(
        "--messages", type=int, default=50, help="messages of the history already stored"
    )
    parser.add_argument(
        "--postgres", default=None, help="PostgreSQL server to use instead of an SQLite file"
    )
    parser.add_argument(
        "--loaded",
        action="store_true",
        help="the app loads its conversation anew (new message objects) before every call",
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/bench_langchain.py"
    if args.calls != 300:
        command += f" --calls {args.calls}"
    if args.sessions != 50:
        command += f" --sessions {args.sessions}"
    if args.messages != 50:
        command += f" --messages {args.messages}"
    if args.loaded:
        command += " --loaded"
    store_url = None
    if args.postgres:
        command += f" --postgres {args.postgres}"
        schema = f"bench_langchain_{secrets.token_hex(4)}"
        store_url = schema_url(args.postgres, schema)
    global MESSAGES, LOADED
    MESSAGES, LOADED = args.messages, args.loaded
    if args.write:
        command += f" --write {args.write}"

    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), args.calls, args.sessions, store_url)
        try:
            bench.populate()
            sync_times = bench.run(bench.sync_block)
            async_times = bench.run(bench.async_block)
            sizes = session_sizes(bench)
        finally:
            bench.engine.sync.close()
            if args.postgres:
                drop_schema(args.postgres, schema)
    rows = [overhead_row("invoke", *sync_times), overhead_row("ainvoke", *async_times)]
    section = report(rows, command, bench, sizes, args.postgres)
    print(section)
    if args.write:
        name = "langchain" if MESSAGES == 50 else f"langchain-{MESSAGES}"
        if LOADED:
            name += "-loaded"
        if store_url:
            name += "-postgres"
        write_section(args.write, name, section)


if __name__ == "__main__":
    main()
