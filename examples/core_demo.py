"""ce.core demo: one agent run recorded through AgentState into the embedded SQLite store.

Runs offline. The "model" is a scripted stream of seed-002 deltas: a reply that makes two
parallel tool calls, then a streamed answer. Every step is committed to the store as one atomic
change set; at the end the session is reloaded, checked to equal what was written, and the
context is rendered for an OpenAI-style and an Anthropic-style API.

    python examples/core_demo.py            # store: $CE_STORE_URL or sqlite:///.ce/sessions.db
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

from ce.core.formats import to_anthropic_messages, to_openai_messages
from ce.core.schema import RunStatus, Task, TaskStatus
from ce.core.state import (
    AgentState,
    DeltaAccumulator,
    DeltaKind,
    MessageDelta,
    ToolResult,
    render_live_context,
)
from ce.core.stores import Store, open_store

STORE_URL = os.environ.get("CE_STORE_URL", "sqlite:///.ce/sessions.db")
SESSION_ID = "demo-weather"


def scripted_stream(
    run_id: str, items: list[tuple[DeltaKind, dict[str, Any]]]
) -> Iterator[MessageDelta]:
    """What a provider client would yield: deltas with strictly increasing ``seq``."""
    for seq, (kind, payload) in enumerate(items):
        yield MessageDelta(run_id=run_id, seq=seq, kind=kind, payload=payload)


def first_reply(run_id: str) -> Iterator[MessageDelta]:
    return scripted_stream(
        run_id,
        [
            (DeltaKind.START, {"provider": "scripted", "model": "demo-model"}),
            (DeltaKind.TEXT, {"text": "Let me check both cities."}),
            (DeltaKind.TOOL_CALL_START, {"tool_call_id": "call-paris", "name": "weather"}),
            (DeltaKind.TOOL_CALL_START, {"tool_call_id": "call-oslo", "name": "weather"}),
            (DeltaKind.TOOL_CALL_ARGS, {"tool_call_id": "call-paris", "args": '{"city": '}),
            (DeltaKind.TOOL_CALL_ARGS, {"tool_call_id": "call-oslo", "args": '{"city": "Oslo"}'}),
            (DeltaKind.TOOL_CALL_ARGS, {"tool_call_id": "call-paris", "args": '"Paris"}'}),
            (DeltaKind.TOOL_CALL_END, {"tool_call_id": "call-paris"}),
            (DeltaKind.TOOL_CALL_END, {"tool_call_id": "call-oslo"}),
            (DeltaKind.USAGE, {"prompt_tokens": 412, "completion_tokens": 38}),
            (DeltaKind.DONE, {"finish_reason": "tool_calls"}),
        ],
    )


def final_reply(run_id: str) -> Iterator[MessageDelta]:
    words = ["Paris ", "is 18°C ", "and cloudy; ", "Oslo ", "is 4°C ", "with rain."]
    return scripted_stream(
        run_id,
        [
            (DeltaKind.START, {"provider": "scripted", "model": "demo-model"}),
            *[(DeltaKind.TEXT, {"text": w}) for w in words],
            (DeltaKind.USAGE, {"prompt_tokens": 530, "completion_tokens": 14}),
            (DeltaKind.DONE, {"finish_reason": "stop"}),
        ],
    )


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    table = {"Paris": {"temp_c": 18, "sky": "cloudy"}, "Oslo": {"temp_c": 4, "sky": "rain"}}
    return json.dumps({"city": arguments["city"], **table[arguments["city"]]})


async def commit(store: Store, state: AgentState, step: str) -> None:
    result = await store.commit(state.session_id, state.take_changes())
    print(f"  committed {step:<28} -> session version {result.version}")


async def main() -> None:
    store = open_store(STORE_URL)
    print(f"store: {STORE_URL}")
    await store.delete_session(SESSION_ID)  # start the demo fresh on every run

    state = AgentState(SESSION_ID)
    state.set_system_instruction("You are a concise weather assistant.")
    state.upsert_tasks([Task(task_id="t1", name="Compare Paris and Oslo weather")])
    state.update_notebook("User prefers Celsius.")
    await commit(store, state, "instruction, task, notebook")

    run = state.start_run()
    state.append_model_input("What's the weather in Paris and in Oslo?")
    state.transition(RunStatus.MODEL_RUNNING)
    await commit(store, state, "user message")

    acc = DeltaAccumulator()
    for delta in first_reply(run.run_id or "run"):
        acc.add(delta)
    reply = state.append_model_output(acc.result())
    state.transition(RunStatus.TOOL_RUNNING)
    await commit(store, state, "assistant tool calls")

    results = [
        ToolResult(
            tool_call_id=call.tool_call_id,
            name=call.name,
            content=run_tool(call.name, call.arguments or {}),
            duration_ms=12,
        )
        for call in reply.tool_calls or []
    ]
    state.append_tool_results(results)
    state.transition(RunStatus.MODEL_RUNNING)
    await commit(store, state, "tool results (parallel)")

    acc = DeltaAccumulator()
    for delta in final_reply(run.run_id or "run"):
        acc.add(delta)
    state.append_model_output(acc.result())
    state.set_task_status("t1", TaskStatus.COMPLETED)
    state.transition(RunStatus.COMPLETED)
    await commit(store, state, "answer")

    stored = await store.get_session(SESSION_ID)
    assert stored is not None
    reloaded = AgentState.from_document(stored)
    assert reloaded == state, "the stored session must rebuild the same state"
    session = stored.session
    print(
        f"\nreloaded {SESSION_ID!r}: {len(session.messages)} messages, "
        f"{len(session.tool_state.tool_calls)} tool calls, {len(session.model_usage)} usage "
        f"records, run {session.run.status.value}; equal to the state that wrote it: yes"
    )

    parts = render_live_context(reloaded)
    print("\nOpenAI-style messages:")
    for message in to_openai_messages(parts):
        print("  " + json.dumps(message, ensure_ascii=False)[:150])
    anthropic = to_anthropic_messages(parts)
    print(f"\nAnthropic-style request: system={anthropic.system!r}")
    for message in anthropic.messages:
        kinds = [block["type"] for block in message["content"]]
        print(f"  {message['role']:<9} {kinds}")
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
