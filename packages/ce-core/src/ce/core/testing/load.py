"""Many worker processes on shared sessions of one store, and a checker of what they left.

Each worker is its own OS process (``multiprocessing``, "spawn") with its own
:class:`~ce.core.engine.ContextEngine` on the store URL. The workers start together (a
barrier); worker ``w`` runs ``turns`` turns, turn ``t`` on session ``(w + t) % sessions``, so
several workers write one session at once and version conflicts happen (with
``routing="sticky"``, every turn of worker ``w`` is on session ``w % sessions``: what a router
that keeps a conversation on one worker does). A turn is what a
framework plugin records for one question with one tool round (as ``Recorder`` does): six
engine calls (:data:`STEPS`), each its own atomic commit, with the model's time
(:attr:`LoadConfig.model_ms`, none by default) awaited before each ``record_model_call``:

================= ================================================ ============================
step              engine call                                      what that commit stores
================= ================================================ ============================
prepare_turn      ``prepare_turn`` (a new user message)            user message, turn record
model_call_tool   ``record_model_call`` (reply with a tool call)   assistant message, usage
ingest_result     ``ingest_evidence`` (the tool's output)          ``tool_result`` evidence
record_tool_call  ``record_tool_call`` (``tool_call_from_run``)    the tool call record
prepare_call      ``prepare_call`` (the pending tool message)      tool message, turn record
model_call_answer ``record_model_call`` (the answer and its text)  assistant message,
                                                                   ``llm_output`` evidence,
                                                                   usage
================= ================================================ ============================

Every id is the framework's and unique per worker and turn (``<run>-w<w>-t<t>-user``,
``...-tool`` for the tool call, ``...-usage-1``...), so a record stored twice shows. A
:class:`~ce.core.errors.VersionConflictError` that the engine raises (after its own retries)
is retried by the worker at once with the same ids. After each engine call returns, the
worker appends a JSON line to its log and flushes it to the operating system: the
acknowledged operations (a SIGKILL does not lose what the OS holds, so no fsync, which on one
disk would serialize the workers on each other's flushes and weigh on the figures).
The checker then reads every session back through a fresh store and counts, against the
logs, records lost or stored twice, records nobody acknowledged, tool messages not answering
exactly one call, calls without a result, engine calls stored in part, and whether a fresh
engine's ``prepare_turn`` on each session keeps tool pairs intact (every assembled input the
workers got is checked too).

With :attr:`LoadConfig.kills`, each worker named there stops at its :class:`KillPoint`, tells
the parent over a pipe, and the parent SIGKILLs it while the other workers go on.
``acknowledged`` stops after a step returned and was logged (a kill between two engine
calls); ``committed`` stops once the step's commit is in the store, before the engine call
returns (a kill after the commit, before the caller heard of it). Either way each engine call
of the killed turn must be stored wholly or not at all, and a tool call left without its
result stays out of assembled inputs.

Run ``python -m ce.core.testing.load --store URL --workers N --turns M --sessions S
[--kill-one] [--json]``; the exit status is 0 when the check passes. Only stores shared
across processes on this machine are accepted: SQLite and file URLs, PostgreSQL on a
loopback address or a Unix socket.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing import connection
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from threading import BrokenBarrierError
from typing import Any, Literal
from urllib.parse import urlsplit

from ce.core.testing._load_check import CheckReport, KillReport, check_sessions
from ce.core.testing._load_worker import STEPS, KillPoint, WorkerSpec, turn_steps, worker_main

__all__ = [
    "STEPS",
    "CheckReport",
    "KillPoint",
    "KillReport",
    "LoadConfig",
    "LoadError",
    "LoadResult",
    "WorkerReport",
    "check_sessions",
    "log_path",
    "main",
    "read_log",
    "run_load",
    "turn_steps",
]

_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


class LoadError(RuntimeError):
    """The run could not be carried out: a worker did not start, or the timeout passed."""


@dataclass(frozen=True)
class LoadConfig:
    """One load run. ``kills``: the workers to SIGKILL and where (one point per worker);
    ``timeout``: seconds for the whole run; ``log_dir``: where the workers' logs go (default:
    a temporary directory, removed afterwards); ``run_id`` prefixes every session and record
    id; ``model_ms``: how long each of a turn's two model calls takes, awaited between the
    engine call that prepared it and the one that records it (0: no time at all, so the
    workers do nothing but engine work; an app's model calls take seconds); ``routing``:
    ``round`` sends each worker's turns round the sessions, ``sticky`` keeps each worker on
    one session."""

    store_url: str
    workers: int = 4
    turns: int = 15
    sessions: int = 2
    model_ms: float = 0.0
    routing: Literal["round", "sticky"] = "round"
    kills: tuple[KillPoint, ...] = ()
    timeout: float = 120.0
    log_dir: Path | None = None
    run_id: str = field(default_factory=lambda: f"load{uuid.uuid4().hex[:8]}")

    def session_ids(self) -> list[str]:
        return [f"{self.run_id}-s{i}" for i in range(self.sessions)]


@dataclass
class WorkerReport:
    """What one worker's log says. ``conflicts``: version conflicts its engine met
    (``Error`` events with reason ``version_conflict``, including those the engine retried
    itself); ``retries``: conflicts the engine raised, which the worker retried; ``reloads``:
    sessions its engine read whole from the store (``SessionLoaded``: the first use, and
    after every conflict); ``cpu_s``: the CPU time the worker process spent from the start
    barrier to its last turn (every thread of it). A killed worker's counters are lost (0)."""

    worker: int
    operations: int = 0
    turns_done: int = 0
    conflicts: int = 0
    retries: int = 0
    reloads: int = 0
    cpu_s: float = 0.0
    pair_failures: int = 0
    turn_ms: list[float] = field(default_factory=list)
    exit_code: int | None = None
    error: str = ""
    killed: bool = False


@dataclass
class LoadResult:
    """A finished run: the workers' reports, the check, where the kill landed, and the wall
    time from the start barrier to the last worker's exit."""

    config: LoadConfig
    wall_s: float
    workers: list[WorkerReport]
    check: CheckReport
    kills: list[KillReport] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return sum(w.turns_done for w in self.workers)

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall_s if self.wall_s else 0.0

    @property
    def conflicts(self) -> int:
        return sum(w.conflicts for w in self.workers)

    @property
    def retries(self) -> int:
        return sum(w.retries for w in self.workers)

    @property
    def reloads(self) -> int:
        return sum(w.reloads for w in self.workers)

    @property
    def cpu_ms_per_turn(self) -> float:
        """The workers' CPU time per completed turn (killed workers' not counted)."""
        done = [w for w in self.workers if not w.killed]
        turns = sum(w.turns_done for w in done)
        return 1000 * sum(w.cpu_s for w in done) / turns if turns else 0.0

    def turn_ms(self, percentile: int) -> float:
        """The ``percentile`` (1..99) of the completed turns' wall times, interpolated."""
        values = sorted(ms for w in self.workers for ms in w.turn_ms)
        if len(values) < 2:
            return values[0] if values else 0.0
        return statistics.quantiles(values, n=100, method="inclusive")[percentile - 1]

    def summary(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict."""
        return {
            "store": _redacted(self.config.store_url),
            "run_id": self.config.run_id,
            "workers": self.config.workers,
            "turns_per_worker": self.config.turns,
            "sessions": self.config.sessions,
            "model_ms": self.config.model_ms,
            "routing": self.config.routing,
            "turns": self.turns,
            "wall_s": round(self.wall_s, 3),
            "turns_per_s": round(self.turns_per_s, 2),
            "turn_ms_p50": round(self.turn_ms(50), 2),
            "turn_ms_p95": round(self.turn_ms(95), 2),
            "conflicts": self.conflicts,
            "retries": self.retries,
            "reloads": self.reloads,
            "cpu_ms_per_turn": round(self.cpu_ms_per_turn, 2),
            "check": {**asdict(self.check), "ok": self.check.ok},
            "kills": [asdict(kill) for kill in self.kills],
            "per_worker": [
                {k: v for k, v in asdict(w).items() if k != "turn_ms"} for w in self.workers
            ],
        }


def _redacted(url: str) -> str:
    password = urlsplit(url).password
    return url.replace(f":{password}@", ":***@", 1) if password else url


def _check_config(config: LoadConfig) -> None:
    parts = urlsplit(config.store_url)
    if parts.scheme in ("postgresql", "postgres"):
        if parts.hostname is not None and parts.hostname not in _LOOPBACK:
            raise ValueError(f"the load harness drives loopback servers only, not {parts.hostname}")
    elif parts.scheme not in ("sqlite", "file"):
        raise ValueError(f"{_redacted(config.store_url)}: workers need a store on disk or a server")
    if min(config.workers, config.turns, config.sessions) < 1:
        raise ValueError("workers, turns and sessions must be >= 1")
    if not 0 <= config.model_ms < 60_000:
        raise ValueError("model_ms must be >= 0 and under a minute")
    if config.routing not in ("round", "sticky"):
        raise ValueError(f"no such routing: {config.routing!r}")
    for kill in config.kills:
        turn_ok = 0 <= kill.turn < config.turns and 0 <= kill.worker < config.workers
        if kill.step not in STEPS or not turn_ok:
            raise ValueError(f"no such kill point: {kill}")
    if len({kill.worker for kill in config.kills}) != len(config.kills):
        raise ValueError("one kill point per worker")


def log_path(log_dir: Path, run_id: str, worker: int) -> Path:
    """Where worker ``worker`` of run ``run_id`` writes its log."""
    return log_dir / f"{run_id}-w{worker}.jsonl"


def read_log(path: Path, worker: int) -> tuple[WorkerReport, list[dict[str, Any]]]:
    """Worker ``worker``'s report from its log at ``path``, and the log's acknowledged steps
    and ``turn_done`` lines (what :func:`check_sessions` takes)."""
    report = WorkerReport(worker)
    entries: list[dict[str, Any]] = []
    if not path.exists():
        return report, entries
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break  # a line the kill cut short was never acknowledged
        step = entry["step"]
        if step in STEPS:
            report.operations += 1
            entries.append(entry)
        elif step == "turn_done":
            report.turns_done += 1
            report.turn_ms.append(entry["ms"])
            entries.append(entry)
        elif step == "pair_failure":
            report.pair_failures += 1
        elif step in ("done", "error"):
            report.conflicts = entry.get("conflicts", 0)
            report.retries = entry.get("retries", 0)
            report.reloads = entry.get("reloads", 0)
            report.cpu_s = entry.get("cpu_s", 0.0)
            report.error = entry.get("detail", "")
    return report, entries


def run_load(config: LoadConfig) -> LoadResult:
    """Start the workers, wait for them (SIGKILLing those ``config.kills`` name), then check
    the store. Call it from synchronous code: it runs its own event loop for the check.
    Raises :class:`ValueError` for a bad config and :class:`LoadError` when a worker does not
    start or the timeout passes (every worker is killed then); a worker that fails later
    shows in its report and in the check's problems."""
    _check_config(config)
    with tempfile.TemporaryDirectory(prefix="ce-load-") as tmp:
        log_dir = config.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        return _run(config, log_dir)


def _receive(
    ends: dict[Connection, int], deadline: float, what: str, procs: list[BaseProcess]
) -> Iterator[int]:
    """Yield each worker as one message from it arrives on its end of the pipe; raise
    :class:`LoadError` when one exits first or the deadline passes."""
    waiting = dict(ends)
    while waiting:
        ready = connection.wait(list(waiting), max(0.0, deadline - time.time()))
        if not ready:
            raise LoadError(f"workers {sorted(waiting.values())} did not reach {what} in time")
        for end, worker in list(waiting.items()):
            if end in ready:
                try:
                    end.recv()
                except EOFError:
                    proc = procs[worker]
                    proc.join()
                    raise LoadError(
                        f"worker {worker} exited with {proc.exitcode} before {what}"
                    ) from None
                del waiting[end]
                yield worker


def _run(config: LoadConfig, log_dir: Path) -> LoadResult:
    ctx = multiprocessing.get_context("spawn")
    deadline = time.time() + config.timeout
    barrier = ctx.Barrier(config.workers + 1)
    kills = {kill.worker: kill for kill in config.kills}
    pipes = [ctx.Pipe() for _ in range(config.workers)]  # (parent's end, worker's end)
    paths = [log_path(log_dir, config.run_id, w) for w in range(config.workers)]
    procs: list[BaseProcess] = []
    for w, path in enumerate(paths):
        spec = WorkerSpec(
            store_url=config.store_url,
            run_id=config.run_id,
            worker=w,
            turns=config.turns,
            session_ids=tuple(config.session_ids()),
            model_ms=config.model_ms,
            sticky=config.routing == "sticky",
            log_path=path,
            deadline=deadline,
            kill=kills.get(w),
        )
        procs.append(
            ctx.Process(
                target=worker_main,
                args=(spec, barrier, pipes[w][1]),
                name=f"ce-load-w{w}",
                daemon=True,
            )
        )
    try:
        for proc, (_, worker_end) in zip(procs, pipes, strict=True):
            proc.start()
            worker_end.close()  # the worker holds it now: its exit reads as EOF here
        ends = {parent_end: w for w, (parent_end, _) in enumerate(pipes)}
        for _ in _receive(ends, deadline, "their start", procs):
            pass
        try:
            barrier.wait(max(0.0, deadline - time.time()))
        except BrokenBarrierError:
            raise LoadError("a worker failed between its start and the barrier") from None
        start = time.perf_counter()
        victims = {end: w for end, w in ends.items() if w in kills}
        for worker in _receive(victims, deadline, "their kill point", procs):
            procs[worker].kill()
        for proc in procs:
            proc.join(max(0.0, deadline - time.time()))
        if any(proc.is_alive() for proc in procs):
            raise LoadError(f"the workers did not finish within {config.timeout} s")
        wall = time.perf_counter() - start
    finally:
        for parent_end, _ in pipes:
            parent_end.close()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            if proc.pid is not None:
                proc.join()
    workers: list[WorkerReport] = []
    logs: list[list[dict[str, Any]]] = []
    for w, (proc, path) in enumerate(zip(procs, paths, strict=True)):
        report, entries = read_log(path, w)
        report.exit_code = proc.exitcode
        report.killed = w in kills
        workers.append(report)
        logs.append(entries)
    check, kill_reports = asyncio.run(
        check_sessions(
            config.store_url,
            config.run_id,
            config.session_ids(),
            config.turns,
            logs,
            killed=sorted(kills),
        )
    )
    for report in workers:
        if report.exit_code != 0 and not report.killed:
            check.problems.append(f"worker {report.worker} exit {report.exit_code}: {report.error}")
        check.pair_failures += report.pair_failures
    if check.pair_failures:
        check.problems.append(f"{check.pair_failures} assembled inputs broke a tool pair")
    return LoadResult(config, wall, workers, check, kill_reports)


def main(argv: list[str] | None = None) -> int:
    """``python -m ce.core.testing.load``: run, check, print; 0 when the check passes, 1
    when it fails, 2 when the run could not be carried out."""
    parser = argparse.ArgumentParser(
        prog="python -m ce.core.testing.load", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--store", required=True, help="sqlite:///..., postgresql://...")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--turns", type=int, default=15, help="turns per worker")
    parser.add_argument("--sessions", type=int, default=2, help="sessions they share")
    parser.add_argument(
        "--model-ms", type=float, default=0.0, help="time each simulated model call takes"
    )
    parser.add_argument(
        "--routing",
        choices=("round", "sticky"),
        default="round",
        help="turns round the sessions, or each worker on one session",
    )
    parser.add_argument(
        "--kill-one",
        action="store_true",
        help="SIGKILL worker 0 in its middle turn, once record_tool_call is committed",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the run")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the workers' logs here")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    config = LoadConfig(
        store_url=args.store,
        workers=args.workers,
        turns=args.turns,
        sessions=args.sessions,
        model_ms=args.model_ms,
        routing=args.routing,
        kills=(KillPoint(0, args.turns // 2, "record_tool_call", "committed"),)
        if args.kill_one
        else (),
        timeout=args.timeout,
        log_dir=args.log_dir,
    )
    try:
        result = run_load(config)
    except (LoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        check = result.check
        print(
            f"{summary['turns']} turns by {config.workers} workers on {config.sessions} "
            f"sessions in {summary['wall_s']} s: {summary['turns_per_s']} turns/s, turn p50 "
            f"{summary['turn_ms_p50']} ms, p95 {summary['turn_ms_p95']} ms; "
            f"{result.conflicts} version conflicts ({result.retries} raised and retried), "
            f"{result.reloads} session loads, {result.cpu_ms_per_turn:.1f} CPU ms per turn"
        )
        print(
            f"check: {check.turns_complete}/{check.turns_acknowledged} acknowledged turns "
            f"complete; lost {check.lost}, duplicated {check.duplicated}, unacknowledged "
            f"{check.unacknowledged}, orphan tool results {check.orphan_tool_results}, "
            f"unanswered calls {check.unanswered_tool_calls}, partial operations "
            f"{check.partial_operations}, pair failures {check.pair_failures}"
        )
        for kill in result.kills:
            print(f"kill: {asdict(kill)}")
        for problem in check.problems:
            print(f"problem: {problem}")
    return 0 if result.check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
