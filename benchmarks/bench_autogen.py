"""Overhead of ``ce.autogen.install(engine)`` per model call of an AutoGen ``AssistantAgent``.

An AutoGen model client that answers instantly (no network, no tokenizer of its own) serves an
``AssistantAgent`` whose model context holds a 50-message conversation (``history.py``, seed
20240601): one turn (``agent.on_messages([...])``, one model call) without the plugin, then
with the plugin installed, whose history is already in the engine's SQLite store. The
difference of the medians is what the plugin adds to every model call: the run's scope, the
``prepare_call`` awaited on the loop (what is new recorded, the assembled input built within
the budget and handed to the client in AutoGen's types) and the recording of the call (model
usage, the reply with its agent as author).

    python benchmarks/bench_autogen.py [--calls 300] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Sequence
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
from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.messages import TextMessage  # noqa: E402
from autogen_core import CancellationToken  # noqa: E402
from autogen_core.model_context import UnboundedChatCompletionContext  # noqa: E402
from autogen_core.models import (  # noqa: E402
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    ModelFamily,
    ModelInfo,
    RequestUsage,
    SystemMessage,
    UserMessage,
)

import ce.autogen  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

MESSAGES = 50  # the history length, unless --messages says otherwise
BUDGET = 8_000
REPLY_TOKENS = 1_024
PACKAGES = ("ce-core", "ce-autogen", "autogen-agentchat", "autogen-core", "tiktoken", "pydantic")
BLOCK = 20  # calls per block; blocks alternate without / with the plugin
INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.GPT_4O,
    structured_output=False,
)


class InstantClient(ChatCompletionClient):
    """Answers "ok" at once with usage 100/1, plain or streamed; keeps the list it was handed
    so the check can see what the model received."""

    def __init__(self) -> None:
        self.received: list[LLMMessage] = []

    def _reply(self, messages: Sequence[LLMMessage]) -> CreateResult:
        self.received = list(messages)
        usage = RequestUsage(prompt_tokens=100, completion_tokens=1)
        return CreateResult(finish_reason="stop", content="ok", usage=usage, cached=False)

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        return self._reply(messages)

    async def create_stream(
        self, messages: Sequence[LLMMessage], **kwargs: Any
    ) -> AsyncGenerator[str | CreateResult, None]:
        result = self._reply(messages)
        yield "ok"
        yield result

    async def close(self) -> None:
        return None

    def actual_usage(self) -> RequestUsage:
        return RequestUsage(prompt_tokens=0, completion_tokens=0)

    def total_usage(self) -> RequestUsage:
        return RequestUsage(prompt_tokens=0, completion_tokens=0)

    def count_tokens(self, messages: Sequence[LLMMessage], **kwargs: Any) -> int:
        return 0

    def remaining_tokens(self, messages: Sequence[LLMMessage], **kwargs: Any) -> int:
        return BUDGET

    @property
    def capabilities(self) -> Any:
        return INFO

    @property
    def model_info(self) -> ModelInfo:
        return INFO


class Bench:
    def __init__(self, directory: Path, calls: int, sessions: int, continued: bool = False) -> None:
        self.calls = calls
        self.continued = continued
        # with ``continued``: each session's agent per variant (with or without the plugin,
        # streamed or not), whose model context grows by the question and reply each turn
        self.kept: dict[tuple[bool, bool, str], AssistantAgent] = {}
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
        self.client = InstantClient()
        system, *earlier, last = history.to_autogen(history.generate(MESSAGES, evidences=0))
        assert isinstance(system, SystemMessage) and isinstance(last, UserMessage)
        self.system, self.earlier, self.question = system.content, earlier, str(last.content)
        self.questions = (q for q, _ in history.turns_after())
        self.asked = self.question  # the question of the latest turn
        self.turn = 0

    def agent(self, stream: bool) -> AssistantAgent:
        """A fresh agent on the conversation (a new model context holding the 49 messages
        before the question): every timed turn hands the model the same 50 messages."""
        return AssistantAgent(
            "assistant",
            model_client=self.client,
            system_message=self.system,
            model_context=UnboundedChatCompletionContext(list(self.earlier)),
            model_client_stream=stream,
        )

    def next_session(self) -> str:
        self.turn += 1
        return self.sessions[self.turn % len(self.sessions)]

    async def ask(self, agent: AssistantAgent, session_id: str) -> float:
        # a continued agent gets a new question every turn, as a chat app's does
        question = self.asked = next(self.questions) if self.continued else self.question
        message = TextMessage(content=question, source="user")
        with self.engine.session(session_id):
            start = time.perf_counter()
            await agent.on_messages([message], CancellationToken())
            return time.perf_counter() - start

    async def populate(self) -> None:
        """Every session gets the 50 messages (and one reply) through the plugin, untimed."""
        ce.autogen.install(self.engine)
        try:
            for session_id in self.sessions:
                await self.ask(self.agent(False), session_id)
        finally:
            ce.autogen.uninstall()

    async def check(self) -> None:
        """Untimed, with the plugin installed: a plain and a streamed turn hand the model the
        engine's input (the agent's system message first, fewer messages than the app's 50,
        which exceed the budget) and record one model usage and the reply each."""
        session_id = self.sessions[0]
        ce.autogen.install(self.engine)
        try:
            for stream in (False, True):
                before = len((await self.engine.get_session(session_id)).session.model_usage)
                await self.ask(self.agent(stream), session_id)
                got = self.client.received
                assert isinstance(got[0], SystemMessage) and got[0].content.startswith(self.system)
                assert len(got) < len(self.earlier) + 2, "the budget left history out"
                assert got[-1].content == self.asked
                doc = (await self.engine.get_session(session_id)).session
                assert len(doc.model_usage) == before + 1, "usage not recorded once"
                usage = doc.model_usage[-1]
                assert (usage.prompt_tokens, usage.completion_tokens) == (100, 1), usage
                assert doc.messages[-1].content == "ok", "reply not committed"
                author = doc.messages[-1].author
                assert author is not None and author.id == "assistant"
        finally:
            ce.autogen.uninstall()
        await self.ask(self.agent(False), session_id)
        sent = len(self.client.received)
        assert sent == len(self.earlier) + 2, "without the plugin the model gets the app's list"

    async def block(self, stream: bool, installed: bool) -> list[float]:
        """``BLOCK`` turns, one after the other on one event loop (fresh agents, built
        untimed; with ``continued``, each session's own agent of the variant)."""
        if not self.continued:
            agents = [self.agent(stream) for _ in range(BLOCK)]
            return [await self.ask(agent, self.next_session()) for agent in agents]
        times = []
        for _ in range(BLOCK):
            session_id = self.next_session()
            key = (installed, stream, session_id)
            if key not in self.kept:
                self.kept[key] = self.agent(stream)
            times.append(await self.ask(self.kept[key], session_id))
        return times

    async def run(self, stream: bool) -> tuple[list[float], list[float]]:
        """Alternating blocks of ``BLOCK`` turns without and with the plugin (after one
        untimed block of each, to warm up); seconds per call."""
        without: list[float] = []
        with_plugin: list[float] = []
        blocks = -(-self.calls // BLOCK)
        for block in range(blocks + 1):
            for installed, sink in ((False, without), (True, with_plugin)):
                if installed:
                    ce.autogen.install(self.engine)
                try:
                    times = await self.block(stream, installed)
                finally:
                    if installed:
                        ce.autogen.uninstall()
                if block:  # the first block warms up
                    sink.extend(times)
        return without[: self.calls], with_plugin[: self.calls]

    async def session_sizes(self) -> list[int]:
        return [len((await self.engine.get_session(s)).session.messages) for s in self.sessions]


def report(rows: list[str], command: str, bench: Bench, sizes: list[int]) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    low, high = min(sizes), max(sizes)
    held = f"{low}" if low == high else f"{low}-{high}"
    chars = (
        len(bench.system)
        + len(bench.question)
        + sum(len(str(getattr(m, "content", ""))) for m in bench.earlier)
    )
    lines = [
        "## AutoGen plugin: overhead per model call"
        + (", each session's agent continued" if bench.continued else "")
        + ("" if MESSAGES == 50 else f", {MESSAGES:,}-message history"),
        "",
        *section_head(command, versions),
        "",
        " ".join(
            [
                "An AutoGen model client that answers at once (a `ChatCompletionClient` whose",
                "`create` / `create_stream` return `CreateResult('ok')` with usage 100/1) serves",
                "an `AssistantAgent` whose system message and model context hold a",
                f"{MESSAGES}-message conversation (`benchmarks/history.py`, seed {history.SEED}:",
                "system prompt, user and assistant turns, tool calls and their results;",
                f"{chars:,} characters) in AutoGen's types (tool calls as",
                "`AssistantMessage([FunctionCall])`, the results of a turn in one",
                "`FunctionExecutionResultMessage`). One timed call is one turn,",
                "`agent.on_messages([TextMessage(question)])`, which makes one model call;",
                *(
                    [
                        "each session keeps its agent (one per variant, built untimed), asked a",
                        "new question every turn, whose model context grows by the question and",
                        "the reply, as a chat app's agent does (the method of the LangChain",
                        "benchmark).",
                    ]
                    if bench.continued
                    else [
                        "each turn gets a fresh agent (built untimed) so every call sends the",
                        f"same {MESSAGES} messages.",
                    ]
                ),
                "Without the plugin that is AutoGen's own cost of a turn.",
                "With `ce.autogen.install(engine)` (engine on an `SQLiteStore` file, `gpt-4o`",
                f"tokenizer `o200k_base`, budget {BUDGET:,} input tokens) the same turn also",
                "runs the plugin: the run's scope, `prepare_call` awaited on the loop (the",
                "agent's messages from its own view; all but the question already stored;",
                "the assembled input handed to the client in AutoGen's",
                "types) and the recording of the call (model usage, the reply with its agent",
                "as author), awaited too. The history is already in the store:",
                f"{len(bench.sessions)} sessions each got the {MESSAGES} messages through the",
                "plugin beforehand; the timed turns go round-robin over them (named with",
                f"`engine.session(...)`), so a session holds {held} messages at the end. An",
                "untimed check first asserts that a plain and a streamed turn with the plugin",
                "hand the model the engine's assembled input (the agent's system message",
                "first) and record one model usage and the authored reply each. Blocks of",
                f"{BLOCK} turns alternate without and with the plugin (install / uninstall",
                "between blocks, untimed; the first block of each is a warm-up);",
                f"{bench.calls} timed calls each; `time.perf_counter()` around the turn; p95",
                "interpolated. AutoGen is async only: both rows run on one event loop, where",
                "the engine's SQLite work runs inline unless it would wait (then in a worker",
                "thread).",
            ]
        ),
        "",
        *OVERHEAD_HEADER,
        *rows,
    ]
    return "\n".join(lines) + "\n"


async def measure(
    directory: Path, calls: int, sessions: int, continued: bool
) -> tuple[list[str], Bench, list[int]]:
    bench = Bench(directory, calls, sessions, continued)
    await bench.populate()
    await bench.check()
    plain = await bench.run(stream=False)
    streamed = await bench.run(stream=True)
    sizes = await bench.session_sizes()
    await bench.engine.close()
    rows = [
        overhead_row("on_messages", *plain),
        overhead_row("on_messages, model_client_stream=True", *streamed),
    ]
    return rows, bench, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per variant")
    parser.add_argument("--sessions", type=int, default=50, help="sessions the calls rotate over")
    parser.add_argument(
        "--messages", type=int, default=50, help="messages of the history already stored"
    )
    parser.add_argument(
        "--continued",
        action="store_true",
        help="each session keeps its agent, whose history grows (default: a fresh agent a turn)",
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/bench_autogen.py"
    if args.calls != 300:
        command += f" --calls {args.calls}"
    if args.sessions != 50:
        command += f" --sessions {args.sessions}"
    if args.messages != 50:
        command += f" --messages {args.messages}"
    if args.continued:
        command += " --continued"
    global MESSAGES
    MESSAGES = args.messages
    if args.write:
        command += f" --write {args.write}"

    with tempfile.TemporaryDirectory() as tmp:
        rows, bench, sizes = asyncio.run(
            measure(Path(tmp), args.calls, args.sessions, args.continued)
        )
    section = report(rows, command, bench, sizes)
    print(section)
    if args.write:
        name = "autogen" + ("-continued" if args.continued else "")
        name += "" if MESSAGES == 50 else f"-{MESSAGES}"
        write_section(args.write, name, section)


if __name__ == "__main__":
    main()
