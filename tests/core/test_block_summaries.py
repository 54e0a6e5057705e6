"""Block summaries (``SummaryConfig.blocks``): a long message a call had to degrade gets a
model-written Summary level through the engine's ``LlmAdapter`` — asked for after that call
(never while it waits), stored once as ``llm_output`` evidence with its ``model_usage``
(stage ``summarize``), used from the next call on (also by another engine on the same store),
with the level and the tokens saved in the report; a failing adapter changes nothing else."""

from __future__ import annotations

import threading
from pathlib import Path

from ce.core import (
    BudgetConfig,
    ContextEngine,
    Event,
    EvidenceType,
    LlmRequest,
    LlmResponse,
    MemoryStore,
    Message,
    ModelInvocation,
    Role,
    RuntimeConfig,
    SQLiteStore,
    SummaryConfig,
    ToolCallRequest,
)
from ce.core.pipeline import SUMMARY_OF

INV = ModelInvocation(provider="openai", model="gpt-4o")
SUMMARY = "Order A-1001: shipped 2024-05-02 by DHL, tracking 998877."
REPORT = (
    "The warehouse report for order A-1001 follows in full detail. "
    + "Each pallet was scanned, weighed and checked against the manifest before loading. " * 40
    + "The order shipped on 2024-05-02 with DHL under tracking number 998877."
)
CONFIG = RuntimeConfig(
    model_hint="gpt-4o",
    budget=BudgetConfig(max_input_tokens=600, reserved_reply_tokens=100),
    summary=SummaryConfig(enabled=False, blocks=True, block_min_tokens=100),
)


class Adapter:
    """Answers every request with ``SUMMARY``; remembers the requests and their threads."""

    def __init__(self, fail: bool = False) -> None:
        self.requests: list[LlmRequest] = []
        self.threads: list[int] = []
        self.fail = fail

    async def generate(self, request: LlmRequest) -> LlmResponse:
        self.requests.append(request)
        self.threads.append(threading.get_ident())
        if self.fail:
            raise ConnectionError("summarizer offline")
        return LlmResponse(
            content=SUMMARY,
            model="gpt-4o-mini",
            provider="openai",
            prompt_tokens=700,
            completion_tokens=20,
            total_tokens=720,
        )


def _first_turn() -> list[Message]:
    return [
        Message(role=Role.USER, content="Where is order A-1001?"),
        Message(
            role=Role.ASSISTANT,
            content="",
            tool_calls=[ToolCallRequest(tool_call_id="c1", name="report", raw_arguments="{}")],
            invocation=INV,
        ),
        Message(role=Role.TOOL, content=REPORT, tool_call_id="c1", name="report"),
        Message(role=Role.ASSISTANT, content="It shipped on May 2.", invocation=INV),
    ]


def _turn(n: int) -> Message:
    return Message(role=Role.USER, content=f"Follow-up question {n}?")


def _tool_text(engine_input: list[Message] | object) -> str:
    parts = engine_input.parts  # type: ignore[attr-defined]
    return next(p.content for p in parts if p.role is Role.TOOL)


async def test_a_degraded_message_gets_its_summary_after_the_call(tmp_path: Path) -> None:
    adapter = Adapter()
    engine = ContextEngine(SQLiteStore(tmp_path / "s.db"), config=CONFIG, llm_adapter=adapter)
    first = await engine.prepare_call("s", [*_first_turn(), _turn(1)])
    # the call that degraded the report did not wait for the model: its own shortening
    assert SUMMARY not in _tool_text(first.assembled_input)
    degraded = [d for d in first.report.prune_decisions if d.action == "degraded"]
    assert degraded and all(d.level and d.saved_tokens > 0 for d in degraded)
    await engine.flush()  # the summary asked for meanwhile is stored
    assert len(adapter.requests) == 1
    assert REPORT.split(".")[0] in adapter.requests[0].messages[-1].content

    doc = await engine.get_session("s")
    report_id = next(m.message_id for m in doc.session.messages if m.role is Role.TOOL)
    summaries = [e for e in doc.evidences.values() if e.metadata.get(SUMMARY_OF) == report_id]
    assert len(summaries) == 1 and summaries[0].type is EvidenceType.LLM_OUTPUT
    usage = next(u for u in doc.session.model_usage if u.stage.value == "summarize")
    assert summaries[0].links.model_usage_id == usage.model_usage_id
    assert (usage.prompt_tokens, usage.completion_tokens) == (700, 20)

    second = await engine.prepare_call("s", [_turn(2)])
    assert SUMMARY in _tool_text(second.assembled_input)
    block = next(d for d in second.report.prune_decisions if d.level == "summary")
    assert block.action == "degraded" and block.saved_tokens > 0
    await engine.prepare_call("s", [_turn(3)])
    await engine.flush()
    assert len(adapter.requests) == 1  # computed once
    await engine.close()

    # another engine on the same store uses the stored summary without asking again
    other_adapter = Adapter()
    other = ContextEngine(SQLiteStore(tmp_path / "s.db"), config=CONFIG, llm_adapter=other_adapter)
    third = await other.prepare_call("s", [_turn(4)])
    assert SUMMARY in _tool_text(third.assembled_input)
    await other.flush()
    assert other_adapter.requests == []
    await other.close()


def test_a_blocking_call_asks_on_a_worker_thread(tmp_path: Path) -> None:
    adapter = Adapter()
    engine = ContextEngine(SQLiteStore(tmp_path / "s.db"), config=CONFIG, llm_adapter=adapter)
    engine.sync.prepare_call("s", [*_first_turn(), _turn(1)])
    engine.sync.flush()
    assert len(adapter.requests) == 1 and adapter.threads[0] != threading.get_ident()
    second = engine.sync.prepare_call("s", [_turn(2)])
    assert SUMMARY in _tool_text(second.assembled_input)
    engine.sync.run(engine.close())


async def test_a_failing_adapter_leaves_the_shortened_text(tmp_path: Path) -> None:
    adapter = Adapter(fail=True)
    engine = ContextEngine(SQLiteStore(tmp_path / "s.db"), config=CONFIG, llm_adapter=adapter)
    events: list[Event] = []
    engine.events.on("Degraded", events.append)
    await engine.prepare_call("s", [*_first_turn(), _turn(1)])
    await engine.flush()
    second = await engine.prepare_call("s", [_turn(2)])
    await engine.flush()
    assert SUMMARY not in _tool_text(second.assembled_input)
    assert [e.payload["reason"] for e in events].count("block_summary_failed") == 1
    assert len(adapter.requests) == 1  # not asked again in this process
    doc = await engine.get_session("s")
    assert not [e for e in doc.evidences.values() if e.type is EvidenceType.LLM_OUTPUT]
    await engine.close()


async def test_off_by_default_and_without_an_adapter() -> None:
    adapter = Adapter()
    config = CONFIG.model_copy(update={"summary": SummaryConfig(enabled=False)})
    engine = ContextEngine(MemoryStore(), config=config, llm_adapter=adapter)
    await engine.prepare_call("s", [*_first_turn(), _turn(1)])
    await engine.flush()
    assert adapter.requests == []
    await engine.close()
