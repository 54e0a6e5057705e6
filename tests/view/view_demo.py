"""The stored sessions the viewer's tests look at, built offline through the public engine
API: a multi-agent trip-planning session (authors, parallel tool calls with their results, a
retrieval by a tool, a redacted e-mail address, model usage with latencies, a budget tight
enough that blocks are degraded and dropped, several turns) and a session whose text is
markup (it must show as text)."""

from __future__ import annotations

import json
from datetime import timedelta

from ce.core.config import BudgetConfig, PruneConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.integration import ModelCall, Recorder, RetrievalHit, ToolRun
from ce.core.primitives import SequentialIdGenerator, SteppingClock, parse_iso
from ce.core.schema import (
    Author,
    AuthorKind,
    Message,
    ModelInvocation,
    ModelUsageStage,
    Role,
    ToolCallRequest,
)
from ce.core.state import ModelOutput, TokenUsage
from ce.core.stores import open_store

SESSION = "trip-planner"
XSS_SESSION = "markup-probe"
XSS_TEXT = (
    '<script>document.body.dataset.pwned = "script"</script>'
    '<img src="x" onerror="document.body.dataset.pwned = \'img\'"> is this shown as text?'
)
EMAIL = "ana.lopez@example.com"
CONFIG = RuntimeConfig(
    model_hint="gpt-4o",
    budget=BudgetConfig(max_input_tokens=820, reserved_reply_tokens=200),
    prune=PruneConfig(evidence_share=0.75),
)
MODEL = ModelInvocation(provider="scripted", model="demo-model")
ALICE = Author(kind=AuthorKind.USER, id="alice")
PLANNER = Author(kind=AuthorKind.AGENT, id="planner")
RESEARCHER = Author(kind=AuthorKind.AGENT, id="researcher")
PACKING = "Pack layers, a waterproof jacket and sturdy shoes for northern Europe in autumn. " * 12
HITS = [  # found by the kb_search tool: they reach the model inside its result
    RetrievalHit("Paris has an oceanic climate; autumn days average 15°C.", "kb://paris", 0.82),
    RetrievalHit(
        "Oslo autumns are cool and wet, around 6°C, with frequent rain.", "kb://oslo", 0.77
    ),
]
RETRIEVED = [  # found by the app's retriever before the last question: evidence blocks
    RetrievalHit(
        "Friday forecast: Paris 19°C and sunny; Oslo 5°C with showers.", "kb://friday", 0.9
    ),
    RetrievalHit(
        "Night trains run from Paris to Oslo via Hamburg and Copenhagen.", "kb://rail", 0.64
    ),
    RetrievalHit(PACKING, "kb://packing", 0.41, doc_id="packing-guide"),
]


def _request(call_id: str, name: str, args: dict[str, str]) -> ToolCallRequest:
    return ToolCallRequest(
        tool_call_id=call_id, name=name, raw_arguments=json.dumps(args), arguments=args
    )


async def _tool_round(
    engine: ContextEngine,
    clock: SteppingClock,
    requests: list[ToolCallRequest],
    results: dict[str, tuple[str | None, str | None]],
    hits: list[RetrievalHit] | None = None,
) -> None:
    """The planner asks for ``requests`` in one reply; each runs (``results``: text, error),
    a ``kb_search`` call's hits are stored as retrievals; then the next call is prepared."""
    await engine.commit_assistant_message(
        SESSION,
        ModelOutput(
            text="",
            tool_calls=requests,
            invocation=MODEL,
            usage=TokenUsage(prompt_tokens=610, completion_tokens=42),
            latency_ms=850,
            first_token_latency_ms=310,
            author=PLANNER,
        ),
    )
    recorder = Recorder(engine, SESSION)
    pending = []
    for request in requests:
        text, error = results[request.tool_call_id]
        started = parse_iso(clock.now_iso()).timestamp()
        if request.name == "kb_search" and hits:
            await recorder.record_retrieval(hits, tool_call_id=request.tool_call_id)
        run = ToolRun(
            tool_call_id=request.tool_call_id,
            name=request.name,
            args=request.arguments or {},
            result=text,
            error=error,
            started_at=started,
            ended_at=started + (2.5 if error else 0.120),
        )
        await recorder.record_tool_run(run)
        pending.append(
            Message(
                role=Role.TOOL,
                tool_call_id=request.tool_call_id,
                name=request.name,
                content=text if text is not None else error or "",
            )
        )
    await engine.prepare_call(SESSION, pending)


