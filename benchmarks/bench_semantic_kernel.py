"""Overhead of ``ce.semantic_kernel.install(engine)`` per chat-completion request.

A Semantic Kernel chat service that answers instantly (a ``ChatCompletionClientBase``
subclass, no network) is called with a 50-message conversation (``history.py``, seed
20240601) through SK's public ``get_chat_message_contents`` / streaming methods: the same call
without the plugin, then with the plugin installed, whose history is already in the engine's
SQLite store. The difference of the medians is what the plugin adds to every request: the
call's scope, ``prepare_call`` awaited on the loop (the assembled input sent in a new
``ChatHistory``) and the recording of the request (model usage, the reply).

    python benchmarks/bench_semantic_kernel.py [--calls 300] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
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
from semantic_kernel.connectors.ai.chat_completion_client_base import (  # noqa: E402
    ChatCompletionClientBase,
)
from semantic_kernel.connectors.ai.completion_usage import CompletionUsage  # noqa: E402
from semantic_kernel.connectors.ai.prompt_execution_settings import (  # noqa: E402
    PromptExecutionSettings,
)
from semantic_kernel.contents import (  # noqa: E402
    AuthorRole,
    ChatHistory,
    ChatMessageContent,
    StreamingChatMessageContent,
)

import ce.semantic_kernel  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

MESSAGES = 50  # the history length, unless --messages says otherwise
BUDGET = 8_000
REPLY_TOKENS = 1_024
PACKAGES = ("ce-core", "ce-semantic-kernel", "semantic-kernel", "tiktoken", "pydantic")
BLOCK = 20  # calls per block; blocks alternate without / with the plugin


class InstantChat(ChatCompletionClientBase):
    """Answers "ok" at once with usage 100/1 in ``metadata["usage"]``, plain or streamed (the
    usage on an extra empty chunk, as OpenAI sends it); keeps the history it was handed so the
    check can see what the model received."""

    received: list[Any] = []

    async def _inner_get_chat_message_contents(
        self, chat_history: ChatHistory, settings: PromptExecutionSettings
    ) -> list[ChatMessageContent]:
        type(self).received = list(chat_history.messages)
        usage = CompletionUsage(prompt_tokens=100, completion_tokens=1)
        reply = ChatMessageContent(
            role=AuthorRole.ASSISTANT,
            content="ok",
            ai_model_id="instant",
            metadata={"usage": usage},
        )
        return [reply]

    async def _inner_get_streaming_chat_message_contents(
        self,
        chat_history: ChatHistory,
        settings: PromptExecutionSettings,
        function_invoke_attempt: int = 0,
    ) -> AsyncGenerator[list[StreamingChatMessageContent], Any]:
        type(self).received = list(chat_history.messages)
        yield [StreamingChatMessageContent(role=AuthorRole.ASSISTANT, content="ok", choice_index=0)]
        usage = CompletionUsage(prompt_tokens=100, completion_tokens=1)
        yield [
            StreamingChatMessageContent(
                role=AuthorRole.ASSISTANT, content="", choice_index=0, metadata={"usage": usage}
            )
        ]


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
        self.service = InstantChat(ai_model_id="instant")
        self.settings = PromptExecutionSettings()
        self.messages = history.to_semantic_kernel(history.generate(MESSAGES, evidences=0))
        self.questions = (q for q, _ in history.turns_after())
        # each variant's own copy of every conversation, as the app holds it
        self.apps: dict[bool, dict[str, list[Any]]] = {
            installed: {s: list(self.messages) for s in self.sessions}
            for installed in (False, True)
        }
        self.installed = False
        self.turn = 0

    def next_call(self) -> tuple[str, list[Any]]:
        """The next session (round-robin) and its conversation with a new user question
        appended (the app's list, which gets the reply after the request)."""
        self.turn += 1
        session_id = self.sessions[self.turn % len(self.sessions)]
        conversation = self.apps[self.installed][session_id]
        conversation.append(ChatMessageContent(role=AuthorRole.USER, content=next(self.questions)))
        return session_id, conversation

    async def ask(self, session_id: str, conversation: list[Any], stream: bool) -> float:
        """One request with the conversation (a ``ChatHistory`` built untimed, as an app
        holds one); the reply joins the conversation."""
        chat = ChatHistory(messages=list(conversation))
        with self.engine.session(session_id):
            start = time.perf_counter()
            if stream:
                async for _ in self.service.get_streaming_chat_message_contents(
                    chat, self.settings
                ):
                    pass
                elapsed = time.perf_counter() - start
                reply = ChatMessageContent(role=AuthorRole.ASSISTANT, content="ok")
            else:
                (reply,) = await self.service.get_chat_message_contents(chat, self.settings)
                elapsed = time.perf_counter() - start
        conversation.append(reply)
        return elapsed

    async def populate(self) -> None:
        """Every session gets the 50 messages (and one reply) through the plugin, untimed."""
        ce.semantic_kernel.install(self.engine)
        try:
            for session_id in self.sessions:
                chat = ChatHistory(messages=list(self.messages))
                with self.engine.session(session_id):
                    (reply,) = await self.service.get_chat_message_contents(chat, self.settings)
                for installed in (False, True):
                    self.apps[installed][session_id].append(reply)
        finally:
            ce.semantic_kernel.uninstall()

    async def check(self) -> None:
        """Untimed, with the plugin installed: a plain and a streamed request hand the model
        the engine's input (fewer messages than the app's, which exceed the budget, its
        system message first, the new question last) and record one model usage and the
        reply each; without it the service gets the app's whole conversation."""
        ce.semantic_kernel.install(self.engine)
        self.installed = True
        try:
            for stream in (False, True):
                session_id, conversation = self.next_call()
                question = conversation[-1].content
                before = len((await self.engine.get_session(session_id)).session.model_usage)
                await self.ask(session_id, conversation, stream)
                got = InstantChat.received
                assert got[0].role == AuthorRole.SYSTEM, got[0].role
                assert len(got) < len(conversation) - 1, "the budget left history out"
                assert got[-1].content == question
                doc = (await self.engine.get_session(session_id)).session
                assert len(doc.model_usage) == before + 1, "usage not recorded once"
                usage = doc.model_usage[-1]
                assert (usage.prompt_tokens, usage.completion_tokens) == (100, 1), usage
                assert doc.messages[-1].content == "ok", "reply not committed"
                assert doc.messages[-2].content == question, "question not recorded"
        finally:
            ce.semantic_kernel.uninstall()
        self.installed = False
        session_id, conversation = self.next_call()
        await self.ask(session_id, conversation, False)
        assert len(InstantChat.received) == len(conversation) - 1, "without: the app's"

    async def block(self, stream: bool) -> list[float]:
        """``BLOCK`` requests, one after the other on one event loop."""
        return [await self.ask(*self.next_call(), stream) for _ in range(BLOCK)]

    async def run(self, stream: bool) -> tuple[list[float], list[float]]:
        """Alternating blocks of ``BLOCK`` requests without and with the plugin (after one
        untimed block of each, to warm up); seconds per call."""
        without: list[float] = []
        with_plugin: list[float] = []
        blocks = -(-self.calls // BLOCK)
        for block in range(blocks + 1):
            for installed, sink in ((False, without), (True, with_plugin)):
                self.installed = installed
                if installed:
                    ce.semantic_kernel.install(self.engine)
                try:
                    times = await self.block(stream)
                finally:
                    if installed:
                        ce.semantic_kernel.uninstall()
                if block:  # the first block warms up
                    sink.extend(times)
        return without[: self.calls], with_plugin[: self.calls]

    async def session_sizes(self) -> list[int]:
        return [len((await self.engine.get_session(s)).session.messages) for s in self.sessions]


def report(rows: list[str], command: str, bench: Bench, sizes: list[int]) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    low, high = min(sizes), max(sizes)
    held = f"{low}" if low == high else f"{low}-{high}"
    chars = sum(len(str(m.content or "")) for m in bench.messages)
    lines = [
        "## Semantic Kernel plugin: overhead per chat-completion request"
        + ("" if MESSAGES == 50 else f", {MESSAGES:,}-message history"),
        "",
        *section_head(command, versions),
        "",
        " ".join(
            [
                "A Semantic Kernel chat service that answers at once (a",
                "`ChatCompletionClientBase` whose `_inner_get_chat_message_contents` /",
                "`_inner_get_streaming_chat_message_contents` return `ok` with",
                "`CompletionUsage` 100/1 in `metadata['usage']`, streamed: on an extra empty",
                "chunk, as OpenAI sends it) is called through SK's public",
                "`get_chat_message_contents` / `get_streaming_chat_message_contents` the way a",
                "chat app calls it: with a `ChatHistory` of its conversation so far (a",
                f"{MESSAGES}-message history from `benchmarks/history.py`, seed",
                f"{history.SEED}: system prompt, user and assistant turns, tool calls and",
                f"their results; {chars:,} characters of text; in SK's types,",
                "`FunctionCallContent` / `FunctionResultContent` items; plus the turns since)",
                "and a new user question, whose reply then joins the conversation (the",
                "`ChatHistory` is built before the clock starts). Without the plugin that is",
                "SK's own cost of a request. With `ce.semantic_kernel.install(engine)`",
                "(engine on an `SQLiteStore` file, `gpt-4o` tokenizer `o200k_base`, budget",
                f"{BUDGET:,} input tokens) the same request also runs the plugin: the call's",
                "scope, `prepare_call` awaited on the loop (the new question is the one new",
                "record; the assembled input sent in a new `ChatHistory`, the app's own",
                "message objects for the messages the engine kept as they were) and the",
                "recording of the request (model usage, the reply), awaited too. The",
                f"history is already in the store: {len(bench.sessions)} sessions each got the",
                f"{MESSAGES} messages and a first reply through the plugin beforehand; the",
                "timed requests go round-robin over them (named with `engine.session(...)`;",
                "each variant continues its own copy of every conversation), so a session",
                f"holds {held} messages at the end. Uninstalling lets go of the plugin's memo",
                "of each session's converted history, so a session's first request in a block",
                "builds it again (from the message objects the process converted before). An",
                "untimed check first asserts that a plain and a streamed request with the",
                "plugin hand the service the engine's assembled input and record one model",
                f"usage and the reply each. Blocks of {BLOCK} requests alternate without and",
                "with the plugin (install / uninstall between blocks, untimed; the first block",
                f"of each is a warm-up); {bench.calls} timed calls each;",
                "`time.perf_counter()` around the request; p95 interpolated. SK is async",
                "only: both rows run on one event loop, whose store I/O goes to a worker",
                "thread.",
            ]
        ),
        "",
        *OVERHEAD_HEADER,
        *rows,
    ]
    return "\n".join(lines) + "\n"


async def measure(directory: Path, calls: int, sessions: int) -> tuple[list[str], Bench, list[int]]:
    bench = Bench(directory, calls, sessions)
    await bench.populate()
    await bench.check()
    plain = await bench.run(stream=False)
    streamed = await bench.run(stream=True)
    sizes = await bench.session_sizes()
    await bench.engine.close()
    rows = [
        overhead_row("get_chat_message_contents", *plain),
        overhead_row("get_streaming_chat_message_contents", *streamed),
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
    command = "python benchmarks/bench_semantic_kernel.py"
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
        rows, bench, sizes = asyncio.run(measure(Path(tmp), args.calls, args.sessions))
    section = report(rows, command, bench, sizes)
    print(section)
    if args.write:
        name = "semantic-kernel" if MESSAGES == 50 else f"semantic-kernel-{MESSAGES}"
        write_section(args.write, name, section)


if __name__ == "__main__":
    main()
