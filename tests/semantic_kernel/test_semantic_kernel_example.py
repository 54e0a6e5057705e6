"""examples/semantic_kernel_agent.py: a ChatCompletionAgent on the thread ``oslo-trip``; every
request of its function-calling loop starts with the agent's instructions and the session's
notebook, the guide's search hit is sent once and stored once as ``rag_doc`` evidence, the
second question sees the first turn, within the budget; and the script runs as the docs say
(offline, in a scratch directory)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ce.core.config import BudgetConfig, RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.formats import from_openai_messages
from ce.core.schema import EvidenceType, Role
from ce.core.stores import MemoryStore
from ce.core.testing import ScriptedOpenAIServer
from ce.core.testing.assertions import assert_tool_pairs_intact
from ce.core.tokens import TiktokenEstimator

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "semantic_kernel_agent.py"
BUDGET = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("semantic_kernel_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_every_request_gets_the_sessions_input(example: ModuleType) -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    with ScriptedOpenAIServer(example.model_script) as server:
        answers = await example.run(engine, server)
        requests = server.requests
    assert answers == [
        "9 C with light rain on Saturday, dry on Sunday.",
        "Pack a rain jacket and a tram card.",
    ]
    assert len(requests) == 4
    estimator = TiktokenEstimator()
    for body in requests:
        first = body["messages"][0]["content"]
        assert first.startswith(example.INSTRUCTIONS) and "travelling light" in first
        parts = from_openai_messages(body["messages"])
        assert_tool_pairs_intact(parts)
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        used += estimator.estimate_tools(body.get("tools") or [], "gpt-4o")
        assert used <= BUDGET.context_tokens
    assert example.QUESTIONS[0] in json.dumps(requests[2])  # the earlier turn
    assert json.dumps(requests[3]).count(example.GUIDE) == 1  # sent once
    doc = await engine.get_session(example.SESSION_ID)
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == list(
        example.QUESTIONS
    )
    (hit,) = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert (hit.source.uri, hit.confidence, hit.content) == (
        "kb://guides/oslo",
        0.87,
        example.GUIDE,
    )
    calls = doc.session.tool_state.tool_calls
    assert [(c.tool_call_id, c.tool) for c in calls] == [
        ("call_forecast", "forecast"),
        ("call_guides", "search_guides"),
    ]
    authors = {m.author.id for m in doc.session.messages if m.author and m.role is Role.ASSISTANT}
    assert authors == {"travel_agent"}
    await engine.close()


def test_the_script_runs_offline(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("CE_STORE_URL", None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "agent: Pack a rain jacket and a tram card." in done.stdout
    assert "model call: 8 messages [system user assistant tool assistant user assistant tool]" in (
        done.stdout
    )
    assert "session 'oslo-trip': 9 messages, 2 function call(s)" in done.stdout
    assert (tmp_path / ".ce" / "sessions.db").is_file()
