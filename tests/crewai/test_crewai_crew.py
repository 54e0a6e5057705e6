"""A real crew on the scripted server: what every request carried and what the store holds."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from crew_apps import kicked_off, llm, two_task_crew
from crewai import LLM, Agent, Crew, Task
from crewai.events import TaskCompletedEvent, TaskStartedEvent, crewai_event_bus
from crewai.tasks.task_output import TaskOutput

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse, no_blocking
from ce.crewai._patch import Kickoffs
from ce.crewai._record import Recorders
from ce.crewai._scopes import Runs, current_run

MARK = "NOTEBOOK-MARK-7731"


def _script(body: dict[str, Any]) -> ScriptedResponse:
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedResponse(text="Paris is sunny.", prompt_tokens=40, completion_tokens=4)
    if "weather" in json.dumps(body.get("tools", [])):
        args = json.dumps({"city": "Paris"})
        return ScriptedResponse(
            tool_calls=[("call_w", "weather", args)], prompt_tokens=30, completion_tokens=3
        )
    return ScriptedResponse(text="Sunny Paris today.", prompt_tokens=50, completion_tokens=6)


def _check_requests(requests: list[dict[str, Any]]) -> None:
    assert len(requests) == 3
    for request in requests:
        first = request["messages"][0]
        assert first["role"] == "system" and MARK in first["content"]
    assert requests[1]["messages"][-1]["role"] == "tool"
    assert "sunny in Paris" in requests[1]["messages"][-1]["content"]
    assert "Write one line" in json.dumps(requests[2]["messages"])
    # the writer's request carries the researcher's turn before its own task, as the
    # researcher's (a user message naming it: its tool chain as text), never as the writer's
    # own assistant turn; the researcher's answer, which CrewAI quotes as the writer's
    # context, goes once: in that prompt
    texts = [str(m.get("content")) for m in requests[2]["messages"]]
    (turn,) = [i for i, t in enumerate(texts) if t.startswith("[Researcher wrote:]\n")]
    assert requests[2]["messages"][turn]["role"] == "user"
    assert texts[turn].startswith("[Researcher wrote:]\n[called weather(")
    prompt = max(i for i, t in enumerate(texts) if "Write one line" in t)
    assert turn < prompt and "Paris is sunny." in texts[prompt]
    assert json.dumps(requests[2]["messages"]).count("Paris is sunny.") == 1
    assert all(m["role"] != "assistant" for m in requests[2]["messages"])


async def _check_store(engine: ContextEngine, session_id: str) -> None:
    doc = await engine.get_session(session_id)
    assert doc is not None
    tasks = {t.name: t for t in doc.session.task_state.todo_list.tasks}
    assert set(tasks) == {"research", "write"}
    research, write = tasks["research"], tasks["write"]
    assert write.depends_on == [research.task_id]
    assert research.task_id.split(":")[0] == write.task_id.split(":")[0]
    assert research.status.value == write.status.value == "completed"
    evidence = doc.evidences
    (result,) = write.result_evidence_ids
    assert evidence[result].content == "Sunny Paris today."
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool, run.status.value, run.task_id) == ("weather", "success", research.task_id)
    assert run.duration_ms >= 0
    assert evidence[run.result_evidence_ids[0]].content == "sunny in Paris"
    usage = doc.session.model_usage
    by_task = {}
    for u in usage:
        by_task[u.task_id] = by_task.get(u.task_id, 0) + u.prompt_tokens
    assert by_task == {research.task_id: 70, write.task_id: 50}
    assert all(u.provider == "openai" for u in usage)
    # each agent's final answer is its message, authored by its role, stored once
    answers = [
        (m.author.id if m.author else None, m.content)
        for m in doc.session.messages
        if m.role is Role.ASSISTANT and m.content
    ]
    assert answers == [("Researcher", "Paris is sunny."), ("Writer", "Sunny Paris today.")]


async def test_kickoff_gets_the_engine_input_every_call_and_is_recorded(
    engine: ContextEngine,
) -> None:
    """Sync ``kickoff`` (run on a worker thread, as an app would): the engine's input before
    each of the three model calls (the tool round too), tasks with their dependency and
    result, the tool run and usage per task in the store."""
    with ScriptedOpenAIServer(_script) as server:
        crew, _, _ = two_task_crew(server)
        ce.crewai.install(engine, session_id="s-crew")
        await engine.update_notebook("s-crew", MARK)
        output = await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "Sunny Paris today."
    _check_requests(requests)
    await _check_store(engine, "s-crew")


async def test_akickoff_awaits_the_engine_and_never_blocks(engine: ContextEngine) -> None:
    with ScriptedOpenAIServer(_script) as server:
        crew, _, _ = two_task_crew(server)
        ce.crewai.install(engine, session_id="s-async")
        await engine.update_notebook("s-async", MARK)
        with no_blocking(engine) as blocking:
            output = await crew.akickoff()
        crewai_event_bus.flush()
        requests = server.requests
    assert blocking.used == []
    assert output.raw == "Sunny Paris today."
    _check_requests(requests)
    await _check_store(engine, "s-async")


async def test_a_failed_task_is_recorded_failed_with_its_error(engine: ContextEngine) -> None:
    def script(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text="model down", status=400)

    ce.crewai.install(engine, session_id="s-fail")
    with ScriptedOpenAIServer(script) as server:
        crew, _, _ = two_task_crew(server)
        for agent in crew.agents:
            agent.max_retry_limit = 0
        try:
            await asyncio.to_thread(crew.kickoff)
        except Exception as exc:  # CrewAI raises the provider's error
            assert "model down" in str(exc)
        else:
            raise AssertionError("the kickoff should fail")
        crewai_event_bus.flush()
    doc = await engine.get_session("s-fail")
    assert doc is not None
    tasks = {t.name: t for t in doc.session.task_state.todo_list.tasks}
    assert tasks["research"].status.value == "failed" and "model down" in tasks["research"].error
    # the task the failure left unrun is not left open: the kickoff ended without it
    assert tasks["write"].status.value == "cancelled"
    assert tasks["write"].error == "not run: the kickoff failed"


async def test_a_cancelled_akickoff_leaves_no_task_in_progress(engine: ContextEngine) -> None:
    """An ``akickoff`` cancelled while its model call is in flight (``asyncio.wait_for``
    timing out: CrewAI reports no end of its task) has its task cancelled, so the next
    kickoff of the session lists it so, not as a task in progress."""
    release = threading.Event()
    asked: list[str] = []

    def script(body: dict[str, Any]) -> ScriptedResponse:
        asked.append(json.dumps(body["messages"]))
        if len(asked) == 1:
            release.wait(timeout=5)  # the first call hangs until the test lets it go
        return ScriptedResponse(text="Filed.")

    def crew(server: ScriptedOpenAIServer, name: str) -> Crew:
        clerk = Agent(role="Clerk", goal="file", backstory="tidy", llm=llm(server))
        task = Task(name=name, description=f"File {name}.", expected_output="a line", agent=clerk)
        return Crew(agents=[clerk], tasks=[task])

    ce.crewai.install(engine, session_id="s-cancel")
    with ScriptedOpenAIServer(script) as server:
        try:
            await asyncio.wait_for(crew(server, "slow").akickoff(), 0.5)
        except asyncio.TimeoutError:
            pass
        else:
            raise AssertionError("the kickoff should time out")
        release.set()
        output = await crew(server, "next").akickoff()
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "Filed."
    assert len(requests) == 2
    (following_request,) = [r for r in requests if "File next." in json.dumps(r["messages"])]
    doc = await engine.get_session("s-cancel")
    assert doc is not None
    tasks = {t.name: t for t in doc.session.task_state.todo_list.tasks}
    slow, following = tasks["slow"], tasks["next"]
    assert (slow.status.value, slow.error) == ("cancelled", "the kickoff was cancelled")
    assert following.status.value == "completed"
    listed = following_request["messages"][0]["content"]
    assert f"- [ ] slow (`{slow.task_id}`) — cancelled" in listed
    assert f"`{slow.task_id}`) — in progress" not in listed


async def test_what_crewai_reports_after_a_kickoff_closed_its_tasks(
    engine: ContextEngine,
) -> None:
    """CrewAI runs event handlers on a thread pool: a task's start may be handled only after
    its kickoff ended raising and closed its open tasks. A late start does not open a task
    again; an end CrewAI reports late still corrects the close. A failed kickoff fails the
    task it started with its error and cancels the one it never started."""
    plugin = ce.crewai.install(engine, session_id="s-closed")
    runs = Runs(plugin)
    kickoffs, recorders = Kickoffs(plugin, runs, True), Recorders(plugin, runs)
    model = LLM(model="openai/gpt-4o-mini", base_url="http://127.0.0.1:9", api_key="sk-none")
    clerk = Agent(role="Clerk", goal="file", backstory="tidy", llm=model)
    first, second = (
        Task(name=name, description=f"File {name}.", expected_output="a line", agent=clerk)
        for name in ("first", "second")
    )
    crew = Crew(agents=[clerk], tasks=[first, second])
    output = TaskOutput(description="File second.", raw="Filed.", agent="Clerk")

    def kickoff(error: BaseException, started: Task, ended: Task | None) -> str:
        """One kickoff of ``crew`` that raised ``error``: ``started``'s start handled only
        after the kickoff closed its tasks (also before, for a failure), ``ended``'s
        completion after; returns the run id."""
        run = runs.begin(crew, crew.tasks)
        token = current_run.set(run)
        try:
            if isinstance(error, Exception):
                recorders.on_task_started(crew, TaskStartedEvent(context=None, task=started))
            kickoffs._close_open(run, crew, (), {}, error)
            recorders.on_task_started(crew, TaskStartedEvent(context=None, task=started))
            if ended is not None:
                recorders.on_task_completed(crew, TaskCompletedEvent(output=output, task=ended))
        finally:
            current_run.reset(token)
        return run.run_id

    cancelled = kickoff(asyncio.CancelledError(), first, second)
    failed = kickoff(RuntimeError("model down"), first, None)
    await engine.flush("s-closed")
    doc = await engine.get_session("s-closed")
    assert doc is not None
    held = {t.task_id: (t.status.value, t.error) for t in doc.session.task_state.todo_list.tasks}
    assert held == {
        f"{cancelled}:{first.id}": ("cancelled", "the kickoff was cancelled"),
        f"{cancelled}:{second.id}": ("completed", ""),
        f"{failed}:{first.id}": ("failed", "model down"),
        f"{failed}:{second.id}": ("cancelled", "not run: the kickoff failed"),
    }


async def test_an_engine_failure_sends_the_crews_own_messages(
    engine: ContextEngine, monkeypatch: Any
) -> None:
    """Fail-open: ``prepare_call`` raising leaves the request as CrewAI built it, the kickoff
    completes and is still recorded."""

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("engine down")

    monkeypatch.setattr(engine, "prepare_call", broken)
    with ScriptedOpenAIServer(_script) as server:
        crew, _, _ = two_task_crew(server)
        output = await kicked_off(engine, crew, "s-open")
        requests = server.requests
    assert output.raw == "Sunny Paris today."
    assert len(requests) == 3
    assert requests[0]["messages"][0]["content"].startswith("You are Researcher.")
    doc = await engine.get_session("s-open")
    assert doc is not None
    assert len(doc.session.task_state.todo_list.tasks) == 2


async def test_a_crew_kicked_off_again_for_another_user_lists_only_that_users_tasks(
    engine: ContextEngine,
) -> None:
    """One Crew object kicked off for one user, then for another in another session: every
    request lists the crew's tasks as this kickoff's inputs make them, from the first one on
    (CrewAI interpolates the inputs later in the kickoff; until then a task still reads as
    the previous kickoff left it, with the other user's name)."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text="Done for " + body["messages"][-1]["content"][-40:])

    with ScriptedOpenAIServer(script) as server:
        model = llm(server)
        analyst = Agent(role="Analyst", goal="analyse", backstory="careful", llm=model)
        writer = Agent(role="Writer", goal="write", backstory="terse", llm=model)
        analyse = Task(
            description="Analyse the customer {customer}.", expected_output="a line", agent=analyst
        )
        email = Task(
            description="Write to {customer} using the analysis.",
            expected_output="an email",
            agent=writer,
            context=[analyse],
        )
        crew = Crew(agents=[analyst, writer], tasks=[analyse, email])
        ce.crewai.install(engine)
        per_user: dict[str, list[dict[str, Any]]] = {}
        for user in ("alice-4417", "bob-9023"):
            before = len(server.requests)
            with engine.session(f"s-{user}"):
                await asyncio.to_thread(crew.kickoff, inputs={"customer": user})
            crewai_event_bus.flush()
            per_user[user] = server.requests[before:]
    for user, other in (("alice-4417", "bob-9023"), ("bob-9023", "alice-4417")):
        assert len(per_user[user]) == 2
        for request in per_user[user]:
            assert other not in json.dumps(request)
            system = request["messages"][0]["content"]
            assert f"Write to {user} using the analysis." in system
            assert "{customer}" not in system


async def test_the_next_task_gets_an_earlier_answer_once(engine: ContextEngine) -> None:
    """CrewAI hands the writer the researcher's answer as its task's context; the session's
    copy of that answer goes as a pointer to it, so the writer reads the answer once."""
    finding = (
        "FINDING-4471: Paris is sunny today with 24 degrees, a light wind from the west and "
        "no rain expected before the weekend."
    )

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text=finding)
        if "weather" in json.dumps(body.get("tools", [])):
            return ScriptedResponse(tool_calls=[("call_w", "weather", '{"city": "Paris"}')])
        return ScriptedResponse(text="Sunny Paris today.")

    ce.crewai.install(engine, session_id="s-once")
    with ScriptedOpenAIServer(script) as server:
        crew, _, _ = two_task_crew(server)
        await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    writer = requests[-1]["messages"]
    assert "Write one line" in str(writer[-1]["content"])
    assert json.dumps(writer).count(finding) == 1
    assert finding in str(writer[-1]["content"])  # CrewAI's own context, as CrewAI wrote it
    assert "sunny in Paris" in json.dumps(writer)  # the researcher's tool result still goes
    doc = await engine.get_session("s-once")
    assert doc is not None
    assert [m.content for m in doc.session.messages if m.role is Role.ASSISTANT and m.content] == [
        finding,
        "Sunny Paris today.",
    ]


