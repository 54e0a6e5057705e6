"""Tool runs: a tool that raises is recorded as an error (native tool calling and the text
format), and each native tool call keeps its own id, arguments and result, also when CrewAI
runs a reply's calls in parallel and they finish out of order."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from crew_apps import llm
from crewai import Agent, Crew, Task
from crewai.events import crewai_event_bus
from crewai.llms.providers.openai.completion import OpenAICompletion
from crewai.tools import tool

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.integration import Scope
from ce.core.schema import SessionDocument, ToolCall
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse
from ce.crewai import CrewAIPlugin
from ce.crewai._record import Recorders
from ce.crewai._scopes import Run, Runs, Target

FENCE = re.compile(r'<evidence id="([^"]+)" tool="(\w+)" status="(\w+)">')


def _fences(request: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Tool call id -> (evidence id, status) of each fenced tool result of a request."""
    fences = {}
    for message in request["messages"]:
        if message["role"] == "tool":
            found = FENCE.search(message["content"])
            assert found is not None, message["content"]
            fences[message["tool_call_id"]] = (found.group(1), found.group(3))
    return fences


def _result(doc: SessionDocument, run: ToolCall) -> str:
    (evidence,) = run.result_evidence_ids
    return doc.evidences[evidence].content


async def _kickoff(engine: ContextEngine, session_id: str, agent: Agent, text: str) -> None:
    task = Task(name="work", description=text, expected_output="x", agent=agent)
    ce.crewai.install(engine, session_id=session_id)
    await asyncio.to_thread(Crew(agents=[agent], tasks=[task]).kickoff)
    crewai_event_bus.flush()


async def _forecast(
    engine: ContextEngine, session_id: str, script: Any, weather: Any, text: str
) -> tuple[list[dict[str, Any]], SessionDocument]:
    """A crew of one forecaster agent with the ``weather`` tool on the scripted server,
    kicked off once: the requests the model got and the session stored."""
    with ScriptedOpenAIServer(script) as server:
        agent = Agent(role="Forecaster", goal="g", backstory="b", llm=llm(server), tools=[weather])
        await _kickoff(engine, session_id, agent, text)
        requests = server.requests
    doc = await engine.get_session(session_id)
    assert doc is not None
    return requests, doc


async def test_a_raising_tool_is_an_error_and_the_next_call_keeps_its_own_id(
    engine: ContextEngine,
) -> None:
    """CrewAI reports a raising tool with ``ToolUsageErrorEvent`` (no finished event): its
    run is recorded with status error, the error as its result, its task and duration, and
    the model is told so; the tool's next call is recorded under its own id."""
    calls: list[str] = []

    @tool("flaky")
    def flaky(q: str) -> str:
        """A tool that fails on its first call."""
        calls.append(q)
        if len(calls) == 1:
            time.sleep(0.05)
            raise ValueError(f"backend exploded for {q}")
        return f"ok for {q}"

    def script(body: dict[str, Any]) -> ScriptedResponse:
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if done == 0:
            return ScriptedResponse(tool_calls=[("call_A", "flaky", json.dumps({"q": "first"}))])
        if done == 1:
            return ScriptedResponse(tool_calls=[("call_B", "flaky", json.dumps({"q": "second"}))])
        return ScriptedResponse(text="done.")

    with ScriptedOpenAIServer(script) as server:
        agent = Agent(role="Lead", goal="g", backstory="b", llm=llm(server), tools=[flaky])
        await _kickoff(engine, "s-raise", agent, "Use flaky twice.")
        requests = server.requests
    assert calls == ["first", "second"] and len(requests) == 3
    doc = await engine.get_session("s-raise")
    assert doc is not None
    (task,) = doc.session.task_state.todo_list.tasks
    runs = {r.tool_call_id: r for r in doc.session.tool_state.tool_calls}
    assert set(runs) == {"call_A", "call_B"}
    failed, fine = runs["call_A"], runs["call_B"]
    assert (failed.status.value, failed.task_id, failed.args_digest) == (
        "error",
        task.task_id,
        {"q": "first"},
    )
    assert failed.duration_ms >= 50
    assert _result(doc, failed) == "ValueError: backend exploded for first"
    assert (fine.status.value, fine.task_id, fine.args_digest) == (
        "success",
        task.task_id,
        {"q": "second"},
    )
    assert _result(doc, fine) == "ok for second"
    fences = _fences(requests[2])
    assert fences["call_A"] == (failed.result_evidence_ids[0], "error")
    assert fences["call_B"] == (fine.result_evidence_ids[0], "success")


