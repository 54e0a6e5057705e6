"""examples/autogen_team.py: a researcher and a writer in a RoundRobinGroupChat share the
session ``oslo-brief``; each model call starts with its own agent's system message, the
writer sees the researcher's turn as a user message named after it (never the researcher's
tool call), the memory's hit is sent once and stored once, within the budget; and the script
runs as the docs say (offline, in a scratch directory)."""

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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "autogen_team.py"
BUDGET = BudgetConfig(max_input_tokens=2000, reserved_reply_tokens=200)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("autogen_team", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_team_shares_the_session_each_agent_with_its_own_view(
    example: ModuleType,
) -> None:
    engine = ContextEngine(MemoryStore(), config=RuntimeConfig(model_hint="gpt-4o", budget=BUDGET))
    with ScriptedOpenAIServer(example.model_script) as server:
        messages = await example.run(engine, server)
        requests = server.requests
    assert messages == [
        example.TASK,
        "Facts: 9 C; light rain; window seat.",
        "Oslo this weekend: 9 C; light rain; window seat. Pack a rain jacket.",
    ]
    speakers = [example._speaker(body) for body in requests]
    assert speakers == ["researcher", "researcher", "writer"]
    estimator = TiktokenEstimator()
    for body, speaker in zip(requests, speakers, strict=True):
        first = body["messages"][0]["content"]
        own = example.RESEARCHER_PROMPT if speaker == "researcher" else example.WRITER_PROMPT
        other = example.WRITER_PROMPT if speaker == "researcher" else example.RESEARCHER_PROMPT
        assert first.startswith(own) and other not in json.dumps(body)
        assert "travelling light" in first  # the session's notebook
        assert json.dumps(body).count("always books a window seat") == 1  # sent once
        parts = from_openai_messages(body["messages"])
        assert_tool_pairs_intact(parts)
        used = sum(estimator.estimate_part(p, "gpt-4o") for p in parts)
        used += estimator.estimate_tools(body.get("tools") or [], "gpt-4o")
        assert used <= BUDGET.context_tokens
    assert "The user always books a window seat." in requests[0]["messages"][0]["content"]
    writer = requests[2]["messages"]
    assert [(m["role"], m.get("name")) for m in writer[1:]] == [
        ("user", "user"),
        ("user", "researcher"),
    ]
    doc = await engine.get_session(example.SESSION_ID)
    stored = doc.session.messages
    assert [m.content for m in stored if m.role is Role.USER] == [example.TASK]
    authors = [(m.author.id if m.author else None) for m in stored if m.role is Role.ASSISTANT]
    assert authors == ["researcher", "researcher", "writer"]  # tool call, facts, paragraph
    (hit,) = [e for e in doc.evidences.values() if e.type is EvidenceType.RAG_DOC]
    assert (hit.source.uri, hit.confidence) == ("crm://prefs/42", 0.9)
    assert [r.tool_call_id for r in doc.session.tool_state.tool_calls] == ["call_weather_1"]
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
    assert "writer model call: 3 messages [system user(user) user(researcher)]" in done.stdout
    assert "session 'oslo-brief': 7 messages by researcher, user, writer" in done.stdout
    assert (tmp_path / ".ce" / "sessions.db").is_file()