async def test_a_sequential_crew_sends_each_earlier_output_once(engine: ContextEngine) -> None:
    """Three agents in a sequential crew without declared context: CrewAI hands each task
    every earlier output, so the writer's prompt quotes both, and so did the analyst's
    prompt the first: the writer's request holds each output once."""
    outputs = {
        "Researcher": "RESEARCH-1: the Oslo office moved to Bjorvika in March and now seats "
        "two hundred people on four floors.",
        "Analyst": "ANALYSIS-2: the move cut commuting time for most staff by about a quarter "
        "and raised desk use to ninety percent.",
        "Writer": "Short memo.",
    }

    def script(body: dict[str, Any]) -> ScriptedResponse:
        system = body["messages"][0]["content"]
        (role,) = [r for r in outputs if f"You are {r}" in system]
        return ScriptedResponse(text=outputs[role])

    ce.crewai.install(engine, session_id="s-seq")
    with ScriptedOpenAIServer(script) as server:
        agents = [Agent(role=r, goal="g", backstory="b", llm=llm(server)) for r in outputs]
        tasks = [
            Task(description=f"Step {i}: your part.", expected_output="text", agent=a)
            for i, a in enumerate(agents)
        ]
        await asyncio.to_thread(Crew(agents=agents, tasks=tasks).kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    writer = json.dumps(requests[-1]["messages"])
    assert "Step 2: your part." in writer
    for role in ("Researcher", "Analyst"):
        assert writer.count(outputs[role].split(":")[0]) == 1
        assert outputs[role] in str(requests[-1]["messages"][-1]["content"])


async def test_a_kickoff_stores_its_tasks_in_the_commit_of_its_first_model_call(
    engine: ContextEngine,
) -> None:
    """A kickoff queues its crew's tasks, pending, with what its events queue: a one-task
    kickoff makes one commit, at its model call, whose request already lists the task (the
    records of that call and of the task's end go with the next kickoff's commit, or a
    flush)."""
    commits: list[Any] = []
    engine.events.on("Persisted", commits.append)
    ce.crewai.install(engine, session_id="s-one-commit")
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="Filed.")) as server:
        clerk = Agent(role="Clerk", goal="file", backstory="tidy", llm=llm(server))
        task = Task(description="File report R-5521.", expected_output="a line", agent=clerk)
        crew = Crew(agents=[clerk], tasks=[task])
        per_kickoff = []
        for _ in range(2):
            before = len(commits)
            await asyncio.to_thread(crew.kickoff)
            crewai_event_bus.flush()
            per_kickoff.append(len(commits) - before)
        requests = server.requests
    assert per_kickoff == [1, 1]
    assert len(requests) == 2
    for request in requests:
        assert "File report R-5521." in request["messages"][0]["content"]
    await engine.flush("s-one-commit")
    doc = await engine.get_session("s-one-commit")
    assert doc is not None
    tasks = doc.session.task_state.todo_list.tasks
    assert [(t.name, t.status.value) for t in tasks] == [("File report R-5521.", "completed")] * 2
    assert [u.task_id for u in doc.session.model_usage] == [t.task_id for t in tasks]


