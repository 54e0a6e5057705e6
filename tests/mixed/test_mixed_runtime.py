"""examples/mixed_runtime.py: a LangChain planner and a LlamaIndex executor share one session,
and every model call of either gets its own system prompt plus the other's turns, tool results
and evidence (asserted on the request bodies the scripted server received and on the store)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.schema import EvidenceType
from ce.core.stores import MemoryStore
from ce.core.testing import ScriptedOpenAIServer
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixed_runtime.py"
BUDGET = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mixed_runtime", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body["messages"])


async def test_planner_and_executor_see_each_other(example: ModuleType) -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    with ScriptedOpenAIServer(example.model_script) as server:
        replies = await example.run(engine, server)
        requests = server.requests
    # each model could answer only from what it was given
    assert replies == [
        "Plan: fly to Oslo on Friday; book 2 nights at Hotel Nord in Oslo; "
        "skip the Munch museum on Monday.",
        "Done: the booking is confirmed.",
        "The executor booked it: reference BK-1042.",
    ]
    models = [body["model"] for body in requests]
    assert models == ["gpt-4o", "gpt-4o", "gpt-4o-mini", "gpt-4o-mini", "gpt-4o"]

    estimator = TiktokenEstimator()
    limit = BUDGET.max_input_tokens - BUDGET.reserved_reply_tokens
    for body in requests:
        parts = from_openai_messages(body["messages"])
        assert_tool_pairs_intact(parts)
        assert [p.role.value for p in parts].count("system") == 1
        prompt = (
            example.EXECUTOR_PROMPT if body["model"] == "gpt-4o-mini" else example.PLANNER_PROMPT
        )
        assert body["messages"][0]["role"] == "system"
        assert body["messages"][0]["content"].startswith(prompt)
        assert sum(estimator.estimate_part(p, body["model"]) for p in parts) <= limit

    # the executor (LlamaIndex) sees the planner's (LangChain) turn: its plan, its tool's result
    executor_first = _text(requests[2])
    assert "book 2 nights at Hotel Nord in Oslo" in executor_first
    assert "Hotel Nord is central and quiet" in executor_first
    assert example.PLANNER_PROMPT not in executor_first
    # the planner (LangChain) sees the executor's (LlamaIndex) tool result and reply
    planner_last = requests[4]
    tool_texts = [m["content"] for m in planner_last["messages"] if m["role"] == "tool"]
    assert any("BK-1042" in str(text) for text in tool_texts)
    assert "Done: the booking is confirmed." in _text(planner_last)
    assert example.EXECUTOR_PROMPT not in _text(planner_last)

    doc = await engine.get_session(example.SESSION_ID)
    calls = {c.tool_call_id: c for c in doc.session.tool_state.tool_calls}
    assert sorted((c.tool, c.status.value) for c in calls.values()) == [
        ("book_hotel", "success"),
        ("search_guide", "success"),
    ]
    assert set(calls) == {"call_guide_1", "call_book_1"}
    hits = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert [(e.source.uri, e.links.tool_call_id if e.links else None) for e in hits] == [
        ("guide://oslo", "call_guide_1")
    ]
    # one usage record per model call, from each framework, none counted twice
    assert sorted(u.model for u in doc.session.model_usage) == sorted(models)
    await engine.close()
