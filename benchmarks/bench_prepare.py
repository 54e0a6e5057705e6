"""``prepare_turn`` latency against the frameworks' own trimmers, on one generated history.

For each size N (100, 1,000, 10,000 messages, with as many retrieved documents), in one run:

* the frameworks' trimmers on the same history (``history.py``, seed 20240601), with the same
  tokenizer (tiktoken ``cl100k_base``) and budget (8,000 tokens, system message and latest
  user message to keep): LangChain ``trim_messages`` (approximate and tiktoken counters),
  LlamaIndex ``ChatMemoryBuffer`` and ``Memory``, AutoGen
  ``TokenLimitedChatCompletionContext`` (with an offline tiktoken-counting client),
  Semantic Kernel ``ChatHistoryTruncationReducer`` (message count) and Haystack's
  ``SlidingWindowCompactor`` (what ``CompactionHook`` runs, with its ``TiktokenCounter``);
  with what each kept and whether it left a tool result without its call (or a call without
  its results);
* ``ContextEngine.prepare_turn`` on the session stored in a ``SQLiteStore``: cold (the first
  turn of a new process, several processes) and warm (the next turns of one process); and a
  cold ``prepare_call`` given the whole history, as a framework plugin's first call is.

Run::

    python benchmarks/bench_prepare.py [--sizes 100,1000,10000] [--skip-peers] [--skip-ce]
                                       [--cold-runs 5] [--warm-turns 30] [--max-call 120]
                                       [--write docs/benchmarks.md]

``--write`` replaces the section between ``<!-- bench:prepare:start -->`` and
``<!-- bench:prepare:end -->`` of that file (appending it when absent). The frameworks are
imported only here; install them in a separate virtualenv (``nox -s bench`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import inspect
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import history  # noqa: E402
from _report import cpu_model, percentile, write_section  # noqa: E402
from history import SEED, History, Msg, ToolCall  # noqa: E402

BUDGET = 8_000
ENCODING = "cl100k_base"
SESSION_ID = "bench"
MAX_INPUT_TOKENS, RESERVED_REPLY_TOKENS = 9_024, 1_024  # -> 8,000 context tokens
CELL_SECONDS = 15.0  # timed calls stop when the next would pass this (min. 1 call)
SLOW_CALL = 1.0  # a first call slower than this counts as a sample (no separate warm-up)
PACKAGES = (
    "ce-core",
    "langchain-core",
    "llama-index-core",
    "autogen-core",
    "autogen-agentchat",
    "semantic-kernel",
    "haystack-ai",
    "tiktoken",
    "pydantic",
    "SQLAlchemy",
    "aiosqlite",
)


# --------------------------------------------------------------------------- counting


class Counter:
    """The shared count: per message 4 + tokens(content) + per tool call
    (3 + tokens(name) + tokens(JSON arguments)), with tiktoken ``cl100k_base``."""

    def __init__(self) -> None:
        import tiktoken

        self.encoding = tiktoken.get_encoding(ENCODING)
        self._memo: dict[str, int] = {}

    def tokens(self, text: str) -> int:
        """Exact count, recomputed every call (what an un-memoized counter costs)."""
        return len(self.encoding.encode(text))

    def cached(self, text: str) -> int:
        found = self._memo.get(text)
        if found is None:
            found = self._memo[text] = len(self.encoding.encode(text))
        return found

    def message(self, m: Msg) -> int:
        t = self.cached
        return 4 + t(m.content) + sum(3 + t(c.name) + t(c.arguments) for c in m.tool_calls)

    def messages(self, msgs: Sequence[Msg]) -> int:
        return sum(self.message(m) for m in msgs)


@dataclass
class Outcome:
    """What a trimmer returned, judged on the neutral messages."""

    kept_msgs: int
    kept_tokens: int
    system_kept: bool
    last_user_kept: bool
    orphan_results: int  # tool results without their call before them
    unanswered_calls: int  # tool calls without all their results

    @property
    def pairs_intact(self) -> bool:
        return not self.orphan_results and not self.unanswered_calls


def judge(out: Sequence[Msg], h: History, counter: Counter, last_user: str) -> Outcome:
    declared: set[str] = set()
    answered: set[str] = set()
    orphans = 0
    for m in out:
        if m.role == "assistant":
            declared.update(c.call_id for c in m.tool_calls)
        elif m.role == "tool":
            if m.tool_call_id in declared:
                answered.add(m.tool_call_id)
            else:
                orphans += 1
    system = h.messages[0].content
    return Outcome(
        kept_msgs=len(out),
        kept_tokens=counter.messages(out),
        system_kept=any(m.role == "system" and system in m.content for m in out),
        last_user_kept=bool(out) and out[-1].role == "user" and out[-1].content == last_user,
        orphan_results=orphans,
        unanswered_calls=len(declared - answered),
    )


# --------------------------------------------------------------------------- timing


@dataclass
class Cell:
    """One measured (or projected) peer at one size."""

    samples: list[float] = field(default_factory=list)  # seconds
    outcome: Outcome | None = None
    projected: float | None = None  # seconds, when not run

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


Prepare = Callable[[], Awaitable[Any]] | None
Call = Callable[[Any], Any]


async def _once(prepare: Prepare, call: Call) -> tuple[Any, float]:
    arg = await prepare() if prepare else None
    if inspect.iscoroutinefunction(call):
        start = time.perf_counter()
        out = await call(arg)
    else:
        start = time.perf_counter()
        out = call(arg)
    return out, time.perf_counter() - start


async def measure(prepare: Prepare, call: Call) -> tuple[Any, list[float]]:
    """Warm-up (1 call, +2 when fast), then up to 20 timed calls (200 when sub-ms) within
    ``CELL_SECONDS``; a first call slower than ``SLOW_CALL`` is itself a sample."""
    out, first = await _once(prepare, call)
    samples: list[float] = []
    if first >= SLOW_CALL:
        samples.append(first)
        target = 20
    else:
        if first < 0.05:
            for _ in range(2):
                out, first = await _once(prepare, call)
        target = 200 if first < 1e-3 else 20
    while len(samples) < target:
        spent = sum(samples)
        estimate = statistics.median(samples) if samples else first
        if samples and spent + estimate > CELL_SECONDS:
            break
        out, seconds = await _once(prepare, call)
        samples.append(seconds)
    return out, samples


# --------------------------------------------------------------------------- the peers


@dataclass
class Ctx:
    """One history and what every peer needs about it."""

    n: int
    history: History
    counter: Counter
    counts: list[int]  # shared count per message
    last_user: str
    budget: int = BUDGET

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def count_k(self) -> int:
        """Message count for the count-based trimmers: budget / mean tokens per message."""
        return max(2, int(self.budget / (self.total / self.n)))


@dataclass
class Peer:
    name: str
    kind: str  # what it limits, shown in the table
    token_budget: bool  # is a token-budget trimmer (a comparison target)
    setup: Callable[[Ctx], Awaitable[tuple[Prepare, Call, Callable[[Any], list[Msg]]]]]
    work: Callable[[Ctx], float]  # projection model: tokens fed to the tokenizer
    whole_history: bool = False  # a token-budget trimmer of the whole history per call


def _linear(ctx: Ctx) -> float:
    return float(ctx.total)


# LangChain ------------------------------------------------------------------


def _lc_neutral(out: list[Any]) -> list[Msg]:
    from langchain_core.messages import AIMessage, SystemMessage, ToolMessage

    msgs = []
    for m in out:
        content = m.content if isinstance(m.content, str) else str(m.content)
        if isinstance(m, SystemMessage):
            msgs.append(Msg("system", content))
        elif isinstance(m, AIMessage):
            calls = tuple(
                ToolCall(c["id"], c["name"], json.dumps(c["args"], ensure_ascii=False))
                for c in m.tool_calls
            )
            msgs.append(Msg("assistant", content, tool_calls=calls))
        elif isinstance(m, ToolMessage):
            msgs.append(Msg("tool", content, tool_call_id=m.tool_call_id, name=m.name))
        else:
            msgs.append(Msg("user", content))
    return msgs


def _lc_setup(approximate: bool) -> Callable[[Ctx], Awaitable[Any]]:
    async def setup(ctx: Ctx) -> Any:
        from langchain_core.messages import BaseMessage, trim_messages
        from langchain_core.messages.utils import count_tokens_approximately

        messages = history.to_langchain(ctx.history)
        tokens = ctx.counter.tokens

        def tiktoken_counter(msgs: list[BaseMessage]) -> int:
            total = 0
            for m in msgs:
                total += 4 + tokens(m.content if isinstance(m.content, str) else str(m.content))
                for c in getattr(m, "tool_calls", None) or ():
                    args = json.dumps(c["args"], ensure_ascii=False)
                    total += 3 + tokens(c["name"]) + tokens(args)
            return total

        counter: Any = count_tokens_approximately if approximate else tiktoken_counter

        def call(_: Any) -> list[Any]:
            return trim_messages(
                messages,
                max_tokens=ctx.budget,
                token_counter=counter,
                strategy="last",
                include_system=True,
                start_on="human",
            )

        return None, call, _lc_neutral

    return setup


# LlamaIndex -----------------------------------------------------------------


def _li_neutral(out: list[Any]) -> list[Msg]:
    from llama_index.core.base.llms.types import TextBlock, ToolCallBlock

    msgs = []
    for m in out:
        role = m.role.value if hasattr(m.role, "value") else str(m.role)
        text = "".join(b.text for b in m.blocks if isinstance(b, TextBlock))
        calls = tuple(
            ToolCall(
                b.tool_call_id or "",
                b.tool_name,
                b.tool_kwargs
                if isinstance(b.tool_kwargs, str)
                else json.dumps(b.tool_kwargs, ensure_ascii=False),
            )
            for b in m.blocks
            if isinstance(b, ToolCallBlock)
        )
        kwargs = m.additional_kwargs or {}
        msgs.append(Msg(role, text, calls, kwargs.get("tool_call_id"), kwargs.get("name")))
    return msgs


async def _li_buffer(ctx: Ctx) -> Any:
    from llama_index.core.memory import ChatMemoryBuffer

    memory = ChatMemoryBuffer.from_defaults(
        chat_history=history.to_llamaindex(ctx.history),
        token_limit=ctx.budget,
        tokenizer_fn=ctx.counter.encoding.encode,
    )
    return None, lambda _: memory.get(), _li_neutral


def _li_memory(ctx: Ctx, name: str) -> Any:
    from llama_index.core.memory import Memory

    return Memory.from_defaults(
        session_id=name,
        token_limit=ctx.budget,
        chat_history_token_ratio=1.0,  # the whole budget for the chat history
        tokenizer_fn=ctx.counter.encoding.encode,
    )


async def _li_memory_put(ctx: Ctx) -> Any:
    messages = history.to_llamaindex(ctx.history)
    serial = iter(range(10**9))

    async def prepare() -> Any:
        return _li_memory(ctx, f"put-{next(serial)}")

    async def call(memory: Any) -> list[Any]:
        await memory.aput_messages(messages)
        return await memory.aget()

    return prepare, call, _li_neutral


async def _li_memory_read(ctx: Ctx) -> Any:
    memory = _li_memory(ctx, "read")
    await memory.aset(history.to_llamaindex(ctx.history))

    async def call(_: Any) -> list[Any]:
        return await memory.aget()

    return None, call, _li_neutral


async def _li_memory_turn(ctx: Ctx) -> Any:
    """Steady state: older messages already archived, the recent tail trimmed by put; each
    call puts one new user message and reads."""
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.storage.chat_store.base_db import MessageStatus

    messages = history.to_llamaindex(ctx.history)
    memory = _li_memory(ctx, "turn")
    tail = max(1, len(messages) - 60)
    while tail > 1 and messages[tail].role != MessageRole.USER:
        tail -= 1
    await memory.sql_store.add_messages(
        memory.session_id, messages[:tail], status=MessageStatus.ARCHIVED
    )
    await memory.aput_messages(messages[tail:])
    turns = iter(history.next_turns(10_000))
    user = ChatMessage(role=MessageRole.USER, content=ctx.last_user)

    async def prepare() -> Any:
        nonlocal user
        reply, text = next(turns)[1], next(turns)[0]
        await memory.aput(ChatMessage(role=MessageRole.ASSISTANT, content=reply))  # untimed
        user = ChatMessage(role=MessageRole.USER, content=text)
        ctx.last_user = text  # what "last user kept" checks for this peer
        return user

    async def call(message: Any) -> list[Any]:
        await memory.aput(message)
        return await memory.aget()

    return prepare, call, _li_neutral


def _buffer_work(ctx: Ctx) -> float:
    """ChatMemoryBuffer.get: drop the oldest message (and following assistant/tool ones),
    re-tokenize the joined content of everything left, until it fits."""
    roles = [m.role for m in ctx.history.messages]
    content = [c - 4 for c in ctx.counts]
    suffix = [0] * (ctx.n + 1)
    for k in range(1, ctx.n + 1):
        suffix[k] = suffix[k - 1] + content[ctx.n - k]
    count = ctx.n
    work = tokens = suffix[count]
    while tokens > ctx.budget and count > 1:
        count -= 1
        while count > 1 and roles[ctx.n - count] in ("tool", "assistant"):
            count -= 1
        tokens = suffix[count]
        work += tokens
    return float(work)


def _memory_put_work(ctx: Ctx, flush: int = 3000) -> float:
    """Memory._manage_queue: flush ~3,000-token chunks from the oldest end (then up to a
    user message) and re-estimate the whole remaining queue after each chunk."""
    roles = [m.role for m in ctx.history.messages]
    counts = ctx.counts
    remaining = ctx.total
    work = float(remaining)
    start = 0
    while remaining > ctx.budget and ctx.n - start > 1:
        flushed = 0
        while flushed < flush and ctx.n - start > 1:
            flushed += counts[start]
            start += 1
        while roles[start] != "user" and ctx.n - start > 1:
            flushed += counts[start]
            start += 1
        remaining -= flushed
        work += remaining
    return work + remaining  # + the estimate in aget


# AutoGen --------------------------------------------------------------------


def _ag_count(tokens: Callable[[str], int], m: Any) -> int:
    from autogen_core.models import AssistantMessage, FunctionExecutionResultMessage

    if isinstance(m, FunctionExecutionResultMessage):
        return sum(4 + tokens(r.content) for r in m.content)
    if isinstance(m, AssistantMessage) and isinstance(m.content, list):
        return (
            4
            + tokens(m.thought or "")
            + sum(3 + tokens(c.name) + tokens(c.arguments) for c in m.content)
        )
    return 4 + tokens(m.content if isinstance(m.content, str) else str(m.content))


def _ag_client(tokens: Callable[[str], int], budget: int) -> Any:
    from autogen_core.models import ChatCompletionClient, ModelFamily, ModelInfo, RequestUsage

    class TiktokenCountingClient(ChatCompletionClient):
        """Offline client for the context: counts with the shared count (tiktoken, no
        memo), cannot create completions."""

        async def create(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def create_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def close(self) -> None:
            return None

        def actual_usage(self) -> RequestUsage:
            return RequestUsage(prompt_tokens=0, completion_tokens=0)

        def total_usage(self) -> RequestUsage:
            return RequestUsage(prompt_tokens=0, completion_tokens=0)

        def count_tokens(self, messages: Sequence[Any], *, tools: Sequence[Any] = ()) -> int:
            return sum(_ag_count(tokens, m) for m in messages)

        def remaining_tokens(self, messages: Sequence[Any], *, tools: Sequence[Any] = ()) -> int:
            return budget - self.count_tokens(messages, tools=tools)

        @property
        def capabilities(self) -> Any:
            return {"vision": False, "function_calling": True, "json_output": False}

        @property
        def model_info(self) -> ModelInfo:
            return ModelInfo(
                vision=False,
                function_calling=True,
                json_output=False,
                family=ModelFamily.GPT_4,
                structured_output=False,
            )

    return TiktokenCountingClient()


def _ag_neutral(out: list[Any]) -> list[Msg]:
    from autogen_core.models import (
        AssistantMessage,
        FunctionExecutionResultMessage,
        SystemMessage,
    )

    msgs: list[Msg] = []
    for m in out:
        if isinstance(m, FunctionExecutionResultMessage):
            msgs += [Msg("tool", r.content, tool_call_id=r.call_id, name=r.name) for r in m.content]
        elif isinstance(m, AssistantMessage) and isinstance(m.content, list):
            calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in m.content)
            msgs.append(Msg("assistant", m.thought or "", tool_calls=calls))
        elif isinstance(m, AssistantMessage):
            msgs.append(Msg("assistant", m.content))
        elif isinstance(m, SystemMessage):
            msgs.append(Msg("system", m.content))
        else:
            msgs.append(Msg("user", m.content if isinstance(m.content, str) else str(m.content)))
    return msgs


async def _ag_token_limited(ctx: Ctx) -> Any:
    from autogen_core.model_context import TokenLimitedChatCompletionContext

    context = TokenLimitedChatCompletionContext(
        _ag_client(ctx.counter.tokens, ctx.budget),
        token_limit=ctx.budget,
        initial_messages=history.to_autogen(ctx.history),
    )

    async def call(_: Any) -> list[Any]:
        return await context.get_messages()

    return None, call, _ag_neutral


def _ag_work(ctx: Ctx) -> float:
    """get_messages: pop the middle message and recount everything left, until it fits."""
    grouped: list[int] = []
    previous = ""
    for m, c in zip(ctx.history.messages, ctx.counts, strict=True):
        if m.role == "tool" and previous == "tool":
            grouped[-1] += c
        else:
            grouped.append(c)
        previous = m.role
    total = sum(grouped)
    work = float(total)
    while total > ctx.budget and grouped:
        total -= grouped.pop(len(grouped) // 2)
        work += total
    return work


# Semantic Kernel --------------------------------------------------------------


def _sk_neutral(out: list[Any]) -> list[Msg]:
    from semantic_kernel.contents import FunctionCallContent, FunctionResultContent, TextContent

    msgs = []
    for m in out:
        role = m.role.value
        text = "".join(i.text for i in m.items if isinstance(i, TextContent))
        results = [i for i in m.items if isinstance(i, FunctionResultContent)]
        if results:
            r = results[0]
            msgs.append(Msg("tool", str(r.result), tool_call_id=r.id, name=r.name))
            continue
        calls = tuple(
            ToolCall(i.id or "", i.name or "", str(i.arguments))
            for i in m.items
            if isinstance(i, FunctionCallContent)
        )
        msgs.append(Msg(role, text, tool_calls=calls))
    return msgs


async def _sk_truncation(ctx: Ctx) -> Any:
    from semantic_kernel.contents.history_reducer.chat_history_truncation_reducer import (
        ChatHistoryTruncationReducer,
    )

    messages = history.to_semantic_kernel(ctx.history)
    reducer = ChatHistoryTruncationReducer(target_count=ctx.count_k, threshold_count=0)

    async def prepare() -> Any:
        reducer.messages = list(messages)  # reduce() truncates in place
        return reducer

    async def call(r: Any) -> list[Any]:
        await r.reduce()
        return list(r.messages)

    return prepare, call, _sk_neutral


# Haystack ---------------------------------------------------------------------


def to_haystack(h: History) -> list[Any]:
    """The history's messages as Haystack ``ChatMessage``s (tool calls with their ids, each
    result with the call it answers)."""
    from haystack.dataclasses import ChatMessage
    from haystack.dataclasses import ToolCall as HsToolCall

    calls: dict[str, Any] = {}
    out: list[Any] = []
    for m in h.messages:
        if m.role == "system":
            out.append(ChatMessage.from_system(m.content))
        elif m.role == "user":
            out.append(ChatMessage.from_user(m.content))
        elif m.role == "assistant":
            tool_calls = [
                HsToolCall(tool_name=c.name, arguments=json.loads(c.arguments), id=c.call_id)
                for c in m.tool_calls
            ]
            calls.update((c.id or "", c) for c in tool_calls)
            out.append(ChatMessage.from_assistant(m.content or None, tool_calls=tool_calls or None))
        else:
            origin = calls.get(m.tool_call_id or "") or HsToolCall(
                tool_name=m.name or "tool", arguments={}, id=m.tool_call_id
            )
            out.append(ChatMessage.from_tool(m.content, origin=origin))
    return out


def _hs_neutral(out: list[Any]) -> list[Msg]:
    msgs = []
    for m in out:
        result = m.tool_call_result
        if result is not None:
            origin = result.origin
            msgs.append(
                Msg("tool", str(result.result), tool_call_id=origin.id, name=origin.tool_name)
            )
            continue
        calls = tuple(
            ToolCall(c.id or "", c.tool_name, json.dumps(c.arguments)) for c in m.tool_calls
        )
        msgs.append(Msg(m.role.value, m.text or "", tool_calls=calls))
    return msgs


async def _hs_sliding_window(ctx: Ctx) -> Any:
    """What Haystack's ``CompactionHook`` runs once the conversation passes its trigger: the
    ``SlidingWindowCompactor`` bringing it under the target (here: the budget), counted with
    Haystack's ``TiktokenCounter`` on the same encoding."""
    from haystack.hooks.compaction import SlidingWindowCompactor
    from haystack.token_counters import TiktokenCounter

    messages = to_haystack(ctx.history)
    compactor = SlidingWindowCompactor(omission_note=None)
    counter = TiktokenCounter(encoding=ENCODING)
    counter.warm_up()

    async def prepare() -> Any:
        return list(messages)

    async def call(msgs: list[Any]) -> list[Any]:
        return (
            compactor.compact(messages=msgs, target_tokens=ctx.budget, token_counter=counter)
            or msgs
        )

    return prepare, call, _hs_neutral


