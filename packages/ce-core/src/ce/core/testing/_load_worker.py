"""One load worker: its own engine on the shared store, ``turns`` turns, an acknowledgement
log. See :mod:`ce.core.testing.load`."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import IO, Any, Literal

from ce.core.config import RuntimeConfig
from ce.core.engine import ContextEngine
from ce.core.errors import VersionConflictError
from ce.core.events import Event
from ce.core.integration import (
    ModelCall,
    ToolRun,
    llm_output_evidence,
    model_usage_from_call,
    tool_call_from_run,
    tool_result_evidence,
)
from ce.core.schema import (
    Evidence,
    Message,
    ModelInvocation,
    ModelUsageStage,
    PrepareResult,
    Role,
    ToolCallRequest,
)
from ce.core.stores import open_store
from ce.core.testing.assertions import assert_tool_pairs_intact

__all__ = [
    "CONFIG",
    "STEPS",
    "KillPoint",
    "WorkerSpec",
    "prefix",
    "step_records",
    "turn_steps",
    "worker_main",
]

STEPS = (
    "prepare_turn",
    "model_call_tool",
    "ingest_result",
    "record_tool_call",
    "prepare_call",
    "model_call_answer",
)
"""The engine calls of one turn, in order."""

CONFIG = RuntimeConfig(model_hint="gpt-4o")
"""The runtime config of the workers' and the checker's engines."""

_MAX_ATTEMPTS = 1000
_INVOCATION = ModelInvocation(provider="openai", model="gpt-4o")


def prefix(run_id: str, worker: int, turn: int) -> str:
    """The prefix of every id of one worker's turn."""
    return f"{run_id}-w{worker}-t{turn}"


def step_records(turn_prefix: str) -> dict[str, list[tuple[str, str]]]:
    """The records, as (kind, key), that each step of the turn ``turn_prefix`` stores:
    messages, tool calls and usage by id, the ``tool_result`` evidence by the tool call it
    links to and the ``llm_output`` evidence by the usage it links to, a turn record by the
    id of the last message it saw (the one its step wrote)."""
    p = turn_prefix
    return {
        "prepare_turn": [("message", f"{p}-user"), ("turn", f"{p}-user")],
        "model_call_tool": [("message", f"{p}-call"), ("usage", f"{p}-usage-1")],
        "ingest_result": [("evidence", f"{p}-tool")],
        "record_tool_call": [("tool_call", f"{p}-tool")],
        "prepare_call": [("message", f"{p}-result"), ("turn", f"{p}-result")],
        "model_call_answer": [
            ("message", f"{p}-answer"),
            ("evidence", f"{p}-usage-2"),
            ("usage", f"{p}-usage-2"),
        ],
    }


