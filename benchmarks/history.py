"""A deterministic, framework-neutral chat history for the benchmarks, and its converters.

:func:`generate` builds, from one seed (default 20240601), a history of exactly ``n``
messages and ``n`` retrieved documents:

* message 0 is a system prompt; the last message is a user message;
* user and assistant turns of 20-400 words, ~80% English, ~10% Chinese, ~10% mixed;
* ~20% of the assistant turns make 1-3 parallel tool calls (20% of those a second round),
  each answered by a JSON tool result of 100-2,000 characters, then the assistant answers;
* ``n`` ``rag_doc`` evidences of 200-1,500 characters, each with a source URI and a
  retrieval score in [0.30, 0.99] (the evidence's confidence).

The converters turn it into what each framework keeps: ``ce`` change sets written through
:class:`ce.core.state.AgentState` (:func:`to_ce_changes`, :func:`commit_to_store`), LangChain
messages, LlamaIndex ``ChatMessage``s, AutoGen ``LLMMessage``s (all results of one assistant
turn batched in one ``FunctionExecutionResultMessage``, as AutoGen does) and Semantic Kernel
``ChatMessageContent``s. Framework imports are local to each converter, so this module needs
only the standard library (and ce-core for the ce converters).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ce.core.stores import BaseStore
    from ce.core.stores.base import SessionChanges

__all__ = [
    "SEED",
    "Doc",
    "History",
    "Msg",
    "ToolCall",
    "commit_to_store",
    "generate",
    "next_turns",
    "to_autogen",
    "to_ce_changes",
    "to_langchain",
    "to_llamaindex",
    "to_semantic_kernel",
    "turns_after",
]

SEED = 20240601
PROVIDER, MODEL = "openai", "gpt-4"

_EN_TEXT = (
    "the a an of to and in for on with as by at from that this it is are was be can will "
    "should would could may might not no yes we you they our your their data model context "
    "token budget message session agent tool call result query search index document "
    "source report user assistant system memory store record field value schema version "
    "request response latency cache retry timeout error status config runtime engine "
    "prompt history summary evidence score window limit order customer invoice payment "
    "shipment warehouse region price discount total account email address city weather "
    "forecast temperature table column row join filter group sort page chart metric "
    "trend quarter revenue growth cost margin plan task step deadline team review test "
    "build deploy release branch commit issue ticket priority owner first last next "
    "previous new old large small fast slow exact approximate because however therefore "
    "then also only still already again please thanks check compare explain show list "
    "find update create delete keep drop include exclude"
)
_ZH_TEXT = (
    "我们 你们 他们 数据 模型 上下文 令牌 预算 消息 会话 代理 工具 调用 结果 查询 搜索 索引 "
    "文档 来源 报告 用户 助手 系统 记忆 存储 记录 字段 版本 请求 响应 延迟 缓存 重试 超时 "
    "错误 状态 配置 运行 引擎 提示 历史 摘要 证据 分数 窗口 限制 订单 客户 发票 支付 物流 "
    "仓库 区域 价格 折扣 总计 账户 地址 城市 天气 预报 温度 表格 指标 趋势 季度 收入 增长 "
    "成本 计划 任务 步骤 团队 测试 发布 问题 优先级 首先 然后 因为 所以 但是 已经 还是 "
    "请 谢谢 检查 比较 解释 显示 查找 更新 创建 删除 保留 包含 非常 可以 需要 应该 没有"
)
_EN = _EN_TEXT.split()
_ZH = _ZH_TEXT.split()
_TOOLS = ("search_docs", "get_weather", "run_sql", "fetch_url", "lookup_order", "calc_stats")
_TOPICS = ("billing", "shipping", "accounts", "api", "security", "pricing", "onboarding")


@dataclass(frozen=True)
class ToolCall:
    """One tool call an assistant message makes; ``arguments`` is the JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Msg:
    """One neutral message: role is ``system``, ``user``, ``assistant`` or ``tool``."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Doc:
    """One retrieved document (a ``rag_doc`` evidence)."""

    evidence_id: str
    content: str
    uri: str
    score: float


@dataclass
class History:
    seed: int
    messages: list[Msg] = field(default_factory=list)
    evidences: list[Doc] = field(default_factory=list)


class _Text:
    """Random prose: English, Chinese or a mix, sentence by sentence."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def words(self, count: int, language: str) -> str:
        """``count`` words in sentences; in "mixed", the language switches within sentences.
        Chinese words are written without spaces between them, English ones with."""
        rng = self.rng
        out: list[str] = []
        sentence: list[tuple[str, bool]] = []
        zh = language == "zh"
        for _ in range(count):
            if language == "mixed" and rng.random() < 0.15:
                zh = not zh
            sentence.append((rng.choice(_ZH if zh else _EN), zh))
            if len(sentence) >= rng.randint(6, 16):
                out.append(self._sentence(sentence))
                sentence = []
        if sentence:
            out.append(self._sentence(sentence))
        return ("" if language == "zh" else " ").join(out)

    def _sentence(self, words: list[tuple[str, bool]]) -> str:
        text = words[0][0]
        for (word, zh), (_, previous_zh) in zip(words[1:], words, strict=False):
            text += word if zh and previous_zh else " " + word
        if words[-1][1]:
            return text + "。"
        if self.rng.random() < 0.1:
            text += f" {self.rng.randint(2, 99_999)}"
        return text[0].upper() + text[1:] + "."

    def language(self) -> str:
        r = self.rng.random()
        return "en" if r < 0.8 else ("zh" if r < 0.9 else "mixed")

    def turn(self) -> str:
        return self.words(self.rng.randint(20, 400), self.language())

    def chars(self, low: int, high: int) -> str:
        """Prose of ``low``-``high`` characters (cut at a word when possible)."""
        target = self.rng.randint(low, high)
        language = self.language()
        text = self.words(max(8, target // 4), language)
        while len(text) < target:
            text += " " + self.words(max(8, (target - len(text)) // 4), language)
        return text[:target]


def _arguments(rng: random.Random, text: _Text, name: str) -> str:
    args: dict[str, Any] = {"query": text.words(rng.randint(2, 8), "en")}
    if name in ("search_docs", "run_sql"):
        args["limit"] = rng.choice((5, 10, 20))
    if name == "get_weather":
        args = {"city": rng.choice(("Paris", "Oslo", "Rome", "上海", "Lima")), "days": 3}
    if name == "lookup_order":
        args = {"order_id": f"ord-{rng.randint(10_000, 99_999)}"}
    return json.dumps(args, ensure_ascii=False)


def _result(rng: random.Random, text: _Text) -> str:
    """A JSON tool result of 100-2,000 characters."""
    target = rng.randint(100, 2000)
    items: list[dict[str, Any]] = []
    payload: dict[str, Any] = {"status": "ok", "items": items}
    while True:
        item = {
            "id": rng.randint(1, 10**6),
            "title": text.words(rng.randint(3, 8), "en"),
            "snippet": text.words(rng.randint(8, 30), text.language()),
            "score": round(rng.random(), 3),
        }
        items.append(item)
        dumped = json.dumps(payload, ensure_ascii=False)
        if len(dumped) >= target:
            break
    while len(dumped) > target and len(items) > 1:
        items.pop()
        dumped = json.dumps(payload, ensure_ascii=False)
    if len(dumped) > target:  # one item too long: shorten its snippet
        snippet = items[0]["snippet"]
        items[0]["snippet"] = snippet[: max(0, len(snippet) - (len(dumped) - target))]
        dumped = json.dumps(payload, ensure_ascii=False)
    return dumped


def _fits(left: int) -> bool:
    """Whether ``left`` more messages can be user/assistant turns ending on a user message."""
    return left == 1 or left == 3 or left >= 5


def generate(n: int, seed: int = SEED, evidences: int | None = None) -> History:
    """The history of exactly ``n`` messages (``n >= 6``) and ``evidences`` documents
    (default ``n``), the same for the same arguments."""
    if n < 6:
        raise ValueError("n must be at least 6")
    rng = random.Random(seed)
    text = _Text(rng)
    calls = 0
    system = (
        "You are a careful support and analytics assistant for an online retailer. Answer "
        "in the user's language. Use the tools when the answer depends on live data: "
        "search_docs for policies, run_sql for figures, lookup_order for orders, "
        "get_weather for delivery forecasts. Cite the documents you used by their URI. "
        "Never invent order numbers, prices or dates; say what you could not find."
    )
    msgs = [Msg("system", system)]

    def tool_round(k: int) -> list[Msg]:
        nonlocal calls
        requests = []
        for _ in range(k):
            calls += 1
            name = rng.choice(_TOOLS)
            requests.append(ToolCall(f"call_{calls:06d}", name, _arguments(rng, text, name)))
        lead = text.words(rng.randint(5, 25), "en") if rng.random() < 0.5 else ""
        out = [Msg("assistant", lead, tool_calls=tuple(requests))]
        out += [
            Msg("tool", _result(rng, text), tool_call_id=c.call_id, name=c.name) for c in requests
        ]
        return out

    while True:
        left = n - len(msgs)
        msgs.append(Msg("user", text.turn()))
        if left == 1:
            break
        room = left - 1  # messages after this user message
        unit: list[Msg] = []
        if rng.random() < 0.2:
            unit = tool_round(rng.randint(1, 3))
            if rng.random() < 0.2:
                unit += tool_round(rng.randint(1, 3))
            unit.append(Msg("assistant", text.turn()))
        if not unit or not _fits(room - len(unit)):
            if _fits(room - 1):
                calls -= sum(len(m.tool_calls) for m in unit)
                unit = [Msg("assistant", text.turn())]
            else:  # room - 1 is 2 or 4: one round with (room - 3) results fills it
                calls -= sum(len(m.tool_calls) for m in unit)
                unit = [*tool_round(room - 3), Msg("assistant", text.turn())]
        msgs.extend(unit)
    assert len(msgs) == n and msgs[-1].role == "user"

    docs = []
    for i in range(n if evidences is None else evidences):
        topic = rng.choice(_TOPICS)
        docs.append(
            Doc(
                evidence_id=f"ev-{i:06d}",
                content=text.chars(200, 1500),
                uri=f"kb://{topic}/doc-{i:06d}.md",
                score=round(rng.uniform(0.30, 0.99), 3),
            )
        )
    return History(seed=seed, messages=msgs, evidences=docs)


# --------------------------------------------------------------------------- converters


def to_ce_changes(history: History, session_id: str) -> tuple[SessionChanges, SessionChanges]:
    """The history as written by :class:`ce.core.state.AgentState`, and the evidences as a
    second change set: ``(messages, evidences)``."""
    from ce.core.schema import Evidence, EvidenceSource, EvidenceType, ModelInvocation, SourceKind
    from ce.core.schema import ToolCallRequest as CeToolCall
    from ce.core.state import AgentState, ModelOutput, ToolResult
    from ce.core.stores.base import SessionChanges

    state = AgentState(session_id)
    invocation = ModelInvocation(provider=PROVIDER, model=MODEL)
    pending: list[ToolResult] = []
    for m in history.messages:
        if m.role != "tool" and pending:
            state.append_tool_results(pending)
            pending = []
        if m.role == "system":
            state.set_system_instruction(m.content)
        elif m.role == "user":
            state.append_model_input(m.content)
        elif m.role == "assistant":
            state.append_model_output(
                ModelOutput(
                    text=m.content,
                    tool_calls=[
                        CeToolCall(
                            tool_call_id=c.call_id,
                            name=c.name,
                            raw_arguments=c.arguments,
                            arguments=json.loads(c.arguments),
                        )
                        for c in m.tool_calls
                    ],
                    invocation=invocation,
                )
            )
        else:
            pending.append(
                ToolResult(tool_call_id=m.tool_call_id or "", name=m.name or "", content=m.content)
            )
    if pending:
        state.append_tool_results(pending)
    evidences = SessionChanges(
        evidences=[
            Evidence(
                evidence_id=d.evidence_id,
                type=EvidenceType.RAG_DOC,
                source=EvidenceSource(kind=SourceKind.RAG, name="kb", uri=d.uri),
                content=d.content,
                confidence=d.score,
                metadata={"score": d.score},
            )
            for d in history.evidences
        ]
    )
    return state.take_changes(), evidences


async def commit_to_store(store: BaseStore, session_id: str, history: History) -> None:
    """Write the history, then the evidences, into ``store`` under ``session_id``."""
    messages, evidences = to_ce_changes(history, session_id)
    for changes in (messages, evidences):
        result = await store.commit(session_id, changes)
        if not result.success:
            raise RuntimeError(f"commit failed: {result.error}")


def to_langchain(history: History) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    out: list[Any] = []
    for m in history.messages:
        if m.role == "system":
            out.append(SystemMessage(m.content))
        elif m.role == "user":
            out.append(HumanMessage(m.content))
        elif m.role == "assistant":
            calls = [
                {
                    "name": c.name,
                    "args": json.loads(c.arguments),
                    "id": c.call_id,
                    "type": "tool_call",
                }
                for c in m.tool_calls
            ]
            out.append(AIMessage(m.content, tool_calls=calls))
        else:
            out.append(ToolMessage(m.content, tool_call_id=m.tool_call_id or "", name=m.name))
    return out


def to_llamaindex(history: History) -> list[Any]:
    from llama_index.core.base.llms.types import (
        ChatMessage,
        MessageRole,
        TextBlock,
        ToolCallBlock,
    )

    out: list[Any] = []
    for m in history.messages:
        if m.role == "assistant":
            blocks: list[Any] = [TextBlock(text=m.content)] if m.content else []
            blocks += [
                ToolCallBlock(
                    tool_call_id=c.call_id, tool_name=c.name, tool_kwargs=json.loads(c.arguments)
                )
                for c in m.tool_calls
            ]
            out.append(ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks))
        elif m.role == "tool":
            out.append(
                ChatMessage(
                    role=MessageRole.TOOL,
                    content=m.content,
                    additional_kwargs={"tool_call_id": m.tool_call_id, "name": m.name},
                )
            )
        else:
            out.append(ChatMessage(role=MessageRole(m.role), content=m.content))
    return out


def to_autogen(history: History) -> list[Any]:
    """AutoGen keeps an assistant turn's text in ``thought`` when it calls tools, and all
    results of one turn in one ``FunctionExecutionResultMessage``."""
    from autogen_core import FunctionCall
    from autogen_core.models import (
        AssistantMessage,
        FunctionExecutionResult,
        FunctionExecutionResultMessage,
        SystemMessage,
        UserMessage,
    )

    out: list[Any] = []
    results: list[FunctionExecutionResult] = []
    for m in history.messages:
        if m.role != "tool" and results:
            out.append(FunctionExecutionResultMessage(content=results))
            results = []
        if m.role == "system":
            out.append(SystemMessage(content=m.content))
        elif m.role == "user":
            out.append(UserMessage(content=m.content, source="user"))
        elif m.role == "assistant" and m.tool_calls:
            calls = [
                FunctionCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in m.tool_calls
            ]
            out.append(
                AssistantMessage(content=calls, thought=m.content or None, source="assistant")
            )
        elif m.role == "assistant":
            out.append(AssistantMessage(content=m.content, source="assistant"))
        else:
            results.append(
                FunctionExecutionResult(
                    content=m.content, name=m.name or "", call_id=m.tool_call_id or ""
                )
            )
    if results:
        out.append(FunctionExecutionResultMessage(content=results))
    return out


def to_semantic_kernel(history: History) -> list[Any]:
    """``ChatMessageContent``s; pass them as ``messages=`` of a ``ChatHistory`` (or reducer)."""
    from semantic_kernel.contents import (
        AuthorRole,
        ChatMessageContent,
        FunctionCallContent,
        FunctionResultContent,
        TextContent,
    )

    roles = {
        "system": AuthorRole.SYSTEM,
        "user": AuthorRole.USER,
        "assistant": AuthorRole.ASSISTANT,
        "tool": AuthorRole.TOOL,
    }
    out: list[Any] = []
    for m in history.messages:
        items: list[Any] = []
        if m.role == "tool":
            items.append(FunctionResultContent(id=m.tool_call_id, name=m.name, result=m.content))
        else:
            if m.content:
                items.append(TextContent(text=m.content))
            items += [
                FunctionCallContent(id=c.call_id, name=c.name, arguments=c.arguments)
                for c in m.tool_calls
            ]
        out.append(ChatMessageContent(role=roles[m.role], items=items))
    return out


def next_turns(count: int, seed: int = SEED) -> list[tuple[str, str]]:
    """``count`` (user, assistant) texts for the turns that follow a generated history (the
    same for the same seed, whatever ``n`` the history had)."""
    return list(itertools.islice(turns_after(seed), count))


def turns_after(seed: int = SEED) -> Iterator[tuple[str, str]]:
    """The texts of :func:`next_turns`, made as they are taken, without end."""
    text = _Text(random.Random(seed + 1))
    while True:
        yield text.turn(), text.turn()
