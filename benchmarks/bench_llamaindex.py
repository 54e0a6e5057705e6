"""Overhead of ``ce.llamaindex.install(engine)`` per LLM chat call.

A LlamaIndex LLM that answers instantly (no network, no tokenizer of its own) is called the way
a chat app calls it: with its conversation so far (a 50-message history from ``history.py``,
seed 20240601, already in the engine's SQLite store, plus the turns since) and a new user
question; the reply joins the conversation. The same ``chat`` / ``achat`` without the plugin,
then with it installed. The difference of the medians is what the plugin adds to every LLM
chat call: the span handler's ``prepare_call`` (the new question recorded, the assembled input
built within the budget and put into the call's ``messages``) and the event handler's
recording of the call (model usage, the committed reply).

    python benchmarks/bench_llamaindex.py [--calls 300] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import history  # noqa: E402
from _report import (  # noqa: E402
    OVERHEAD_HEADER,
    overhead_row,
    package_version,
    section_head,
    write_section,
)
from llama_index.core.base.llms.types import (  # noqa: E402
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import PrivateAttr  # noqa: E402
from llama_index.core.instrumentation.dispatcher import instrument_tags  # noqa: E402
from llama_index.core.llms import LLM  # noqa: E402
from llama_index.core.llms.callbacks import llm_chat_callback  # noqa: E402

import ce.llamaindex  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.integration import assembled_to_openai, openai_to_messages  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

MESSAGES = 50  # the history length, unless --messages says otherwise
BUDGET = 8_000
REPLY_TOKENS = 1_024
PACKAGES = ("ce-core", "ce-llamaindex", "llama-index-core", "tiktoken", "pydantic")
BLOCK = 20  # calls per block; blocks alternate without / with the plugin
USAGE = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}


class InstantLLM(LLM):
    """Answers "ok" at once, sync and async, with usage in ``raw["usage"]`` and
    ``additional_kwargs`` (where LlamaIndex's OpenAI LLM puts it); keeps the list it was
    handed (a shallow copy) so the check can see what the model received."""

    _received: list[ChatMessage] = PrivateAttr(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "InstantLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="instant", is_chat_model=True)

    @property
    def received(self) -> list[ChatMessage]:
        return self._received

    def _reply(self, messages: Sequence[ChatMessage]) -> ChatResponse:
        self._received = list(messages)
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content="ok"),
            raw={"usage": dict(USAGE)},
            additional_kwargs=dict(USAGE),
        )

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._reply(messages)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._reply(messages)

    # completion and streaming: not part of the benchmark
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        raise NotImplementedError

    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        raise NotImplementedError

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> Any:
        raise NotImplementedError

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> Any:
        raise NotImplementedError

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


def _tags(session_id: str) -> Any:
    """How a LlamaIndex app names the session of what runs inside (the plugin's first choice;
    without the plugin, a context variable the dispatcher hands to span handlers that ignore
    it)."""
    return instrument_tags({"ce_session_id": session_id})


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
        self.llm = InstantLLM()
        self.messages = history.to_llamaindex(history.generate(MESSAGES, evidences=0))
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
        conversation.append(ChatMessage(role=MessageRole.USER, content=next(self.questions)))
        return session_id, conversation

    def populate(self) -> None:
        """Every session gets the 50 messages (and one reply) through the plugin, untimed."""
        ce.llamaindex.install(self.engine)
        try:
            for session_id in self.sessions:
                with _tags(session_id):
                    reply = self.llm.chat(self.messages).message
                for installed in (False, True):
                    self.apps[installed][session_id].append(reply)
        finally:
            ce.llamaindex.uninstall()

    def check(self) -> None:
        """Untimed, with the plugin installed: a ``chat`` and an ``achat`` hand the LLM the
        input the engine assembles for the session (not the app's 50 messages, which exceed
        the budget), starting with the engine's system message; each records one model usage
        and the reply; the app's list is the same afterwards."""
        session_id = "bench-check"  # a session of its own: the timed ones go on unchanged
        engine = self.engine
        app = list(self.messages)
        pending = openai_to_messages([_as_openai(m) for m in self.messages])

        def expected() -> list[tuple[str, str]]:
            result = engine.sync.prepare_call(session_id, pending, self.config)
            return [
                (d["role"], d.get("content") or "")
                for d in assembled_to_openai(result.assembled_input)
            ]

        def usage_count() -> int:
            return len(engine.sync.get_session(session_id).session.model_usage)

        async def achat() -> None:
            with _tags(session_id):
                await self.llm.achat(self.messages)

        ce.llamaindex.install(engine)
        try:
            for name, call in (
                ("chat", lambda: self.llm.chat(self.messages)),
                ("achat", lambda: asyncio.run(achat())),
            ):
                want = expected()
                before = usage_count()
                with _tags(session_id):
                    call()
                got = [(m.role.value, m.content or "") for m in self.llm.received]
                assert got == want, f"{name}: the LLM did not receive the assembled input"
                assert got[0][0] == "system" and len(got) < len(app), name
                doc = engine.sync.get_session(session_id).session
                assert len(doc.model_usage) == before + 1, f"{name}: usage not recorded once"
                usage = doc.model_usage[-1]
                assert (usage.prompt_tokens, usage.completion_tokens) == (100, 1), usage
                assert doc.messages[-1].content == "ok", f"{name}: reply not committed"
                assert self.messages == app, f"{name}: the app's list was left rewritten"
        finally:
            ce.llamaindex.uninstall()
        self.llm.chat(self.messages)
        assert self.llm.received == app, "without the plugin the LLM gets the app's messages"

    def time_sync(self) -> float:
        session_id, conversation = self.next_call()
        with _tags(session_id):
            start = time.perf_counter()
            reply = self.llm.chat(conversation)
            elapsed = time.perf_counter() - start
        conversation.append(reply.message)
        return elapsed

    async def time_async(self) -> float:
        session_id, conversation = self.next_call()
        with _tags(session_id):
            start = time.perf_counter()
            reply = await self.llm.achat(conversation)
            elapsed = time.perf_counter() - start
        conversation.append(reply.message)
        return elapsed

    def sync_block(self) -> list[float]:
        """``BLOCK`` calls of ``chat``, outside any event loop (as a script or a worker
        thread calls it)."""
        return [self.time_sync() for _ in range(BLOCK)]

    def async_block(self) -> list[float]:
        """``BLOCK`` calls of ``achat``, one after the other on one event loop."""

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
                    ce.llamaindex.install(self.engine)
                try:
                    times = measure()
                finally:
                    if installed:
                        ce.llamaindex.uninstall()
                if block:  # the first block warms up
                    sink.extend(times)
        return without[: self.calls], with_plugin[: self.calls]


def _as_openai(message: ChatMessage) -> dict[str, Any]:
    """A history message as an OpenAI chat dict (for the check's own ``prepare_call``)."""
    role = message.role.value
    entry: dict[str, Any] = {"role": role, "content": message.content or ""}
    if role == "tool":
        entry["tool_call_id"] = message.additional_kwargs["tool_call_id"]
    calls = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    if calls:
        entry["tool_calls"] = [
            {
                "id": b.tool_call_id,
                "type": "function",
                "function": {"name": b.tool_name, "arguments": json.dumps(b.tool_kwargs)},
            }
            for b in calls
        ]
    return entry


def report(rows: list[str], command: str, bench: Bench, session_sizes: list[int]) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    low, high = min(session_sizes), max(session_sizes)
    held = f"{low}" if low == high else f"{low}-{high}"
    chars = sum(len(m.content or "") for m in bench.messages)
    lines = [
        "## LlamaIndex plugin: overhead per LLM chat call"
        + ("" if MESSAGES == 50 else f", {MESSAGES:,}-message history"),
        "",
        *section_head(command, versions),
        "",
        " ".join(
            [
                "A LlamaIndex LLM that answers at once (an `LLM` subclass whose `chat` /",
                "`achat`, decorated with `llm_chat_callback` like LlamaIndex's own LLMs, return",
                "`ChatResponse('ok')` with usage in `raw['usage']` and `additional_kwargs`) is",
                "called the way a chat app calls it: with its conversation so far (a",
                f"{MESSAGES}-message history from `benchmarks/history.py`, seed {history.SEED}:",
                "system prompt, user and assistant turns, tool calls and their results;",
                f"{chars:,} characters; plus the turns since) and a new user question, whose",
                "reply then joins the conversation, as LlamaIndex `ChatMessage`s: tool calls as"
                "`ToolCallBlock`s of the assistant message, results as `tool` messages with",
                "`tool_call_id` in `additional_kwargs`, as `FunctionAgent` writes them.",
                "Without the plugin that is LlamaIndex's own cost of a call (its span and",
                "event dispatch included). With `ce.llamaindex.install(engine)` (engine on an",
                "`SQLiteStore` file, `gpt-4o` tokenizer `o200k_base`, budget",
                f"{BUDGET:,} input tokens) the same call also runs the plugin: its span",
                "handler's `prepare_call` of the app's messages (the new question is the one",
                "new record; the assembled input replaces the call's `messages`, put back",
                "when the call is over), and its event handler's recording of the call (model",
                "usage, the reply committed to the store). The history is already in the",
                f"store: {len(bench.sessions)} sessions each got the {MESSAGES} messages and a",
                "first reply through the plugin beforehand; the timed calls go round-robin",
                'over them (named with `instrument_tags({"ce_session_id": ...})`; each variant',
                "continues its own copy of every conversation), so a session holds",
                f"{held} messages at the end. An untimed check first asserts that a `chat`",
                "and an `achat` with the plugin hand the LLM the engine's assembled input",
                "(its system message first) and record one model usage each. Blocks of",
                f"{BLOCK} calls alternate without and with the plugin (install / uninstall",
                "between blocks, untimed; the first block of each is a warm-up);",
                f"{bench.calls} timed calls each; `time.perf_counter()` around the call; p95",
                "interpolated. `chat` runs the engine inline on the calling thread",
                "(`engine.sync`, from the span handler); `achat` runs on an event loop and",
                "awaits the engine there (the plugin's async seam), whose SQLite work runs",
                "inline unless it would wait (then in a worker thread).",
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
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/bench_llamaindex.py"
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
        bench = Bench(Path(tmp), args.calls, args.sessions)
        bench.populate()
        bench.check()
        sync_times = bench.run(bench.sync_block)
        async_times = bench.run(bench.async_block)
        sizes = session_sizes(bench)
        bench.engine.sync.close()
    rows = [overhead_row("chat", *sync_times), overhead_row("achat", *async_times)]
    section = report(rows, command, bench, sizes)
    print(section)
    if args.write:
        name = "llamaindex" if MESSAGES == 50 else f"llamaindex-{MESSAGES}"
        write_section(args.write, name, section)


if __name__ == "__main__":
    main()
