"""Overhead of ``ce.crewai.install(engine)`` per crew kickoff of one agent LLM call.

A CrewAI LLM that answers at once (a ``BaseLLM`` subclass returning ``Final Answer: ok`` with
its own call events and usage 100/1, no network) serves a one-agent, one-task crew, kicked
off through CrewAI's public ``Crew.kickoff``: the same kickoff without the plugin, then with
the plugin installed (engine on an SQLite file). The difference of the medians is what the
plugin adds to a kickoff with one model call: the kickoff's tasks queued, ``prepare_call``
before the call and the recording of the task, the model call and their results; the
engine's commits per kickoff are counted too.

    python benchmarks/bench_crewai.py [--calls 100] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from _report import (  # noqa: E402
    OVERHEAD_HEADER,
    overhead_row,
    package_version,
    section_head,
    write_section,
)
from crewai import Agent, Crew, Task  # noqa: E402
from crewai.events import crewai_event_bus  # noqa: E402
from crewai.events.types.llm_events import LLMCallType  # noqa: E402
from crewai.llms.base_llm import BaseLLM, llm_call_context  # noqa: E402

import ce.crewai  # noqa: E402
from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

BUDGET = 8_000
REPLY_TOKENS = 1_024
BLOCK = 10  # kickoffs per block; blocks alternate without / with the plugin
PACKAGES = ("ce-core", "ce-crewai", "crewai", "tiktoken", "pydantic")
SESSION = "bench-crew"


class InstantLLM(BaseLLM):
    """Answers ``Final Answer: ok`` at once, emitting CrewAI's call events with usage 100/1;
    keeps the messages it was handed so the check can see what the model received."""

    received: list[Any] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        with llm_call_context():
            task, agent = kwargs.get("from_task"), kwargs.get("from_agent")
            self._emit_call_started_event(messages=messages, from_task=task, from_agent=agent)
            type(self).received = list(messages)
            out = "Thought: done\nFinal Answer: ok"
            self._emit_call_completed_event(
                response=out,
                call_type=LLMCallType.LLM_CALL,
                from_task=task,
                from_agent=agent,
                messages=messages,
                usage={"prompt_tokens": 100, "completion_tokens": 1},
            )
            return out

    def supports_function_calling(self) -> bool:
        return False


def crew() -> Crew:
    agent = Agent(role="Bench", goal="answer", backstory="fast", llm=InstantLLM(model="instant"))
    task = Task(name="answer", description="Say ok.", expected_output="ok", agent=agent)
    return Crew(agents=[agent], tasks=[task])


def kickoff() -> float:
    app = crew()
    start = time.perf_counter()
    app.kickoff()
    return time.perf_counter() - start


def check(engine: ContextEngine) -> None:
    """Untimed, with the plugin: the model gets the engine's input (the session's notebook)
    and the task and its usage are recorded."""
    ce.crewai.install(engine, session_id=SESSION)
    try:
        engine.sync.update_notebook(SESSION, "BENCH-NOTE")
        kickoff()
        crewai_event_bus.flush()
        assert "BENCH-NOTE" in str(InstantLLM.received[0]["content"]), InstantLLM.received[0]
        doc = engine.sync.get_session(SESSION)
        assert doc is not None and doc.session.task_state.todo_list.tasks
        assert doc.session.model_usage[-1].task_id is not None
    finally:
        ce.crewai.uninstall()


def run(engine: ContextEngine, calls: int) -> tuple[list[float], list[float], float]:
    """The timed kickoffs without and with the plugin, and the engine's commits per timed
    kickoff with it."""
    without: list[float] = []
    with_plugin: list[float] = []
    commits: list[Any] = []
    engine.events.on("Persisted", commits.append)
    counted = 0
    for block in range(-(-calls // BLOCK) + 1):
        for installed, sink in ((False, without), (True, with_plugin)):
            if installed:
                ce.crewai.install(engine, session_id=SESSION)
            before = len(commits)
            try:
                times = [kickoff() for _ in range(BLOCK)]
                crewai_event_bus.flush()
            finally:
                if installed:
                    ce.crewai.uninstall()
            if block:  # the first block warms up
                sink.extend(times)
                if installed:
                    counted += len(commits) - before
    return without[:calls], with_plugin[:calls], counted / len(with_plugin)


def report(row: str, command: str, calls: int, commits: float) -> str:
    versions = ", ".join(f"{name} {package_version(name)}" for name in PACKAGES)
    return (
        "\n".join(
            [
                "## CrewAI plugin: overhead per kickoff with one LLM call",
                "",
                *section_head(command, versions, note=" (other jobs shared the machine: noisy)"),
                "",
                "A one-agent, one-task crew on a CrewAI LLM that answers at once (a `BaseLLM`"
                " subclass returning `Final Answer: ok` with CrewAI's call events, usage 100/1)"
                " is kicked off through `Crew.kickoff`. Without the plugin that is CrewAI's own"
                " cost of a kickoff. With `ce.crewai.install(engine, session_id=...)` (engine on an"
                " `SQLiteStore` file, `gpt-4o` tokenizer, budget"
                f" {BUDGET:,} input tokens) the kickoff also queues its task, runs `prepare_call`"
                " before the call (the session grows by the crew's messages each kickoff) and"
                " queues the records of the task, the model call and the result (written before"
                " the next engine call). An untimed check first asserts the model got the"
                f" session's notebook and the usage its task. Blocks of {BLOCK} kickoffs alternate"
                " without and with the plugin (install / uninstall between blocks; the first block"
                f" of each is a warm-up); {calls} timed kickoffs each; `time.perf_counter()`"
                " around `kickoff()`; p95 interpolated.",
                "",
                *OVERHEAD_HEADER,
                row,
                "",
                "Engine commits per timed kickoff with the plugin (`Persisted` events):"
                f" {commits:.2f}.",
            ]
        )
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="timed kickoffs per variant")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/bench_crewai.py"
    if args.calls != 100:
        command += f" --calls {args.calls}"
    if args.write:
        command += f" --write {args.write}"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_DATA_HOME"] = tmp  # CrewAI's own storage, of this run only
        config = RuntimeConfig(
            model_hint="gpt-4o",
            budget=BudgetConfig(
                max_input_tokens=BUDGET + REPLY_TOKENS, reserved_reply_tokens=REPLY_TOKENS
            ),
        )
        engine = ContextEngine(store=SQLiteStore(str(Path(tmp) / "sessions.db")), config=config)
        check(engine)
        without, with_plugin, commits = run(engine, args.calls)
        engine.sync.close()
    section = report(
        overhead_row("Crew.kickoff (one LLM call)", without, with_plugin),
        command,
        args.calls,
        commits,
    )
    print(section)
    if args.write:
        write_section(args.write, "crewai", section)


if __name__ == "__main__":
    main()