PEERS = [
    Peer(
        "LangChain `trim_messages` (tiktoken counter)",
        "tokens",
        True,
        _lc_setup(approximate=False),
        _linear,
        whole_history=True,
    ),
    Peer(
        "LangChain `trim_messages` (`count_tokens_approximately`)",
        "tokens (approximate)",
        True,
        _lc_setup(approximate=True),
        _linear,
        whole_history=True,
    ),
    Peer(
        "LlamaIndex `ChatMemoryBuffer.get()`",
        "tokens (content only)",
        True,
        _li_buffer,
        _buffer_work,
        whole_history=True,
    ),
    Peer(
        "LlamaIndex `Memory.aput_messages(history)` + `aget()`",
        "tokens (trims on put)",
        True,
        _li_memory_put,
        _memory_put_work,
        whole_history=True,
    ),
    Peer(
        "LlamaIndex `Memory.aget()` after `aset(history)`",
        "none on read",
        False,
        _li_memory_read,
        _linear,
    ),
    Peer(
        "LlamaIndex `Memory` per turn: `aput(new user msg)` + `aget()`, queue already trimmed",
        "tokens (incremental)",
        True,
        _li_memory_turn,
        lambda ctx: 1.0,
    ),
    Peer(
        "AutoGen `TokenLimitedChatCompletionContext.get_messages()` (tiktoken client)",
        "tokens",
        True,
        _ag_token_limited,
        _ag_work,
        whole_history=True,
    ),
    Peer(
        "Haystack `CompactionHook`'s `SlidingWindowCompactor.compact()` (tiktoken counter)",
        "tokens",
        True,
        _hs_sliding_window,
        _linear,
        whole_history=True,
    ),
    Peer(
        "Semantic Kernel `ChatHistoryTruncationReducer.reduce()`",
        "messages (K)",
        False,
        _sk_truncation,
        lambda ctx: float(ctx.n),
    ),
]