async def test_a_raising_tool_in_the_text_format_is_recorded_as_errors(
    engine: ContextEngine,
) -> None:
    """The Thought/Action loop retries a raising tool (each attempt its own run), then hands
    the error to the model: each attempt is an error run of the task."""

    class TextOnly(OpenAICompletion):
        def supports_function_calling(self) -> bool:
            return False

    @tool("broken")
    def broken(q: str) -> str:
        """A tool that always fails."""
        raise ValueError(f"backend exploded for {q}")

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if "backend exploded" in json.dumps(body["messages"]):
            return ScriptedResponse(text="Thought: give up\nFinal Answer: no data.")
        return ScriptedResponse(
            text='Thought: look it up\nAction: broken\nAction Input: {"q": "first"}'
        )

    with ScriptedOpenAIServer(script) as server:
        model = TextOnly(model="gpt-4o-mini", base_url=server.base_url, api_key="sk-scripted")
        agent = Agent(role="Lead", goal="g", backstory="b", llm=model, tools=[broken])
        await _kickoff(engine, "s-raise-text", agent, "Use broken.")
    doc = await engine.get_session("s-raise-text")
    assert doc is not None
    (task,) = doc.session.task_state.todo_list.tasks
    runs = doc.session.tool_state.tool_calls
    assert runs and len({r.tool_call_id for r in runs}) == len(runs)
    for run in runs:
        assert (run.tool, run.status.value, run.task_id) == ("broken", "error", task.task_id)
        assert _result(doc, run) == "ValueError: backend exploded for first"


async def test_parallel_calls_of_one_tool_keep_their_own_ids_and_results(
    engine: ContextEngine,
) -> None:
    """One reply asks for the same tool twice; CrewAI runs both at once and the first one
    finishes last: each call id keeps its own arguments and result, and each tool result the
    model gets back cites its own evidence."""
    rome_done = threading.Event()
    finished: list[str] = []

    @tool("weather")
    def weather(city: str) -> str:
        """Get the weather of a city."""
        if city == "Oslo":
            assert rome_done.wait(timeout=10)
        finished.append(city)
        if city == "Rome":
            rome_done.set()
        return f"weather of {city}"

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="Both looked up.")
        return ScriptedResponse(
            tool_calls=[
                ("call_OSLO", "weather", json.dumps({"city": "Oslo"})),
                ("call_ROME", "weather", '{ "city" :"Rome" }'),
            ]
        )

    with ScriptedOpenAIServer(script) as server:
        agent = Agent(role="Forecaster", goal="g", backstory="b", llm=llm(server), tools=[weather])
        await _kickoff(engine, "s-parallel", agent, "Weather in Oslo and Rome?")
        requests = server.requests
    assert finished == ["Rome", "Oslo"]
    doc = await engine.get_session("s-parallel")
    assert doc is not None
    runs = {r.tool_call_id: r for r in doc.session.tool_state.tool_calls}
    assert set(runs) == {"call_OSLO", "call_ROME"}
    fences = _fences(requests[-1])
    for call_id, city in [("call_OSLO", "Oslo"), ("call_ROME", "Rome")]:
        run = runs[call_id]
        assert run.args_digest == {"city": city}
        assert _result(doc, run) == f"weather of {city}"
        assert fences[call_id] == (run.result_evidence_ids[0], "success")


async def test_a_model_naming_every_call_call_0_gets_each_result_under_its_own_id(
    engine: ContextEngine,
) -> None:
    """A model (a local server, say) that names its tool call ``call_0`` in every round:
    CrewAI reports the second run before the reply that asked for it reaches the engine; the
    run and its result still go to the id that call is stored under (``call_0~2``)."""

    @tool("weather")
    def weather(city: str) -> str:
        """Get the weather of a city."""
        return f"weather of {city}"

    def script(body: dict[str, Any]) -> ScriptedResponse:
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if done < 2:
            city = ("Paris", "Rome")[done]
            return ScriptedResponse(tool_calls=[("call_0", "weather", json.dumps({"city": city}))])
        return ScriptedResponse(text="Both sunny.")

    requests, doc = await _forecast(
        engine, "s-reused", script, weather, "Weather in Paris, then Rome?"
    )
    runs = {r.tool_call_id: r for r in doc.session.tool_state.tool_calls}
    assert set(runs) == {"call_0", "call_0~2"}
    fences = _fences(requests[-1])
    for call_id, city in [("call_0", "Paris"), ("call_0~2", "Rome")]:
        run = runs[call_id]
        assert run.args_digest == {"city": city}
        assert _result(doc, run) == f"weather of {city}"
        assert fences[call_id] == (run.result_evidence_ids[0], "success")


def test_a_tool_event_takes_the_call_id_asked_with_its_arguments() -> None:
    """The id a tool run is recorded under: the call asked for with the same arguments (in
    any JSON spelling), the earliest of equal ones, else the earliest; none once its run
    ended."""
    runs = Runs(CrewAIPlugin())
    run = Run("r1", Scope("s", "explicit"))
    target = Target(run, "s")
    for call_id, args in [
        ("c1", '{"city": "Oslo", "days": 2}'),
        ("c2", '{"city": "Rome"}'),
        ("c3", {"city": "Rome"}),
        ("c4", "{not json"),
    ]:
        runs.note_call(target, "weather", call_id, args)
    assert runs.take_call_id(target, "weather", {"city": "Rome"}) == "c2"
    assert runs.take_call_id(target, "weather", {"days": 2, "city": "Oslo"}) == "c1"
    assert runs.take_call_id(target, "other", {"city": "Rome"}) is None
    assert runs.take_call_id(target, "weather", "{not json") == "c3"
    runs.end(run)
    assert runs.take_call_id(target, "weather", {}) is None