@dataclass(frozen=True)
class KillPoint:
    """Where worker ``worker`` stops for the parent to SIGKILL it, in its turn ``turn``:
    ``acknowledged``
    -- after ``step`` returned and was logged, before the next engine call; ``committed`` --
    once ``step``'s commit is in the store (its ``Persisted`` event), before the engine call
    returns and before it is logged."""

    worker: int
    turn: int
    step: str
    when: Literal["acknowledged", "committed"]


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process is told. ``deadline`` is a ``time.time()`` value."""

    store_url: str
    run_id: str
    worker: int
    turns: int
    session_ids: tuple[str, ...]
    log_path: Path
    deadline: float
    kill: KillPoint | None = None
    model_ms: float = 0.0
    sticky: bool = False  # every turn on session ``worker % len(session_ids)``


class _NotKilled(BaseException):
    """The parent gave up on killing this worker at its kill point."""


class _Worker:
    def __init__(
        self,
        spec: WorkerSpec,
        engine: ContextEngine,
        log: IO[str],
        pipe: Connection,
    ) -> None:
        self.spec = spec
        self.engine = engine
        self.log = log
        self.pipe = pipe
        self.counts: Counter[str] = Counter()
        self.armed = False
        engine.events.on("Error", self._on_error)
        engine.events.on("SessionLoaded", self._on_loaded)
        engine.events.on("Persisted", self._on_persisted)

    def _on_error(self, event: Event) -> None:
        if event.payload.get("reason") == "version_conflict":
            self.counts["conflicts"] += 1

    def _on_loaded(self, event: Event) -> None:
        self.counts["reloads"] += 1

    def _on_persisted(self, event: Event) -> None:
        if self.armed:
            self.stop_for_kill()

    def stop_for_kill(self) -> None:
        """Tell the parent to kill this process, and wait for it: the parent SIGKILLs it, or
        closes its end of the pipe when it gives up (then, or at the deadline, this raises
        :class:`_NotKilled`, which the event bus does not swallow as it does handler
        errors). A pipe, not a shared lock or event: a process killed while it waits on one
        of those leaves it unusable."""
        self.pipe.send("kill point")
        self.pipe.poll(max(0.0, self.spec.deadline - time.time()))
        raise _NotKilled("the parent did not kill this worker")

    def write(self, entry: dict[str, Any]) -> None:
        self.log.write(json.dumps(entry, sort_keys=True) + "\n")
        self.log.flush()  # in the OS: a SIGKILL of this process does not lose it

    async def call(
        self, turn: int, session_id: str, step: str, fn: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Run one engine call, retrying version conflicts; log it once it returned."""
        kill = self.spec.kill
        kill_here = kill is not None and (kill.turn, kill.step) == (turn, step)
        self.armed = kill_here and kill is not None and kill.when == "committed"
        start = time.perf_counter()
        for _ in range(_MAX_ATTEMPTS):
            if time.time() > self.spec.deadline:
                raise TimeoutError(f"deadline passed in turn {turn}, step {step}")
            try:
                result = await fn()
            except VersionConflictError:
                self.counts["retries"] += 1
                continue
            entry: dict[str, Any] = {"turn": turn, "session": session_id, "step": step}
            entry["ms"] = round((time.perf_counter() - start) * 1000, 3)
            if isinstance(result, PrepareResult):
                entry["turn_id"] = result.report.turn_id
                self._check_pairs(result, turn, step)
            self.write(entry)
            if kill_here and not self.armed:
                self.stop_for_kill()
            return result
        raise RuntimeError(f"{_MAX_ATTEMPTS} version conflicts in a row on {session_id}")

    def _check_pairs(self, result: PrepareResult, turn: int, step: str) -> None:
        parts = result.assembled_input.parts
        try:
            assert_tool_pairs_intact(parts)
            if step == "prepare_call":
                own = f"{prefix(self.spec.run_id, self.spec.worker, turn)}-tool"
                if not any(p.tool_call_id == own for p in parts):
                    raise AssertionError(f"its own tool result {own} is missing")
        except AssertionError as exc:
            self.write({"turn": turn, "step": "pair_failure", "detail": str(exc)})

    async def turn(self, turn: int) -> None:
        """One question with one tool round, as a framework plugin records it."""
        spec = self.spec
        shift = 0 if spec.sticky else turn
        sid = spec.session_ids[(spec.worker + shift) % len(spec.session_ids)]
        steps = turn_steps(self.engine, sid, prefix(spec.run_id, spec.worker, turn), spec.model_ms)
        start = time.perf_counter()
        for step in STEPS:
            await self.call(turn, sid, step, steps[step])
        ms = round((time.perf_counter() - start) * 1000, 3)
        self.write({"turn": turn, "session": sid, "step": "turn_done", "ms": ms})