def build_ctx(n: int, counter: Counter) -> Ctx:
    h = history.generate(n, SEED)
    return Ctx(
        n=n,
        history=h,
        counter=counter,
        counts=[counter.message(m) for m in h.messages],
        last_user=h.messages[-1].content,
    )


async def run_peers(sizes: list[int], max_call: float, counter: Counter) -> dict[str, Any]:
    cells: dict[tuple[str, int], Cell] = {}
    stats: dict[int, dict[str, Any]] = {}
    contexts: dict[int, Ctx] = {}

    def ctx_for(n: int) -> Ctx:
        if n not in contexts:
            contexts[n] = build_ctx(n, counter)
        return contexts[n]

    for n in sizes:
        ctx = ctx_for(n)
        msgs = ctx.history.messages
        assistant = [m for m in msgs if m.role == "assistant"]
        stats[n] = {
            "tokens": ctx.total,
            "assistant": len(assistant),
            "with_calls": sum(1 for m in assistant if m.tool_calls),
            "results": sum(1 for m in msgs if m.role == "tool"),
            "autogen_msgs": len(history.to_autogen(ctx.history)),
            "k": ctx.count_k,
            "evidence_chars": sum(len(d.content) for d in ctx.history.evidences),
        }
        for peer in PEERS:
            measured = [m for m in sizes if m < n and cells.get((peer.name, m), Cell()).samples]
            if measured:
                base_ctx = ctx_for(measured[-1])
                base_seconds = cells[(peer.name, measured[-1])].median
            else:  # nothing smaller measured: calibrate with one call on N=100
                base_ctx = ctx_for(100)
                prepare, call, _ = await peer.setup(base_ctx)
                _, base_seconds = await _once(prepare, call)
            projected = base_seconds * peer.work(ctx) / peer.work(base_ctx)
            if projected > max_call and n > 100:
                cells[(peer.name, n)] = Cell(projected=projected)
                print(f"{peer.name} N={n:,}: not run, ~{projected:,.0f} s", file=sys.stderr)
                continue
            prepare, call, neutral = await peer.setup(ctx)
            out, samples = await measure(prepare, call)
            outcome = judge(neutral(out), ctx.history, counter, ctx.last_user)
            ctx.last_user = ctx.history.messages[-1].content  # a per-turn peer moves it
            cell = Cell(samples=samples, outcome=outcome)
            cells[(peer.name, n)] = cell
            print(
                f"{peer.name} N={n:,}: {cell.median * 1e3:,.3f} ms (n={len(samples)}), "
                f"{outcome.kept_msgs} msgs / {outcome.kept_tokens:,} tokens",
                file=sys.stderr,
            )
            del prepare, call, out
            gc.collect()
    contexts.clear()
    gc.collect()
    return {"cells": cells, "stats": stats, "sweep": await run_sweep(counter)}


