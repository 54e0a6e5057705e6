"""Overhead of ``ce.haystack.install(engine)`` per chat-generator call.

A Haystack chat generator that answers instantly (a ``@component`` with ``run`` /
``run_async``, no network) is called with a 50-message conversation (``history.py``, seed
20240601) through its ``run`` (plain, and with a streaming callback): the same call without
the plugin, then with the plugin installed, whose history is already in the engine's SQLite
store. The difference of the medians is what the plugin adds to every call: the call's scope,
``prepare_call`` (the assembled input sent as a new message list) and the recording of the
call (model usage, the reply).

    python benchmarks/bench_haystack.py [--calls 300] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import history  # noqa: E402
from _report import (  # noqa: E402
    OVERHEAD_HEADER,
    overhead_row,
    package_version,
    section_head,
    write_section,
)
from bench_prepare import to_haystack  # noqa: E402
from haystack import component  # noqa: E402
from haystack.dataclasses import ChatMessage, StreamingChunk  # noqa: E402

import ce.haystack  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

MESSAGES = 50  # the history length, unless --messages says otherwise
BUDGET = 8_000
REPLY_TOKENS = 1_024
PACKAGES = ("ce-core", "ce-haystack", "haystack-ai", "tiktoken", "pydantic")
BLOCK = 20  # calls per block; blocks alternate without / with the plugin
USAGE = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}


@component
class InstantChatGenerator:
    """Answers "ok" at once with usage 100/1 in ``meta["usage"]`` (streamed: one chunk to the
    callback first); keeps the messages it was handed so the check can see what the model
    received."""

    received: list[ChatMessage] = []

    @component.output_types(replies=list[ChatMessage])
    def run(
        self,
        messages: list[ChatMessage],
        streaming_callback: Any = None,
        generation_kwargs: dict[str, Any] | None = None,
        *,
        tools: Any = None,
    ) -> dict[str, Any]:
        type(self).received = list(messages)
        if streaming_callback is not None:
            streaming_callback(StreamingChunk(content="ok"))
        reply = ChatMessage.from_assistant("ok", meta={"model": "instant", "usage": USAGE})
        return {"replies": [reply]}


class Bench:
    def __init__(self, directory: Path, calls: int, sessions: int) -> None:
        self.calls = calls
        self.sessions = [f"bench-{i}" for i in range(sessions)]
        self.config = RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(
                max_input_tokens=BUDGET + REPLY_TOKENS, reserved_reply_tokens=REPLY_TOKENS
            ),
        )
        self.engine = ContextEngine(
            store=SQLiteStore(str(directory / "sessions.db")), config=self.config
        )
        self.generator = InstantChatGenerator()
        self.messages = to_haystack(history.generate(MESSAGES, evidences=0))
        self.questions = (q for q, _ in history.turns_after())
        # each variant's own copy of every conversation, as the app holds it
        self.apps: dict[bool, dict[str, list[ChatMessage]]] = {
            installed: {s: list(self.messages) for s in self.sessions}
            for installed in (False, True)
        }
        self.installed = False
        self.turn = 0

    def next_call(self) -> tuple[str, list[ChatMessage]]:
        """The next session (round-robin) and its conversation with a new user question
        appended (the app's list, which gets the reply after the call)."""
        self.turn += 1
        session_id = self.sessions[self.turn % len(self.sessions)]
        conversation = self.apps[self.installed][session_id]
        conversation.append(ChatMessage.from_user(next(self.questions)))
        return session_id, conversation

    def ask(self, session_id: str, conversation: list[ChatMessage], stream: bool) -> float:
        """One call with the conversation; the reply joins it."""
        callback = (lambda chunk: None) if stream else None
        with self.engine.session(session_id):
            start = time.perf_counter()
            result = self.generator.run(messages=list(conversation), streaming_callback=callback)
            elapsed = time.perf_counter() - start
        conversation.append(result["replies"][0])
        return elapsed

    def populate(self) -> None:
        """Every session gets the 50 messages (and one reply) through the plugin, untimed."""
        ce.haystack.install(self.engine)
        try:
            for session_id in self.sessions:
                with self.engine.session(session_id):
                    reply = self.generator.run(messages=list(self.messages))["replies"][0]
                for installed in (False, True):
                    self.apps[installed][session_id].append(reply)
        finally:
            ce.haystack.uninstall()

    def check(self) -> None:
        """Untimed, with the plugin installed: a plain and a streamed call hand the model the
        engine's input (fewer messages than the app's, which exceed the budget, its system
        message first, the new question last) and record one model usage and the reply each;
        without it the generator gets the app's whole conversation."""
        ce.haystack.install(self.engine)
        self.installed = True
        try:
            for stream in (False, True):
                session_id, conversation = self.next_call()
                question = conversation[-1].text
                before = len(self.engine.sync.get_session(session_id).session.model_usage)
                self.ask(session_id, conversation, stream)
                got = InstantChatGenerator.received
                assert got[0].is_from("system"), got[0].role
                assert len(got) < len(conversation) - 1, "the budget left history out"
                assert got[-1].text == question
                doc = self.engine.sync.get_session(session_id).session
                assert len(doc.model_usage) == before + 1, "usage not recorded once"
                usage = doc.model_usage[-1]
                assert (usage.prompt_tokens, usage.completion_tokens) == (100, 1), usage
                assert doc.messages[-1].content == "ok", "reply not committed"
                assert doc.messages[-2].content == question, "question not recorded"
        finally:
            ce.haystack.uninstall()
        self.installed = False
        session_id, conversation = self.next_call()
        self.ask(session_id, conversation, False)
        received = InstantChatGenerator.received
        assert len(received) == len(conversation) - 1, "without the plugin: the app's"

    def block(self, stream: bool) -> list[float]:
        """``BLOCK`` calls, one after the other."""
        return [self.ask(*self.next_call(), stream) for _ in range(BLOCK)]

    def run(self, stream: bool) -> tuple[list[float], list[float]]:
        """Alternating blocks of ``BLOCK`` calls without and with the plugin (after one
        untimed block of each, to warm up); seconds per call."""
        without: list[float] = []
        with_plugin: list[float] = []
        blocks = -(-self.calls // BLOCK)
        for block in range(blocks + 1):
            for installed, sink in ((False, without), (True, with_plugin)):
                self.installed = installed
                if installed:
                    ce.haystack.install(self.engine)
                try:
                    times = self.block(stream)
                finally:
                    if installed:
                        ce.haystack.uninstall()
                if block:  # the first block warms up
                    sink.extend(times)
        return without[: self.calls], with_plugin[: self.calls]

    def session_sizes(self) -> list[int]:
        return [len(self.engine.sync.get_session(s).session.messages) for s in self.sessions]


def report(rows: list[str], command: str, bench: Bench, sizes: list[int]) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    low, high = min(sizes), max(sizes)
    held = f"{low}" if low == high else f"{low}-{high}"
    chars = sum(len(m.text or "") for m in bench.messages)
    lines = [
        "## Haystack plugin: overhead per chat-generator call"
        + ("" if MESSAGES == 50 else f", {MESSAGES:,}-message history"),
        "",
        *section_head(command, versions),
        "",
        " ".join(
            [
                "A Haystack chat generator that answers at once (a `@component` whose `run`",
                "returns `ok` with usage 100/1 in `meta['usage']`; streamed: one chunk to the",
                "callback first) is called through its `run` the way a chat app calls it:",
                "with its conversation so far (a",
                f"{MESSAGES}-message history from `benchmarks/history.py`, seed {history.SEED}:",
                "system prompt, user and assistant turns, tool calls and their results;",
                f"{chars:,} characters of text; as Haystack `ChatMessage`s; plus the turns",
                "since) and a new user question, whose reply then joins the conversation.",
                "Without the plugin that is the generator's own cost. With",
                "`ce.haystack.install(engine)` (engine on an `SQLiteStore` file, `gpt-4o`",
                f"tokenizer `o200k_base`, budget {BUDGET:,} input tokens) the same call also",
                "runs the plugin's wrapper of the generator class's `run`: the call's scope,",
                "`prepare_call` (the new question is the one new record; the assembled input",
                "sent as a new list, the app's own message objects for the messages the",
                "engine kept as they were) and the recording of the call (model usage, the",
                f"reply). The history is already in the store: {len(bench.sessions)} sessions",
                f"each got the {MESSAGES} messages and a first reply through the plugin",
                "beforehand; the timed calls go round-robin over them (named with",
                "`engine.session(...)`; each variant continues its own copy of every",
                f"conversation), so a session holds {held} messages at the end. Uninstalling",
                "lets go of the plugin's memo of each session's converted history, so a",
                "session's first call in a block builds it again (from the message objects",
                "the process converted before). An",
                "untimed check first asserts that a plain and a streamed call with the plugin",
                "hand the generator the engine's assembled input and record one model usage",
                f"and the reply each. Blocks of {BLOCK} calls alternate without and with the",
                "plugin (install / uninstall between blocks, untimed; the first block of each",
                f"is a warm-up); {bench.calls} timed calls each; `time.perf_counter()` around",
                "the call; p95 interpolated.",
            ]
        ),
        "",
        *OVERHEAD_HEADER,
        *rows,
    ]
    return "\n".join(lines) + "\n"


def measure(directory: Path, calls: int, sessions: int) -> tuple[list[str], Bench, list[int]]:
    bench = Bench(directory, calls, sessions)
    bench.populate()
    bench.check()
    plain = bench.run(stream=False)
    streamed = bench.run(stream=True)
    sizes = bench.session_sizes()
    bench.engine.sync.close()
    rows = [
        overhead_row("run", *plain),
        overhead_row("run(streaming_callback=...)", *streamed),
    ]
    return rows, bench, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per variant")
    parser.add_argument("--sessions", type=int, default=50, help="sessions the calls rotate over")
    parser.add_argument(
        "--messages", type=int, default=50, help="messages of the history already stored"
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/bench_haystack.py"
    if args.calls != 300:
        command += f" --calls {args.calls}"
    if args.sessions != 50:
        command += f" --sessions {args.sessions}"
    if args.messages != 50:
        command += f" --messages {args.messages}"
    global MESSAGES
    MESSAGES = args.messages
    if args.write:
        command += f" --write {args.write}"

    with tempfile.TemporaryDirectory() as tmp:
        rows, bench, sizes = measure(Path(tmp), args.calls, args.sessions)
    section = report(rows, command, bench, sizes)
    print(section)
    if args.write:
        name = "haystack" if MESSAGES == 50 else f"haystack-{MESSAGES}"
        write_section(args.write, name, section)


if __name__ == "__main__":
    main()