def turn_steps(
    engine: ContextEngine, session_id: str, turn_prefix: str, model_ms: float = 0.0
) -> dict[str, Callable[[], Awaitable[Any]]]:
    """The engine calls of one turn on ``session_id`` (by the names of :data:`STEPS`, to
    run in that order): a question with one tool round, as a framework plugin records it;
    every id starts with ``turn_prefix``. Each model call first waits ``model_ms``."""
    p = turn_prefix
    call_id = f"{p}-tool"
    user = Message(role=Role.USER, content=f"Question {p}?", message_id=f"{p}-user")
    call = Message(
        role=Role.ASSISTANT,
        content="",
        tool_calls=[
            ToolCallRequest(
                tool_call_id=call_id,
                name="lookup",
                raw_arguments=json.dumps({"q": p}),
                arguments={"q": p},
            )
        ],
        invocation=_INVOCATION,
        message_id=f"{p}-call",
    )
    now = time.time()
    run = ToolRun(call_id, "lookup", {"q": p}, f"lookup result for {p}", None, now, now)
    result = Message(
        role=Role.TOOL,
        content=f"lookup result for {p}",
        tool_call_id=call_id,
        name="lookup",
        message_id=f"{p}-result",
    )
    answer = Message(
        role=Role.ASSISTANT,
        content=f"Answer {p}.",
        invocation=_INVOCATION,
        message_id=f"{p}-answer",
    )
    draft = tool_result_evidence(run)
    evidence: list[Evidence] = []

    async def model_call(n: int, stage: ModelUsageStage, reply: Message) -> Any:
        if model_ms:  # the model's time: the caller waits, the engine is not held
            await asyncio.sleep(model_ms / 1000)
        done = ModelCall(
            call_id=f"{p}-usage-{n}",
            provider="openai",
            model="gpt-4o",
            prompt_tokens=100 * n,
            completion_tokens=10,
            latency_ms=5,
            output_text=reply.content,
            stage=stage,
        )
        output = llm_output_evidence(done)
        return await engine.record_model_call(
            session_id,
            model_usage_from_call(done),
            reply=reply,
            output=(output.content, output.source) if output is not None else None,
        )

    async def ingest() -> Evidence:
        stored = await engine.ingest_evidence(
            session_id,
            draft.content,
            draft.source,
            draft.evidence_type,
            draft.links,
            draft.metadata,
        )
        evidence.append(stored)
        return stored

    return {
        "prepare_turn": lambda: engine.prepare_turn(session_id, user),
        "model_call_tool": lambda: model_call(1, ModelUsageStage.PLAN, call),
        "ingest_result": ingest,
        "record_tool_call": lambda: engine.record_tool_call(
            session_id, tool_call_from_run(run, [evidence[-1].evidence_id])
        ),
        "prepare_call": lambda: engine.prepare_call(session_id, [user, call, result]),
        "model_call_answer": lambda: model_call(2, ModelUsageStage.ANSWER, answer),
    }


async def _run(spec: WorkerSpec, barrier: Barrier, pipe: Connection) -> None:
    with spec.log_path.open("a", encoding="utf-8") as log:
        engine = ContextEngine(store=open_store(spec.store_url), config=CONFIG)
        worker = _Worker(spec, engine, log, pipe)
        try:
            engine.estimator.estimate_text("warm-up", CONFIG.model_hint)  # loads the tokenizer
            pipe.send("ready")
            barrier.wait(max(0.0, spec.deadline - time.time()))
            cpu = time.process_time()
            for turn in range(spec.turns):
                await worker.turn(turn)
            cpu_s = round(time.process_time() - cpu, 4)
            worker.write({"step": "done", "cpu_s": cpu_s, **worker.counts})
        except BaseException as exc:
            detail = f"{type(exc).__name__}: {exc}"
            worker.write({"step": "error", "detail": detail, **worker.counts})
            raise
        finally:
            await engine.close()
            await engine.store.close()


def worker_main(spec: WorkerSpec, barrier: Barrier, pipe: Connection) -> None:
    """Entry point of a worker process: wait at ``barrier`` with the other workers, run the
    turns. ``pipe``: the worker's end of a pipe to the parent; it sends ``ready`` on it before
    the barrier and, at ``spec.kill``, sends again and waits for the SIGKILL."""
    asyncio.run(_run(spec, barrier, pipe))
