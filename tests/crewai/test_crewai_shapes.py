"""The app shapes of CrewAI's docs beyond a sequential crew: an agent kicked off outside a
crew, a direct ``LLM.call``, a hierarchical crew (its manager delegating to a coworker), a
Flow with two crews, a streaming crew, and concurrent kickoffs for two users; what each
request carried and where each record went."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from crew_apps import answers, llm, request_text, weather
from crewai import Agent, Crew, Process, Task
from crewai.events import crewai_event_bus
from crewai.flow.flow import Flow, listen, start

import ce.crewai
from ce.core.engine import ContextEngine
from ce.core.schema import Role
from ce.core.testing import ScriptedOpenAIServer, ScriptedResponse

MARK = "NOTEBOOK-MARK-8812"


def _one_task_crew(server: ScriptedOpenAIServer, role: str, question: str) -> Crew:
    agent = Agent(role=role, goal="answer", backstory="brief", llm=llm(server))
    task = Task(name=f"{role} task", description=question, expected_output="one line")
    task.agent = agent
    return Crew(agents=[agent], tasks=[task])


async def test_an_agent_kicked_off_outside_a_crew(engine: ContextEngine) -> None:
    """``Agent.kickoff``: every call of its tool loop gets the engine's input; its question,
    tool run (native id) and answer (authored by its role) are recorded with usage."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="Lyon is sunny.", prompt_tokens=20, completion_tokens=4)
        return ScriptedResponse(
            tool_calls=[("call_lyon", "weather", json.dumps({"city": "Lyon"}))],
            prompt_tokens=10,
            completion_tokens=2,
        )

    ce.crewai.install(engine, session_id="s-agent")
    await engine.update_notebook("s-agent", MARK)
    with ScriptedOpenAIServer(script) as server:
        agent = Agent(role="Forecaster", goal="g", backstory="b", llm=llm(server), tools=[weather])
        output = await asyncio.to_thread(agent.kickoff, "Weather in Lyon?")
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "Lyon is sunny."
    assert len(requests) == 2 and all(MARK in request_text(r) for r in requests)
    doc = await engine.get_session("s-agent")
    assert doc is not None
    users = [m.content for m in doc.session.messages if m.role is Role.USER]
    assert users == ["\nCurrent Task: Weather in Lyon?"]  # CrewAI's request, once
    assert answers(doc)[-1] == ("Forecaster", "Lyon is sunny.")
    (run,) = doc.session.tool_state.tool_calls
    assert (run.tool_call_id, run.tool, run.status.value) == ("call_lyon", "weather", "success")
    assert [(u.prompt_tokens, u.completion_tokens) for u in doc.session.model_usage] == [
        (10, 2),
        (20, 4),
    ]


