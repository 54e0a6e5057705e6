"""A secret in a crew's input (its task), in the arguments of a tool call the model makes and in
a tool's output reaches neither the model nor the store: every request the scripted server
received and every byte of the SQLite files are free of the three canaries, while the
conversation itself is stored. CrewAI's own storage (its task outputs, under its data
directory) is CrewAI's: the engine's redaction does not reach it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from crew_apps import kicked_off_by, two_task_crew
from crewai import Crew
from crewai.tools import tool

import ce.crewai
from ce.core import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.stores import SQLiteStore
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

CANARY = "zed.canary@example.com"
ARG_CANARY = "arg.canary@example.com"
OUT_CANARY = "out.canary@example.com"


@tool("lookup_customer")
def lookup_customer(query: str) -> str:
    """Look a customer up."""
    return f"Customer record for {query}: write to {OUT_CANARY} for the invoice."


def _script(body: dict[str, Any]) -> ScriptedResponse:
    if body["messages"][-1]["role"] == "tool" or not body.get("tools"):
        return ScriptedResponse(text="The customer's invoice is settled.")
    args = json.dumps({"query": f"invoices, cc {ARG_CANARY}"})
    return ScriptedResponse(tool_calls=[("call_lookup", "lookup_customer", args)])


def _crew(server: ScriptedOpenAIServer) -> Crew:
    """A support agent looks the customer up with the tool, a writer replies."""
    crew, _, _ = two_task_crew(
        server,
        tool=lookup_customer,
        question=f"Find the invoices of the customer {CANARY}.",
        reply="Write the customer a one-line reply about the invoices.",
    )
    return crew


@pytest.mark.parametrize("path", ["kickoff", "akickoff"])
async def test_the_canaries_are_in_neither_the_wire_nor_the_sqlite_file(
    path: str, tmp_path: Path
) -> None:
    engine = ContextEngine(
        SQLiteStore(str(tmp_path / "sessions.db")), config=RuntimeConfig(model_hint="gpt-4o")
    )
    with ScriptedOpenAIServer(_script) as server:
        ce.crewai.install(engine, session_id="s-canary")
        await kicked_off_by(_crew(server), path)
        requests = server.requests
    await engine.flush()
    doc = await engine.get_session("s-canary")
    await engine.close()
    assert len(requests) == 3  # the tool call, the support answer, the writer's reply
    assert len(doc.session.tool_state.tool_calls) == 1
    wire = [json.dumps(r) for r in requests]
    assert "Customer record for" in wire[1]  # the tool's output reached the model
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"Customer record for" in raw and b"invoices of the customer" in raw
    for canary in (CANARY, ARG_CANARY, OUT_CANARY):
        assert all(canary not in body for body in wire)
        assert canary.encode() not in raw