def test_a_tool_error_handled_before_its_start_is_recorded_with_its_duration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CrewAI runs event handlers on a thread pool: a raised tool's error event may be
    handled before its start event. It is recorded once the start is handled, with the run's
    duration; a finished run's late start is forgotten."""
    recorders = Recorders(CrewAIPlugin(), Runs(CrewAIPlugin()))
    recorded: list[tuple[float, float, str | None]] = []
    monkeypatch.setattr(
        recorders,
        "_record_tool",
        lambda event, *, result, error, started_at, ended_at: recorded.append(
            (started_at, ended_at, error)
        ),
    )
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    end = start + timedelta(milliseconds=80)
    error = SimpleNamespace(started_event_id="e1", timestamp=end, error="boom")
    recorders.on_tool_error(None, error)
    assert recorded == []
    recorders.on_tool_started(None, SimpleNamespace(event_id="e1", timestamp=start))
    assert recorded == [(start.timestamp(), end.timestamp(), "boom")]
    finished = SimpleNamespace(
        started_event_id="e2", failure=None, output="ok", started_at=start, finished_at=end
    )
    recorders.on_tool_finished(None, finished)
    recorders.on_tool_started(None, SimpleNamespace(event_id="e2", timestamp=start))
    assert recorders._tools_started == {} and recorders._tools_ended == set()


async def test_a_tool_run_reported_late_is_recorded_before_the_next_model_call(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CrewAI runs event handlers on a thread pool: on a busy machine the handler of a
    tool's finished event may run after the agent's next model call has begun. That call
    waits for the handlers of the events emitted before it, so the run is recorded, with its
    result, before the model gets the tool's result, which cites its evidence. Here the
    handler waits for the next request (at most a second): the call must not come first."""
    next_request = threading.Event()
    on_tool_finished = Recorders.on_tool_finished

    def late(self: Recorders, source: Any, event: Any) -> None:
        next_request.wait(timeout=1.0)
        on_tool_finished(self, source, event)

    monkeypatch.setattr(Recorders, "on_tool_finished", late)

    @tool("weather")
    def weather(city: str) -> str:
        """Get the weather of a city."""
        return f"weather of {city}"

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            next_request.set()
            return ScriptedResponse(text="Sunny.")
        return ScriptedResponse(tool_calls=[("call_W", "weather", json.dumps({"city": "Oslo"}))])

    requests, doc = await _forecast(engine, "s-late", script, weather, "Weather in Oslo?")
    (run,) = doc.session.tool_state.tool_calls
    assert run.tool_call_id == "call_W" and run.task_id is not None
    assert _result(doc, run) == "weather of Oslo"
    assert _fences(requests[-1]) == {"call_W": (run.result_evidence_ids[0], "success")}


@pytest.mark.parametrize("path", ["call", "acall"])
async def test_a_reply_reported_late_is_stored_once_before_the_next_call(
    engine: ContextEngine, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A chat loop on ``LLM.call`` / ``acall`` that passes its history back each turn: the
    handler that records a call's reply runs on CrewAI's thread pool, here only once the
    next request arrives (at most a second). The next call waits for it, so the reply is
    stored once, before that call's question, and the request carries it once."""
    next_request = threading.Event()
    on_llm_completed = Recorders.on_llm_completed

    def late(self: Recorders, source: Any, event: Any) -> None:
        next_request.wait(timeout=1.0)
        on_llm_completed(self, source, event)

    monkeypatch.setattr(Recorders, "on_llm_completed", late)

    def script(body: dict[str, Any]) -> ScriptedResponse:
        asked = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if len(asked) > 1:
            next_request.set()
        return ScriptedResponse(text=f"Answer to {asked[-1]}")

    ce.crewai.install(engine)
    with ScriptedOpenAIServer(script) as server:
        model = llm(server)
        history: list[dict[str, str]] = [{"role": "system", "content": "You help."}]
        for question in ("Q0", "Q1"):
            history.append({"role": "user", "content": question})
            with engine.session("u-late"):
                if path == "call":
                    reply = await asyncio.to_thread(model.call, list(history))
                else:
                    reply = await model.acall(list(history))
            history.append({"role": "assistant", "content": str(reply)})
            next_request.clear()
        crewai_event_bus.flush()
        requests = server.requests
    last = [(m["role"], m["content"]) for m in requests[-1]["messages"][1:]]
    assert last == [("user", "Q0"), ("assistant", "Answer to Q0"), ("user", "Q1")]
    await engine.flush()
    doc = await engine.get_session("u-late")
    held = [m.content for m in doc.session.messages if m.role.value != "system"]
    assert held == ["Q0", "Answer to Q0", "Q1", "Answer to Q1"]