async def test_a_direct_llm_call_is_a_run_of_its_own(engine: ContextEngine) -> None:
    """``LLM.call`` outside any kickoff: in the install's session when it names one (the
    second call then sees the first's exchange), else each call its own scope."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        return ScriptedResponse(text=f"reply {len(body['messages'])}")

    ce.crewai.install(engine, session_id="s-direct")
    await engine.update_notebook("s-direct", MARK)
    with ScriptedOpenAIServer(script) as server:
        model = llm(server)
        await asyncio.to_thread(model.call, "first question")
        await asyncio.to_thread(model.call, [{"role": "user", "content": "second question"}])
        crewai_event_bus.flush()
        requests = server.requests
    assert all(MARK in request_text(r) for r in requests)
    assert "first question" not in request_text(requests[0]).replace("first question", "", 1)
    assert "first question" in request_text(requests[1]) and "second question" in request_text(
        requests[1]
    )
    doc = await engine.get_session("s-direct")
    assert doc is not None
    assert [m.content for m in doc.session.messages if m.role is Role.USER] == [
        "first question",
        "second question",
    ]
    assert len(doc.session.model_usage) == 2
    ce.crewai.uninstall()

    ce.crewai.install(engine)  # no session named: each call is scoped to itself
    with ScriptedOpenAIServer(script) as server:
        model = llm(server)
        await asyncio.to_thread(model.call, "alpha question")
        await model.acall("bravo question")
        crewai_event_bus.flush()
        requests = server.requests
    assert "alpha" not in request_text(requests[1])
    runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
    assert len(runs) == 2


async def test_a_hierarchical_crews_delegated_work_runs_in_a_child_scope(
    engine: ContextEngine,
) -> None:
    """The manager's calls are the crew's, authored by the manager; the coworker it
    delegates to works in a child scope: its request carries none of the manager's
    conversation, and its answer reaches the crew only as the delegation's tool result."""

    def script(body: dict[str, Any]) -> ScriptedResponse:
        tools = json.dumps(body.get("tools", []))
        if "delegate_work_to_coworker" in tools:
            if body["messages"][-1]["role"] == "tool":
                return ScriptedResponse(text="MANAGER-FINAL: it is sunny.")
            args = {"task": "find the weather", "context": "Paris", "coworker": "Researcher"}
            return ScriptedResponse(
                tool_calls=[("call_delegate", "delegate_work_to_coworker", json.dumps(args))]
            )
        return ScriptedResponse(text="WORKER-ANSWER-42")

    ce.crewai.install(engine, session_id="s-hier")
    await engine.update_notebook("s-hier", MARK)
    with ScriptedOpenAIServer(script) as server:
        researcher = Agent(role="Researcher", goal="facts", backstory="careful", llm=llm(server))
        task = Task(name="report", description="Report the weather.", expected_output="a line")
        crew = Crew(
            agents=[researcher],
            tasks=[task],
            process=Process.hierarchical,
            manager_llm=llm(server),
        )
        output = await asyncio.to_thread(crew.kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "MANAGER-FINAL: it is sunny."
    manager = [r for r in requests if "delegate_work_to_coworker" in json.dumps(r.get("tools"))]
    workers = [r for r in requests if r not in manager]
    assert len(manager) == 2 and len(workers) == 1
    assert all(MARK in request_text(r) for r in manager)
    (worker,) = workers
    assert "find the weather" in request_text(worker)
    for leak in ("Crew Manager", "Report the weather.", "call_delegate", MARK):
        assert leak not in request_text(worker), leak
    assert "WORKER-ANSWER-42" in request_text(manager[1])
    doc = await engine.get_session("s-hier")
    assert doc is not None
    assert answers(doc) == [("Crew Manager", "MANAGER-FINAL: it is sunny.")]
    (delegation,) = doc.session.tool_state.tool_calls
    assert delegation.tool_call_id == "call_delegate"
    (record,) = doc.session.task_state.todo_list.tasks
    assert (record.name, record.status.value) == ("report", "completed")
    children = [s for s in await engine.list_sessions() if s.startswith("s-hier/")]
    assert len(children) == 1
    child = await engine.get_session(children[0])
    assert child is not None
    assert answers(child) == [("Researcher", "WORKER-ANSWER-42")]


def _echo(body: dict[str, Any]) -> ScriptedResponse:
    """Answers the question of the last user message."""
    users = [m for m in body["messages"] if m["role"] == "user"]
    text = json.dumps(users[-1]["content"]) if users else ""
    for word in ("alpha", "bravo", "charlie", "delta"):
        if f"Question {word}" in text:
            return ScriptedResponse(text=f"Answer {word}.")
    return ScriptedResponse(text="Answer unknown.")


async def test_a_flow_with_two_crews(engine: ContextEngine) -> None:
    """Each crew kicked off by a Flow is its own run (its own scope) unless a session is
    named around the flow; named, both crews' tasks are in that session."""
    ce.crewai.install(engine)
    with ScriptedOpenAIServer(_echo) as server:

        class TwoCrews(Flow[dict[str, Any]]):
            @start()
            def first(self) -> str:
                return str(_one_task_crew(server, "Alpha", "Question alpha?").kickoff().raw)

            @listen(first)
            def second(self, previous: str) -> str:
                return str(_one_task_crew(server, "Bravo", "Question bravo?").kickoff().raw)

        result = await asyncio.to_thread(TwoCrews().kickoff)
        crewai_event_bus.flush()
        requests = server.requests
        assert result == "Answer bravo."
        assert len(requests) == 2
        assert "alpha" not in request_text(requests[1]).lower()
        runs = [s for s in await engine.list_sessions() if s.startswith("run:")]
        assert len(runs) == 2
        names = set()
        for session_id in runs:
            doc = await engine.get_session(session_id)
            assert doc is not None
            (record,) = doc.session.task_state.todo_list.tasks
            names.add(record.name)
        assert names == {"Alpha task", "Bravo task"}

        def named() -> Any:
            with engine.session("s-flow"):
                return TwoCrews().kickoff()

        await asyncio.to_thread(named)
        crewai_event_bus.flush()
    doc = await engine.get_session("s-flow")
    assert doc is not None
    assert {t.name for t in doc.session.task_state.todo_list.tasks} == {"Alpha task", "Bravo task"}


async def test_a_streaming_crew(engine: ContextEngine) -> None:
    """``Crew(stream=True)``: the chunks come through, every request carries the engine's
    input and the kickoff is recorded once (one run, its tasks once)."""
    ce.crewai.install(engine, session_id="s-stream")
    await engine.update_notebook("s-stream", MARK)
    with ScriptedOpenAIServer(_echo) as server:
        crew = _one_task_crew(server, "Alpha", "Question alpha?")
        crew.stream = True

        def consume() -> tuple[str, Any]:
            streaming = crew.kickoff()
            chunks = "".join(str(getattr(c, "content", "")) for c in streaming)
            return chunks, streaming.result

        chunks, result = await asyncio.to_thread(consume)
        crewai_event_bus.flush()
        requests = server.requests
    assert result.raw == "Answer alpha."
    assert "Answer alpha." in chunks
    assert len(requests) == 1 and MARK in request_text(requests[0])
    assert requests[0].get("stream") is True
    assert requests[0].get("stream_options") == {"include_usage": True}
    doc = await engine.get_session("s-stream")
    assert doc is not None
    (record,) = doc.session.task_state.todo_list.tasks
    assert record.status.value == "completed"
    assert answers(doc) == [("Alpha", "Answer alpha.")]
    (usage,) = doc.session.model_usage  # once, with the numbers of the stream's last chunk
    assert usage.task_id == record.task_id
    assert (usage.prompt_tokens, usage.completion_tokens) == (10, 5)


async def test_concurrent_kickoffs_for_two_users_never_mix(engine: ContextEngine) -> None:
    """Two users' crews kicked off concurrently (``akickoff`` and ``kickoff_async`` under
    ``asyncio.gather``), twice each: every request carries its own user's history only."""
    ce.crewai.install(engine)
    with ScriptedOpenAIServer(_echo) as server:

        async def user(session_id: str, words: tuple[str, str], native: bool) -> None:
            for word in words:
                crew = _one_task_crew(server, f"Helper {word}", f"Question {word}?")
                with engine.session(session_id):
                    if native:
                        await crew.akickoff()
                    else:
                        await crew.kickoff_async()

        await asyncio.gather(
            user("u-one", ("alpha", "bravo"), native=True),
            user("u-two", ("charlie", "delta"), native=False),
        )
        crewai_event_bus.flush()
        requests = server.requests
    assert len(requests) == 4
    one, two = {"alpha", "bravo"}, {"charlie", "delta"}
    for request in requests:
        text = request_text(request).lower()
        mine = one if any(w in text for w in one) else two
        theirs = two if mine is one else one
        assert not any(f"question {w}" in text or f"answer {w}" in text for w in theirs)
    second_of_one = next(r for r in requests if "Question bravo" in request_text(r))
    assert "Answer alpha." in request_text(second_of_one)  # its own history is there
    for session_id, words in (("u-one", one), ("u-two", two)):
        doc = await engine.get_session(session_id)
        assert doc is not None
        contents = " ".join(m.content for m in doc.session.messages).lower()
        assert all(w in contents for w in words)
        assert not any(w in contents for w in (two if words is one else one))


async def test_a_chat_with_history_per_user(engine: ContextEngine) -> None:
    """A chat app: one agent answers each new question of a user (``Agent.kickoff`` with
    that question only) inside the user's ``engine.session``; the engine hands the model the
    user's earlier turns, never another user's."""
    ce.crewai.install(engine)
    with ScriptedOpenAIServer(_echo) as server:

        def turn(session_id: str, word: str) -> str:
            agent = Agent(role="Chat", goal="answer", backstory="brief", llm=llm(server))
            with engine.session(session_id):
                return str(agent.kickoff(f"Question {word}?").raw)

        for session_id, word in (
            ("u-ann", "alpha"),
            ("u-bob", "charlie"),
            ("u-ann", "bravo"),
            ("u-bob", "delta"),
        ):
            assert await asyncio.to_thread(turn, session_id, word) == f"Answer {word}."
        crewai_event_bus.flush()
        requests = server.requests
    ann_second, bob_second = request_text(requests[2]), request_text(requests[3])
    assert "Question alpha?" in ann_second and "Answer alpha." in ann_second
    assert "charlie" not in ann_second and "delta" not in ann_second
    assert "Question charlie?" in bob_second and "Answer charlie." in bob_second
    assert "alpha" not in bob_second and "bravo" not in bob_second


async def test_an_agent_on_its_own_has_its_context_window_summariser_off_during_kickoff(
    engine: ContextEngine,
) -> None:
    seen: list[bool] = []

    def script(body: dict[str, Any]) -> ScriptedResponse:
        seen.append(agent.respect_context_window)
        return ScriptedResponse(text="ok")

    ce.crewai.install(engine, session_id="s-window")
    with ScriptedOpenAIServer(script) as server:
        agent = Agent(role="Solo", goal="g", backstory="b", llm=llm(server))
        assert agent.respect_context_window
        await asyncio.to_thread(agent.kickoff, "hello")
        await agent.kickoff_async("again")
    assert seen == [False, False]
    assert agent.respect_context_window


async def test_an_agent_kicked_off_from_a_tool_runs_in_a_child_scope(
    engine: ContextEngine,
) -> None:
    """A sub-agent called as a tool (``Agent.kickoff`` inside a crew agent's tool): its
    request carries none of the crew's conversation and its records go to a child session;
    the crew sees its answer as the tool's result."""
    from crewai.tools import tool

    def script(body: dict[str, Any]) -> ScriptedResponse:
        text = request_text(body)
        if "Sub question" in text:
            return ScriptedResponse(text="SUB-ANSWER-7")
        if body["messages"][-1]["role"] == "tool":
            return ScriptedResponse(text="Crew done.")
        return ScriptedResponse(tool_calls=[("call_ask", "ask_expert", json.dumps({"q": "x"}))])

    with ScriptedOpenAIServer(script) as server:
        expert = Agent(role="Expert", goal="g", backstory="b", llm=llm(server))

        @tool("ask_expert")
        def ask_expert(q: str) -> str:
            """Ask the expert."""
            return str(expert.kickoff("Sub question?").raw)

        lead = Agent(role="Lead", goal="g", backstory="b", llm=llm(server), tools=[ask_expert])
        task = Task(name="lead", description="Top question?", expected_output="x")
        task.agent = lead
        ce.crewai.install(engine, session_id="s-nest")
        await engine.update_notebook("s-nest", MARK)
        output = await asyncio.to_thread(Crew(agents=[lead], tasks=[task]).kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    assert output.raw == "Crew done."
    (sub,) = [r for r in requests if "Sub question" in request_text(r)]
    assert "Top question?" not in request_text(sub) and MARK not in request_text(sub)
    assert "SUB-ANSWER-7" in request_text(requests[-1])
    doc = await engine.get_session("s-nest")
    assert doc is not None
    assert ("Expert", "SUB-ANSWER-7") not in answers(doc)
    (child_id,) = [s for s in await engine.list_sessions() if s.startswith("s-nest/")]
    child = await engine.get_session(child_id)
    assert child is not None
    assert answers(child) == [("Expert", "SUB-ANSWER-7")]


async def test_an_agent_planning_its_task_plans_in_a_run_of_its_own(
    engine: ContextEngine,
) -> None:
    """Agents with a ``PlanningConfig`` ask the model for a plan before each task, naming the
    task and the agent: the planner's calls run in child scopes of the crew's session with
    their own messages, so no task request carries a plan prompt or a plan, and the crew's
    session holds the tasks' turns only."""
    from crewai.agent.planning_config import PlanningConfig

    def script(body: dict[str, Any]) -> ScriptedResponse:
        names = [t["function"]["name"] for t in body.get("tools") or ()]
        if "create_reasoning_plan" in names:
            plan = {"plan": "PLAN: think, then answer", "steps": [], "ready": True}
            return ScriptedResponse(
                tool_calls=[("call_plan", "create_reasoning_plan", json.dumps(plan))]
            )
        text = json.dumps(body["messages"])
        if "Create an execution plan" in text:
            return ScriptedResponse(text=json.dumps({"plan": "PLAN", "steps": [], "ready": True}))
        return ScriptedResponse(text="WRITTEN." if "Write one line" in text else "FACT: sunny.")

    ce.crewai.install(engine, session_id="s-plan")
    with ScriptedOpenAIServer(script) as server:
        model = llm(server)
        planning = PlanningConfig(max_attempts=1)
        researcher = Agent(
            role="Researcher", goal="find", backstory="b", llm=model, planning_config=planning
        )
        writer = Agent(
            role="Writer", goal="write", backstory="b", llm=model, planning_config=planning
        )
        research = Task(description="Weather in Paris?", expected_output="a fact", agent=researcher)
        write = Task(
            description="Write one line about it.",
            expected_output="a line",
            agent=writer,
            context=[research],
        )
        await asyncio.to_thread(Crew(agents=[researcher, writer], tasks=[research, write]).kickoff)
        crewai_event_bus.flush()
        requests = server.requests
    tasks = [r for r in requests if "Current Task" in json.dumps(r["messages"])]
    assert len(tasks) == 2
    for request in tasks:
        assert "Create an execution plan" not in json.dumps(request["messages"])
        assert "PLAN" not in json.dumps(request["messages"])
    await engine.flush()
    doc = await engine.get_session("s-plan")
    assert not any("execution plan" in m.content for m in doc.session.messages)
    children = [s for s in await engine.list_sessions() if s.startswith("s-plan/")]
    assert len(children) == 2
