"""examples/haystack_rag_agent.py: a retrieval Pipeline feeding an Agent in the session
``oslo-trip``; every model call of the Agent's tool loop starts with its system prompt and the
session's notebook, the retrieved guide reaches the model once (fenced with its evidence id,
the prompt's inline copy replaced) and is stored once as ``rag_doc`` evidence, the second
question sees the first turn, within the budget; and the script runs as the docs say
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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "haystack_rag_agent.py"
BUDGET = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("haystack_rag_agent", EXAMPLE)
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
    assert len(requests) == 3
    estimator = TiktokenEstimator()
    oslo = example.GUIDES[0][1]
    for body in requests:
        first = body["messages"][0]["content"]
        assert first.startswith(example.SYSTEM_PROMPT) and "travelling light" in first
        assert json.dumps(body).count(oslo) == 1  # once, in its evidence block
        assert oslo in first and oslo not in json.dumps(body["messages"][1:])
        parts = from_openai_messages(body["messages"])
        assert_tool_pairs_intact(parts)
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        used += estimator.estimate_tools(body.get("tools") or [], "gpt-4o")
        assert used <= BUDGET.context_tokens
    assert example.QUESTIONS[0] in json.dumps(requests[2])  # the earlier turn
    doc = await engine.get_session(example.SESSION_ID)
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert [u.rsplit("Question: ", 1)[-1] for u in users] == list(example.QUESTIONS)
    hits = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert [(h.source.uri, h.content) for h in hits] == [example.GUIDES[0]]
    assert all(f"evidence {hits[0].evidence_id}]" in u for u in users)
    (call,) = doc.session.tool_state.tool_calls
    assert (call.tool_call_id, call.tool, call.status.value) == (
        "call_forecast",
        "forecast",
        "success",
    )
    authors = {m.author.id for m in doc.session.messages if m.author and m.role is Role.ASSISTANT}
    assert authors == {"agent"}
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
    assert "model call: 6 messages [system user assistant tool assistant user]" in done.stdout
    assert "session 'oslo-trip': 7 messages, 1 tool call(s)" in done.stdout
    assert (tmp_path / ".ce" / "sessions.db").is_file()
