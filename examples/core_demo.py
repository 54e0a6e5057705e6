"""ce.core demo: an agent run through the ContextEngine on the embedded SQLite store.

Runs offline. The "model" is a scripted stream of streaming deltas. Each turn, the engine
records what happened and assembles the next model input within a small token budget; the demo
prints what the model would receive and the report of what was kept, degraded or dropped.

    python examples/core_demo.py            # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
    ce report demo-weather                  # the same report from the store (ce-core[cli])
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ce.core.config import BudgetConfig, PruneConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import to_anthropic_messages, to_openai_messages
from ce.core.schema import (
    EvidenceSource,
    EvidenceType,
    Message,
    PrepareResult,
    Role,
    SourceKind,
    Task,
    ToolCall,
    ToolProvider,
)
from ce.core.state import DeltaAccumulator, DeltaKind, MessageDelta, ModelOutput
from ce.core.stores import default_store_url

SESSION_ID = "demo-weather"
CONFIG = RuntimeConfig(
    model_hint="gpt-4o",
    budget=BudgetConfig(max_input_tokens=700, reserved_reply_tokens=200),
    prune=PruneConfig(evidence_share=0.75),  # evidence may use 75% of what must-keep leaves
)
DOCS = [
    ("kb://climate/paris", "Paris has an oceanic climate; autumn days average 15°C.", 0.82),
    ("kb://climate/oslo", "Oslo autumns are cool and wet, around 6°C, with frequent rain.", 0.77),
    ("kb://travel/packing", "Pack layers and a waterproof jacket for northern Europe. " * 30, 0.4),
]
WEATHER = {"Paris": {"temp_c": 18, "sky": "cloudy"}, "Oslo": {"temp_c": 4, "sky": "rain"}}


def stream(items: list[tuple[DeltaKind, dict[str, Any]]]) -> ModelOutput:
    """What a provider client yields, aggregated: strictly increasing ``seq``, one ``done``."""
    acc = DeltaAccumulator()
    start = (DeltaKind.START, {"provider": "scripted", "model": "demo-model"})
    for seq, (kind, payload) in enumerate([start, *items]):
        acc.add(MessageDelta(run_id="demo", seq=seq, kind=kind, payload=payload))
    return acc.result()


def tool_reply(cities: list[str]) -> ModelOutput:
    items: list[tuple[DeltaKind, dict[str, Any]]] = [(DeltaKind.TEXT, {"text": "Checking."})]
    for city in cities:
        call_id = f"call-{city.lower()}-{len(cities)}"
        items += [
            (DeltaKind.TOOL_CALL_START, {"tool_call_id": call_id, "name": "weather"}),
            (
                DeltaKind.TOOL_CALL_ARGS,
                {"tool_call_id": call_id, "args": json.dumps({"city": city})},
            ),
            (DeltaKind.TOOL_CALL_END, {"tool_call_id": call_id}),
        ]
    items += [
        (DeltaKind.USAGE, {"prompt_tokens": 400, "completion_tokens": 30}),
        (DeltaKind.DONE, {"finish_reason": "tool_calls"}),
    ]
    return stream(items)


def answer(text: str) -> ModelOutput:
    return stream(
        [
            *[(DeltaKind.TEXT, {"text": word + " "}) for word in text.split()],
            (DeltaKind.DONE, {"finish_reason": "stop"}),
        ]
    )


def show(label: str, result: PrepareResult) -> None:
    report = result.report
    print(f"\n== {label}: {report.token_used}/{report.token_budget} tokens, turn {report.turn_id}")
    for message in to_openai_messages(result.assembled_input.parts):
        content = (message.get("content") or "").replace("\n", " ")
        calls = [c["function"]["name"] for c in message.get("tool_calls", [])]
        print(f"   {message['role']:<9} {content[:90]!r}" + (f" calls {calls}" if calls else ""))
    print("   report:")
    for d in report.prune_decisions:
        span = f" x{d.block_count}" if d.block_count > 1 else ""
        level = f" @{d.level}" if d.level else ""
        print(f"     {d.action:<8} {d.block_id[:38]:<38}{span:<5} {d.token_estimate:>5} tok{level}")
    for note in report.degradations:
        print(f"   degraded: {note}")


async def tool_loop(engine: ContextEngine, question: str, cities: list[str], label: str) -> None:
    """One user question: model -> parallel tool calls -> results -> model -> answer."""
    show(f"{label}, first call", await engine.prepare_turn(SESSION_ID, question))
    reply = tool_reply(cities)
    await engine.commit_assistant_message(SESSION_ID, reply)
    pending = []
    for request in reply.tool_calls:
        city = (request.arguments or {})["city"]
        await engine.record_tool_call(
            SESSION_ID,
            ToolCall(
                tool_call_id=request.tool_call_id,
                tool="weather",
                provider=ToolProvider(kind="builtin", name="demo"),
                args_digest=request.arguments or {},
                duration_ms=12,
            ),
        )
        pending.append(
            Message(
                role=Role.TOOL,
                tool_call_id=request.tool_call_id,
                name="weather",
                content=json.dumps({"city": city, **WEATHER[city]}),
            )
        )
    # before the model call that follows the tool results (no new user message here)
    show(f"{label}, after tools", await engine.prepare_call(SESSION_ID, pending))
    summary = ", ".join(f"{c} {WEATHER[c]['temp_c']}°C {WEATHER[c]['sky']}" for c in cities)
    await engine.commit_assistant_message(SESSION_ID, answer(f"Right now: {summary}."))


async def main() -> None:
    url = default_store_url()
    engine = ContextEngine(config=CONFIG)
    print(f"store: {url}")
    await engine.store.delete_session(SESSION_ID)  # start the demo fresh on every run

    await engine.set_system_instruction(SESSION_ID, "You are a concise travel weather assistant.")
    await engine.update_notebook(SESSION_ID, "User prefers Celsius. Contact: ana@example.com")
    await engine.upsert_tasks(SESSION_ID, [Task(task_id="t1", name="Compare Paris and Oslo")])
    for uri, text, score in DOCS:
        await engine.ingest_evidence(
            SESSION_ID,
            text,
            EvidenceSource(kind=SourceKind.RAG, name="kb", uri=uri),
            EvidenceType.RAG_DOC,
            metadata={"score": score},
        )

    await tool_loop(engine, "What's the weather in Paris and Oslo?", ["Paris", "Oslo"], "turn 1")
    await tool_loop(engine, "And Paris again, please?", ["Paris"], "turn 2")
    last = await engine.prepare_turn(SESSION_ID, "Which one should I visit this week?")
    show("turn 3", last)

    doc = await engine.get_session(SESSION_ID)
    turns = await engine.list_turns(SESSION_ID)
    print(
        f"\nstored {SESSION_ID!r} in {url}: {len(doc.session.messages)} messages, "
        f"{len(doc.session.tool_state.tool_calls)} tool calls, {len(doc.evidences)} evidences, "
        f"{len(doc.session.model_usage)} usage records, {len(turns)} turn reports"
    )
    anthropic = to_anthropic_messages(last.assembled_input.parts)
    print("as an Anthropic request:", [m["role"] for m in anthropic.messages])
    print(f"inspect it: ce report {SESSION_ID}   |   ce show {SESSION_ID}")
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