async def _answer(engine: ContextEngine, call_id: str, text: str, prompt: int) -> None:
    """The researcher's answer, recorded with its usage in one write (as integrations do)."""
    await Recorder(engine, SESSION).record_model_call(
        ModelCall(
            call_id=call_id,
            provider=MODEL.provider,
            model=MODEL.model,
            prompt_tokens=prompt,
            completion_tokens=38,
            latency_ms=1240,
            first_token_latency_ms=420,
            stage=ModelUsageStage.ANSWER,
        ),
        reply=Message(role=Role.ASSISTANT, content=text, author=RESEARCHER, invocation=MODEL),
    )


async def build(url: str) -> None:
    """Store the demo sessions in the store at ``url`` (replacing earlier ones)."""
    clock = SteppingClock("2026-03-02T09:00:00+00:00", timedelta(seconds=1))
    store = open_store(url)
    engine = ContextEngine(
        store=store, config=CONFIG, clock=clock, id_generator=SequentialIdGenerator("id")
    )
    try:
        for session in (SESSION, XSS_SESSION):
            await engine.store.delete_session(session)
        await engine.set_system_instruction(SESSION, "You are a concise travel assistant team.")
        await engine.update_notebook(SESSION, "Alice prefers Celsius and trains over planes.")

        await engine.prepare_turn(
            SESSION,
            Message(
                role=Role.USER,
                content=f"Weather in Paris and Oslo this week, and what to pack? Mail {EMAIL}.",
                author=ALICE,
            ),
        )
        await _tool_round(
            engine,
            clock,
            [
                _request("call-weather-1", "weather", {"city": "Paris"}),
                _request("call-kb-1", "kb_search", {"query": "autumn packing"}),
            ],
            {
                "call-weather-1": (
                    json.dumps({"city": "Paris", "temp_c": 18, "sky": "cloudy"}),
                    None,
                ),
                "call-kb-1": ("3 documents found", None),
            },
            HITS,
        )
        await _answer(
            engine, "answer-1", "Paris 18°C and cloudy; Oslo is cooler. Pack layers.", 780
        )

        await engine.prepare_turn(
            SESSION, Message(role=Role.USER, content="And Oslo right now?", author=ALICE)
        )
        await _tool_round(
            engine,
            clock,
            [
                _request("call-weather-2", "weather", {"city": "Oslo"}),
                _request("call-alerts-2", "alerts", {"city": "Oslo"}),
            ],
            {
                "call-weather-2": (
                    json.dumps(
                        {"city": "Oslo", "temp_c": 4, "sky": "rain", "contact": "met@yr.example"}
                    ),
                    None,
                ),
                "call-alerts-2": (None, "TimeoutError: the alerts service timed out"),
            },
        )
        await _answer(engine, "answer-2", "Oslo: 4°C and rain. The alert service timed out.", 820)

        await Recorder(engine, SESSION).record_retrieval(RETRIEVED)
        await engine.prepare_turn(
            SESSION,
            Message(role=Role.USER, content="Which city should I visit on Friday?", author=ALICE),
        )
        await _answer(engine, "answer-3", "Paris: it is warmer and drier on Friday.", 860)

        await engine.prepare_turn(XSS_SESSION, Message(role=Role.USER, content=XSS_TEXT))
    finally:
        await engine.close()
        await store.close()