SWEEP_N = 100
SWEEP_BUDGETS = range(2_000, 12_001, 500)


async def run_sweep(counter: Counter) -> dict[str, dict[str, int]]:
    """Untimed: each whole-history token-budget trimmer at every budget of ``SWEEP_BUDGETS``
    on the N=100 history; how many budgets broke a pair, dropped the system message or went
    over the budget (under the shared count)."""
    ctx = build_ctx(SWEEP_N, counter)
    found: dict[str, dict[str, int]] = {}
    for peer in PEERS:
        if not peer.whole_history:
            continue
        tally = {"budgets": 0, "broken": 0, "system_dropped": 0, "over": 0}
        for budget in SWEEP_BUDGETS:
            ctx.budget = budget
            prepare, call, neutral = await peer.setup(ctx)
            out, _ = await _once(prepare, call)
            o = judge(neutral(out), ctx.history, counter, ctx.last_user)
            tally["budgets"] += 1
            tally["broken"] += not o.pairs_intact
            tally["system_dropped"] += not o.system_kept
            tally["over"] += o.kept_tokens > budget
        found[peer.name] = tally
        print(f"sweep {peer.name}: {tally}", file=sys.stderr)
    return found


# --------------------------------------------------------------------------- ce


def ce_config() -> Any:
    from ce.core.config import BudgetConfig, RuntimeConfig

    return RuntimeConfig(
        model_hint="gpt-4",
        budget=BudgetConfig(
            max_input_tokens=MAX_INPUT_TOKENS, reserved_reply_tokens=RESERVED_REPLY_TOKENS
        ),
    )