async def test_a_kickoff_that_ends_before_any_model_call_still_stores_its_tasks(
    engine: ContextEngine,
) -> None:
    """A kickoff that fails before its first model call (here a before-kickoff callback
    raises) runs no engine call: the tasks it queued are stored as it ends, cancelled (it
    ended without running them), so the store holds them (read from the store itself, not
    through the engine, which would write them first) and the session's queue holds nothing
    of it."""

    def refuse(inputs: Any) -> Any:
        raise RuntimeError("refused before the crew ran")

    ce.crewai.install(engine, session_id="s-refused")
    with ScriptedOpenAIServer(lambda body: ScriptedResponse(text="Filed.")) as server:
        clerk = Agent(role="Clerk", goal="file", backstory="tidy", llm=llm(server))
        task = Task(description="File report R-7310.", expected_output="a line", agent=clerk)
        crew = Crew(agents=[clerk], tasks=[task], before_kickoff_callbacks=[refuse])
        try:
            await asyncio.to_thread(crew.kickoff)
        except RuntimeError as exc:
            assert "refused" in str(exc)
        else:
            raise AssertionError("the kickoff did not raise")
        assert server.requests == []
    doc = await engine.store.get_session("s-refused")
    assert doc is not None
    tasks = doc.session.task_state.todo_list.tasks
    assert [(t.name, t.status.value, t.error) for t in tasks] == [
        ("File report R-7310.", "cancelled", "not run: the kickoff failed")
    ]