def _ce_neutral(parts: Sequence[Any]) -> list[Msg]:
    msgs = []
    for p in parts:
        calls = tuple(
            ToolCall(c.tool_call_id, c.name, c.raw_arguments or json.dumps(c.arguments or {}))
            for c in p.tool_calls or ()
        )
        role = p.role.value if hasattr(p.role, "value") else str(p.role)
        msgs.append(Msg(role, p.content, calls, p.tool_call_id, p.name))
    return msgs


_EVIDENCE_ID = re.compile(r"ev-\d{6}")


def _ce_summary(result: Any, h_system: str, last_user: str, counter: Counter) -> dict[str, Any]:
    parts = result.assembled_input.parts
    msgs = _ce_neutral(parts)
    fake = History(seed=SEED, messages=[Msg("system", h_system)])
    outcome = judge(msgs, fake, counter, last_user)
    report = result.report
    kept_ev = sum(
        d.block_count
        for d in report.prune_decisions
        if d.action != "dropped" and d.block_id.startswith("ev:")
    )
    in_text = set(_EVIDENCE_ID.findall("\n".join(p.content for p in parts)))
    conversation = sum(1 for m in msgs if m.role in ("user", "assistant", "tool"))
    return {
        "parts": len(parts),
        "conversation_msgs": conversation,
        "total_tokens": result.assembled_input.total_tokens,
        "token_used": report.token_used,
        "token_budget": report.token_budget,
        "shared_tokens": outcome.kept_tokens,
        "system_kept": outcome.system_kept,
        "last_user_kept": outcome.last_user_kept,
        "orphan_results": outcome.orphan_results,
        "unanswered_calls": outcome.unanswered_calls,
        "evidences_kept": kept_ev,
        "evidences_in_text": len(in_text),
        "decisions": len(report.prune_decisions),
        "errors": list(report.errors),
        "degradations": list(report.degradations),
    }


PRIMER = "What changed since my last question?"
"""The question of the process that served a session before the cold ones (``prime``)."""


async def ce_child(mode: str, db: Path, n: int, turns: int) -> dict[str, Any]:
    """Runs in a fresh process: one cold turn (``cold``), one cold ``prepare_call`` with the
    whole history as a framework passes it (``cold_call``), one untimed turn and ``turns``
    warm ones (``warm``), or the turn of a process that served the session before (``prime``:
    its question is :data:`PRIMER`; it stores the token counts it computed)."""
    from ce.core.engine import ContextEngine
    from ce.core.schema import Message, ModelInvocation, Role
    from ce.core.stores import SQLiteStore
    from ce.core.testing.histories import as_passed

    counter = Counter()
    texts = history.next_turns(turns + 1)
    system = history.generate(6).messages[0].content  # the same system prompt for every n
    question = Message(role=Role.USER, content=PRIMER if mode == "prime" else texts[0][0])
    passed: list[Message] = []
    if mode == "cold_call":  # the framework's own message objects, built before the clock
        stored, _ = history.to_ce_changes(history.generate(n, SEED), SESSION_ID)
        passed = as_passed(stored.messages)
    start = time.perf_counter()
    store = SQLiteStore(db)
    engine = ContextEngine(store=store, config=ce_config())
    opened = time.perf_counter() - start
    start = time.perf_counter()
    if mode == "cold_call":
        result = await engine.prepare_call(SESSION_ID, [*passed, question])
    else:
        result = await engine.prepare_turn(SESSION_ID, question)
    first = time.perf_counter() - start
    samples = []
    last = texts[0][0]
    for i in range(turns if mode == "warm" else 0):
        reply = Message(
            role=Role.ASSISTANT,
            content=texts[i][1],
            invocation=ModelInvocation(provider=history.PROVIDER, model=history.MODEL),
        )
        await engine.commit_assistant_message(SESSION_ID, reply)
        last = texts[i + 1][0]
        start = time.perf_counter()
        result = await engine.prepare_turn(SESSION_ID, Message(role=Role.USER, content=last))
        samples.append(time.perf_counter() - start)
    await engine.close()
    await store.close()  # the engine closes only a store it opened itself
    summary = _ce_summary(result, system, last, counter)
    return {"mode": mode, "n": n, "open": opened, "first": first, "samples": samples, **summary}


def _copy_db(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        s = Path(str(src) + suffix)
        if s.exists():
            shutil.copyfile(s, Path(str(dst) + suffix))


def _child(args: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ce child {args} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cold_runs(
    mode: str, source: Path, label: str, n: int, runs: int, workdir: Path, timeout: float
) -> list[dict[str, Any]]:
    """``runs`` new processes of ``mode``, each on a fresh copy of ``source``."""
    out = []
    for i in range(runs):
        db = workdir / f"{label.replace(' ', '-')}-{n}-{i}.db"
        _copy_db(source, db)
        out.append(_child(["--child", mode, "--db", str(db), "--n", str(n)], timeout))
        print(f"ce N={n:,} {label} #{i + 1}: {out[-1]['first'] * 1e3:,.1f} ms", file=sys.stderr)
    return out


async def run_ce(
    sizes: list[int], cold_runs: int, warm_turns: int, timeout: float, workdir: Path
) -> dict[int, dict[str, Any]]:
    from ce.core.stores import SQLiteStore

    out: dict[int, dict[str, Any]] = {}
    for n in sizes:
        pristine = workdir / f"pristine-{n}.db"
        store = SQLiteStore(pristine)
        start = time.perf_counter()
        await history.commit_to_store(store, SESSION_ID, history.generate(n, SEED))
        await store.close()
        print(f"ce N={n:,}: session stored in {time.perf_counter() - start:.1f} s", file=sys.stderr)

        colds = _cold_runs("cold", pristine, "cold", n, cold_runs, workdir, timeout)
        served = workdir / f"served-{n}.db"
        _copy_db(pristine, served)
        _child(["--child", "prime", "--db", str(served), "--n", str(n)], timeout)
        counted = _cold_runs("cold", served, "cold counted", n, cold_runs, workdir, timeout)
        calls = _cold_runs(
            "cold_call", pristine, "cold prepare_call", n, cold_runs, workdir, timeout
        )
        db = workdir / f"warm-{n}.db"
        _copy_db(pristine, db)
        warm = _child(
            ["--child", "warm", "--db", str(db), "--n", str(n), "--turns", str(warm_turns)],
            timeout,
        )
        print(
            f"ce N={n:,} warm: {statistics.median(warm['samples']) * 1e3:,.2f} ms median "
            f"over {len(warm['samples'])} turns",
            file=sys.stderr,
        )
        out[n] = {"cold": colds, "cold_counted": counted, "cold_call": calls, "warm": warm}
    return out


# --------------------------------------------------------------------------- report


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:,.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _pairs_text(cells: dict[int, Cell]) -> str:
    broken = []
    for n, cell in cells.items():
        o = cell.outcome
        if o is None or o.pairs_intact:
            continue
        what = []
        if o.orphan_results:
            what.append(f"{o.orphan_results} tool results without their call")
        if o.unanswered_calls:
            what.append(f"{o.unanswered_calls} tool calls without results")
        broken.append(f"N={n:,}: " + ", ".join(what))
    if not any(c.outcome for c in cells.values()):
        return "-"
    return "yes" if not broken else "**no** (" + "; ".join(broken) + ")"


def versions() -> list[tuple[str, str]]:
    found = []
    for name in PACKAGES:
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            found.append((name, "not installed"))
    return found


def peers_table(sizes: list[int], peers: dict[str, Any]) -> list[str]:
    cells = peers["cells"]
    head = (
        "| trimmer | limits | "
        + " | ".join(f"N={n:,} ms" for n in sizes)
        + " | "
        + " | ".join(f"N={n:,} kept msgs / tokens" for n in sizes)
        + " | system kept | last user kept | pairs intact |"
    )
    lines = [head, "|" + " --- |" * 2 + " ---: |" * (2 * len(sizes)) + " --- | --- | --- |"]
    for peer in PEERS:
        mine = {n: cells[(peer.name, n)] for n in sizes if (peer.name, n) in cells}
        times, kept = [], []
        for n in sizes:
            cell = mine.get(n)
            if cell is None:
                times.append("-")
                kept.append("-")
            elif not cell.samples:
                times.append(f"not run: ~{cell.projected:,.0f} s projected")
                kept.append("-")
            else:
                reps = len(cell.samples)
                times.append(_ms(cell.median) + (f" (n={reps})" if reps < 20 else ""))
                o = cell.outcome
                over = " (over)" if o.kept_tokens > BUDGET else ""
                kept.append(f"{o.kept_msgs:,} / {o.kept_tokens:,}{over}")
        outcomes = [c.outcome for c in mine.values() if c.outcome]
        system = _yes(all(o.system_kept for o in outcomes)) if outcomes else "-"
        last = _yes(all(o.last_user_kept for o in outcomes)) if outcomes else "-"
        kind = peer.kind + ("" if peer.token_budget else " †")
        lines.append(
            f"| {peer.name} | {kind} | "
            + " | ".join(times)
            + " | "
            + " | ".join(kept)
            + f" | {system} | {last} | {_pairs_text(mine)} |"
        )
    return lines


def ce_table(ce: dict[int, dict[str, Any]]) -> list[str]:
    lines = [
        "| N messages / evidences | cold median (ms) | cold p95 (ms) "
        "| cold, counts stored, median (ms) | cold, counts stored, p95 (ms) "
        "| cold `prepare_call` median (ms) | cold `prepare_call` p95 (ms) | warm median (ms) "
        "| warm p95 (ms) | parts (conversation msgs) | tokens used / budget "
        "| shared count of parts | evidences kept | system kept | last user kept "
        "| pairs intact |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | --- | --- | --- |",
    ]
    for n, r in ce.items():
        cold = [c["first"] for c in r["cold"]]
        counted = [c["first"] for c in r["cold_counted"]]
        call = [c["first"] for c in r["cold_call"]]
        w = r["warm"]
        pairs = w["orphan_results"] == 0 and w["unanswered_calls"] == 0
        pairs_text = (
            "yes"
            if pairs
            else f"**no** ({w['orphan_results']} orphan results, "
            f"{w['unanswered_calls']} unanswered calls)"
        )
        lines.append(
            f"| {n:,} / {n:,} | {_ms(statistics.median(cold))} | {_ms(percentile(cold, 95))} "
            f"| {_ms(statistics.median(counted))} | {_ms(percentile(counted, 95))} "
            f"| {_ms(statistics.median(call))} | {_ms(percentile(call, 95))} "
            f"| {_ms(statistics.median(w['samples']))} | {_ms(percentile(w['samples'], 95))} "
            f"| {w['parts']} ({w['conversation_msgs']}) | {w['token_used']:,} / "
            f"{w['token_budget']:,} | {w['shared_tokens']:,} | {w['evidences_kept']} "
            f"| {_yes(w['system_kept'])} | {_yes(w['last_user_kept'])} | {pairs_text} |"
        )
    return lines


def acceptance(
    sizes: list[int], peers: dict[str, Any] | None, ce: dict[int, dict[str, Any]] | None
) -> tuple[list[str], dict[str, float]]:
    big, small = max(sizes), min(sizes)
    lines: list[str] = []
    ratios: dict[str, float] = {}
    warm = {n: statistics.median(r["warm"]["samples"]) for n, r in (ce or {}).items()}

    def fastest(whole_only: bool) -> tuple[float, str] | None:
        cells = peers["cells"] if peers else {}
        found = [
            (cells[(p.name, big)].median, p.name)
            for p in PEERS
            if p.token_budget
            and (p.whole_history or not whole_only)
            and (p.name, big) in cells
            and cells[(p.name, big)].samples
        ]
        return min(found) if found else None

    target, whole = fastest(whole_only=False), fastest(whole_only=True)
    if target and big in warm:
        ratios["vs_peer"] = warm[big] / target[0]
        lines.append(
            f"- Warm `prepare_turn` at N={big:,}: {_ms(warm[big])} ms; fastest token-budget "
            f"trimmer at N={big:,} in this run: {target[1]}, {_ms(target[0])} ms. "
            f"Ratio **{ratios['vs_peer']:.3f}** (target ≤ 0.5: "
            f"{'met' if ratios['vs_peer'] <= 0.5 else '**not met**'})."
        )
    if whole and target and whole != target and big in warm:
        ratios["vs_whole"] = warm[big] / whole[0]
        lines.append(
            f"- For reference, against the fastest trimmer that trims the whole history per "
            f"call ({whole[1]}, {_ms(whole[0])} ms): ratio {ratios['vs_whole']:.3f}."
        )
    if big in warm and small in warm and big != small:
        ratios["growth"] = warm[big] / warm[small]
        lines.append(
            f"- Warm `prepare_turn` at N={big:,} ÷ at N={small:,}: {_ms(warm[big])} ms ÷ "
            f"{_ms(warm[small])} ms = **{ratios['growth']:.2f}** (target ≤ 2: "
            f"{'met' if ratios['growth'] <= 2 else '**not met**'})."
        )
    for key, what, ratio in (
        ("cold", "Cold `prepare_turn`", "cold_growth"),
        ("cold_counted", "Cold `prepare_turn`, token counts stored", "cold_counted_growth"),
        ("cold_call", "Cold `prepare_call` with the whole history", "cold_call_growth"),
    ):
        cold = {n: statistics.median([c["first"] for c in r[key]]) for n, r in (ce or {}).items()}
        if big in cold and small in cold and big != small:
            ratios[ratio] = cold[big] / cold[small]
            lines.append(
                f"- {what} at N={big:,}: {_ms(cold[big])} ms (target ≤ 50 ms: "
                f"{'met' if cold[big] <= 0.05 else '**not met**'}); ÷ at N={small:,}: "
                f"{_ms(cold[big])} ms ÷ {_ms(cold[small])} ms = **{ratios[ratio]:.2f}** "
                f"(target ≤ 2: {'met' if ratios[ratio] <= 2 else '**not met**'})."
            )
    if not lines:
        lines.append("- Not computed in this run (it needs both the ce and the peer figures).")
    return lines, ratios


def report(
    sizes: list[int],
    peers: dict[str, Any] | None,
    ce: dict[int, dict[str, Any]] | None,
    command: str,
    wall: float,
    cold_runs: int,
    warm_turns: int,
    load: tuple[float, float, float],
) -> str:
    lines = [
        "## `prepare_turn` and the frameworks' own trimmers",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, total wall time {wall:,.0f} s  ",
        f"Machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}; load average "
        f"{load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end (a shared machine: "
        "other work on it shows up as noise)",
        "",
        "Setup:",
        "",
        "- History: `benchmarks/history.py`, seed 20240601. A system prompt, then user and "
        "assistant turns of 20-400 words (~80% English, ~10% Chinese, ~10% mixed); ~20% of "
        "the assistant turns make 1-3 parallel tool calls (20% of those a second round), each "
        "answered by a JSON tool result of 100-2,000 characters; the last message is a user "
        "message. Plus N retrieved documents (`rag_doc` evidences of 200-1,500 characters, "
        "source URI, retrieval score as confidence).",
    ]
    if peers:
        for n, s in peers["stats"].items():
            lines.append(
                f"  - N={n:,}: {s['tokens']:,} tokens ({s['tokens'] / n:,.0f}/msg); "
                f"{s['assistant']:,} assistant messages, {s['with_calls']:,} with tool calls, "
                f"{s['results']:,} tool results (AutoGen form: {s['autogen_msgs']:,} messages, "
                f"results batched); evidences {s['evidence_chars']:,} characters; "
                f"count-based K = {s['k']}."
            )
    lines += [
        f"- Budget {BUDGET:,} tokens; keep the system message and the latest user message. "
        "Tokenizer for every trimmer that takes one: tiktoken `cl100k_base` (exact). "
        "'tokens' in the tables is one shared count per message: 4 + tokens(content) + per "
        "tool call (3 + tokens(name) + tokens(JSON arguments)), so results over the budget "
        "show up as '(over)'. 'pairs intact': no tool result without its assistant tool-call "
        "message before it, and no tool call without all its results.",
        "- Trimmers: LangChain `trim_messages(strategy='last', include_system=True, "
        "start_on='human')`; LlamaIndex `ChatMemoryBuffer(token_limit=8000)` and `Memory("
        "token_limit=8000, chat_history_token_ratio=1.0)`, tokenizer `cl100k_base`; AutoGen "
        "`TokenLimitedChatCompletionContext(token_limit=8000)` with an offline client whose "
        "`count_tokens` is the shared count (tiktoken on every call, no memo); Semantic Kernel "
        "`ChatHistoryTruncationReducer(target_count=K, threshold_count=0)` with K = budget ÷ "
        "mean tokens per message; Haystack `SlidingWindowCompactor(omission_note=None)."
        "compact(target_tokens=8000)` with its `TiktokenCounter('cl100k_base')`, what "
        "`CompactionHook` runs once its trigger fires (`TokenBudgetHook` stops a run instead "
        "of trimming: no row). The LlamaIndex `Memory` per-turn row is its steady state: "
        "the older messages archived, the recent ones trimmed by `aput_messages`, then per "
        "call one assistant reply put untimed and one new user message put and read timed "
        "(as the warm `prepare_turn` turns); after 20 calls its queue holds only those new "
        "turns, hence the same kept figures at every N. † marks rows that do not trim to a "
        "token budget; they are not comparison targets.",
        "- Timing of the trimmers: in this process, per call, after a warm-up (1 call, +2 "
        f"when fast); median of 20 calls (200 when sub-ms), fewer when 20 would take over "
        f"{CELL_SECONDS:.0f} s ('n=' says how many; a first call over {SLOW_CALL:.0f} s counts "
        "as one). Building framework objects and restoring a history a call mutates is "
        "untimed. A cell whose single call is projected over the limit is not run; the "
        "projection scales the time at the next smaller N by a work model (tokens the "
        "trimmer feeds to the tokenizer). GC on.",
        "- `prepare_turn`: `ContextEngine(store=SQLiteStore(path), config=RuntimeConfig("
        f"model_hint='gpt-4', budget=BudgetConfig(max_input_tokens={MAX_INPUT_TOKENS}, "
        f"reserved_reply_tokens={RESERVED_REPLY_TOKENS})))`, i.e. {BUDGET:,} context tokens "
        "in `cl100k_base`; the session (N messages written through `AgentState`, N "
        "evidences) committed to a SQLite file beforehand. **Cold**: a new process opens the "
        "store, builds the engine (untimed) and times its first `prepare_turn` with a new "
        "user message; median and p95 (interpolated; with few runs, near the slowest) over "
        f"{cold_runs} processes, each on a fresh copy of the file (in the OS page cache). "
        "A cold turn reads the session's newest records from the store (64 messages, 64 "
        "evidences and what goes with them), twice as many again while the budget could "
        "keep older ones; it never reads the whole session. The session was written without "
        "the engine, so its rows hold no token counts (as after a bulk import, or in a file "
        "of an earlier layout): the cold turn tokenizes every text it could keep. **Cold, "
        "counts stored**: the same, on copies of the file after one process served the "
        f"session (a cold `prepare_turn` of {PRIMER!r}, which stored the token counts it "
        "computed with its question): the cold turn takes the counts it reads with the "
        "records and tokenizes only what they do not cover. **Cold `prepare_call`**: the "
        "same, but the first call is `prepare_call` with the whole history as a framework "
        "passes it (N messages of its own, built before the clock, then the new user "
        "message); the engine matches the end of that list against the session's newest "
        "records and reads no more of the session. "
        f"**Warm**: one process, after that first turn, times {warm_turns} next turns, each "
        "a new user message, with "
        "`commit_assistant_message` of the reply between turns (untimed). The columns after "
        "p95 describe the last warm turn: parts of `assembled_input` (system part included), "
        "`report.token_used` / `report.token_budget`, the shared count of the parts, the "
        "evidence blocks kept or degraded according to `report.prune_decisions`.",
        "",
        "Versions:",
        "",
        "| package | version |",
        "| --- | --- |",
        *(f"| {name} | {version} |" for name, version in versions()),
        "",
    ]
    if ce:
        lines += ["### `prepare_turn` (SQLiteStore)", "", *ce_table(ce), ""]
    if peers:
        lines += [
            "### The frameworks' trimmers, median ms per call",
            "",
            *peers_table(sizes, peers),
            "",
            f"Pair-integrity sweep (untimed): the whole-history token-budget trimmers on the "
            f"N={SWEEP_N} history at every budget from {SWEEP_BUDGETS.start:,} to "
            f"{SWEEP_BUDGETS.stop - 1:,} tokens in steps of {SWEEP_BUDGETS.step}; how many "
            "budgets gave a broken tool-call/result pair, a dropped system message, or a "
            "result over the budget (shared count).",
            "",
            "| trimmer | budgets | broken pairs | system dropped | over budget |",
            "| --- | ---: | ---: | ---: | ---: |",
            *(
                f"| {name} | {t['budgets']} | {t['broken']} | {t['system_dropped']} | {t['over']} |"
                for name, t in peers["sweep"].items()
            ),
            "",
        ]
    ratio_lines, _ = acceptance(sizes, peers, ce)
    lines += [
        "### Acceptance",
        "",
        "The comparison target is the fastest token-budget trimmer (rows without †) that "
        "ran at the largest size in this run.",
        "",
        *ratio_lines,
    ]
    if peers:
        lines += ["", "### What the trimmers kept (from the figures above)", "", *notes(peers)]
    return "\n".join(lines) + "\n"


def notes(peers: dict[str, Any]) -> list[str]:
    """Which trimmers split tool pairs, dropped the system message or overran the budget."""
    broke, dropped, over = [], [], []
    for peer in PEERS:
        outcomes = [c.outcome for (name, _), c in peers["cells"].items() if name == peer.name]
        outcomes = [o for o in outcomes if o]
        swept = peers["sweep"].get(peer.name, {})
        if any(not o.pairs_intact for o in outcomes) or swept.get("broken"):
            where = f"{swept['broken']} of {swept['budgets']} budgets in the sweep" if swept else ""
            broke.append(f"{peer.name}" + (f" ({where})" if where else ""))
        if any(not o.system_kept for o in outcomes):
            dropped.append(peer.name)
        if any(o.kept_tokens > BUDGET for o in outcomes) or swept.get("over"):
            over.append(peer.name + ("" if peer.token_budget else " †"))
    return [
        "- Left a tool result without its call, or a call without its results: "
        + ("; ".join(broke) if broke else "none")
        + ".",
        "- Dropped the system message: " + ("; ".join(dropped) if dropped else "none") + ".",
        "- Returned more than the budget under the shared count (in the table or the sweep): "
        + ("; ".join(over) if over else "none")
        + ".",
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="comma-separated history sizes")
    parser.add_argument("--skip-peers", action="store_true", help="do not run the frameworks")
    parser.add_argument("--skip-ce", action="store_true", help="do not run prepare_turn")
    parser.add_argument("--cold-runs", type=int, default=5, help="processes per cold figure")
    parser.add_argument("--warm-turns", type=int, default=30, help="timed warm turns")
    parser.add_argument(
        "--max-call", type=float, default=120.0, help="skip cells projected over this (s)"
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    parser.add_argument(
        "--child", choices=("cold", "cold_call", "warm", "prime"), help=argparse.SUPPRESS
    )
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(await ce_child(args.child, args.db, args.n, args.turns)))
        return

    started, load = time.perf_counter(), os.getloadavg()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    counter = Counter()
    peers = None if args.skip_peers else await run_peers(sizes, args.max_call, counter)
    ce = None
    if not args.skip_ce:
        with tempfile.TemporaryDirectory() as tmp:
            ce = await run_ce(sizes, args.cold_runs, args.warm_turns, 900.0, Path(tmp))
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    section = report(
        sizes,
        peers,
        ce,
        command,
        time.perf_counter() - started,
        args.cold_runs,
        args.warm_turns,
        load,
    )
    print(section)
    if args.write:
        write_section(args.write, "prepare", section)
        print(f"wrote {args.write}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
