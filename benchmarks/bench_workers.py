"""Turns per second through the engine with 1, 4 and 16 worker processes on shared sessions,
on SQLite and on PostgreSQL, checked afterwards: nothing lost, nothing duplicated.

Each figure is one run of the load harness :mod:`ce.core.testing.load`: N worker processes
("spawn"), each with its own ``ContextEngine`` on the store, start together and run
``--turns`` turns each over S shared sessions (turn t of worker w on session (w + t) mod S),
S = 1, 4 and 16 (``--sessions``; ``w`` stands for N). A turn is six engine calls, as the
plugins make them (``prepare_turn``, ``record_model_call`` with the tool call,
``ingest_evidence`` of the tool's output, ``record_tool_call``, ``prepare_call`` with the
tool message, ``record_model_call`` with the answer). Then the
checker reads every session back and compares it with the workers' logs of
acknowledged calls. One more run per store SIGKILLs a worker in the middle of a turn. Then
4 workers on 4 sessions, 16 on 4 and 16 on 1 run again twice: with each model call taking
``--model-ms`` (awaited, as an app awaits its model), and with each worker kept on one
session (``routing="sticky"``, as a router that keeps a conversation on one worker does).
Run::

    python benchmarks/bench_workers.py [--workers 1,4,16] [--turns 20] [--sessions 4,w]
                                       [--model-ms 50]
                                       [--postgres postgresql://postgres@127.0.0.1:5432/test]
                                       [--skip-postgres] [--write docs/benchmarks.md]

PostgreSQL runs each use a schema of their own in that database (``?ce_schema=``), dropped
afterwards; they are skipped, with a note in the output, when the server does not answer.
``--write`` replaces the section between ``<!-- bench:workers:start -->`` and
``<!-- bench:workers:end -->`` of that file (appending it when absent).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import secrets
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from _report import (
    cpu_model,
    drop_schema,
    postgres_version,
    schema_url,
    write_section,
)

from ce.core.testing.load import KillPoint, LoadConfig, LoadResult, run_load

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


NewStore = Callable[[], tuple[str, Callable[[], None]]]
"""Makes a fresh store: its URL and what removes it."""


@dataclass
class Run:
    store: str
    result: LoadResult


ACCEPTANCE_SHAPES = [(4, 4), (16, 4), (16, 1)]
"""The (workers, sessions) run again with the model's time and with sticky routing."""


@dataclass(frozen=True)
class Variant:
    """How the workers' turns go: round the sessions or sticky, with or without model time."""

    routing: Literal["round", "sticky"] = "round"
    model_ms: float = 0.0


def one_run(
    store: str,
    url: str,
    workers: int,
    turns: int,
    sessions: int,
    kill: bool,
    variant: Variant = Variant(),
) -> Run:
    kills = (KillPoint(0, turns // 2, "record_tool_call", "committed"),) if kill else ()
    config = LoadConfig(
        url,
        workers,
        turns,
        sessions,
        model_ms=variant.model_ms,
        routing=variant.routing,
        kills=kills,
        timeout=1800,
    )
    result = run_load(config)
    s = result.summary()
    check = result.check
    print(
        f"{store:10} {workers:>2} workers{' + kill' if kill else ''} on {sessions:>2}, "
        f"{variant.routing}, model {variant.model_ms:g} ms: {s['turns_per_s']:7.2f} "
        f"turns/s, p50 {s['turn_ms_p50']:8.1f} ms, p95 {s['turn_ms_p95']:8.1f} ms, "
        f"{result.conflicts} conflicts, lost {check.lost}, duplicated {check.duplicated}, "
        f"ok {check.ok}",
        file=sys.stderr,
    )
    return Run(store, result)


def run_store(
    store: str, make_url: NewStore, shapes: list[tuple[int, int]], turns: int, model_ms: float
) -> list[Run]:
    """One run per (workers, sessions), then one with a kill (4 workers on 4 sessions),
    then :data:`ACCEPTANCE_SHAPES` with ``model_ms`` per model call (when not 0) and with
    sticky routing (and 16 workers on 16 sessions, sticky); each on a fresh store."""
    plan = [(shape, False, Variant()) for shape in shapes] + [((4, 4), True, Variant())]
    if model_ms:
        plan += [(shape, False, Variant(model_ms=model_ms)) for shape in ACCEPTANCE_SHAPES]
    # sticky, 16 on 16: no session shared, the cost of 16 processes on the machine alone
    plan += [(shape, False, Variant("sticky")) for shape in [*ACCEPTANCE_SHAPES, (16, 16)]]
    runs = []
    for (workers, sessions), kill, variant in plan:
        url, cleanup = make_url()
        try:
            runs.append(one_run(store, url, workers, turns, sessions, kill, variant))
        finally:
            cleanup()
    return runs


def acceptance(runs: list[Run]) -> list[str]:
    """For each store and variant: 16 workers on 4 sessions against 4 on 4, turns/s."""
    lines = []
    found: dict[tuple[str, Variant], dict[tuple[int, int], float]] = {}
    for run in runs:
        r = run.result
        if r.kills:
            continue
        variant = Variant(r.config.routing, r.config.model_ms)
        shape = (r.config.workers, r.config.sessions)
        found.setdefault((run.store, variant), {})[shape] = r.turns_per_s
    for (store, variant), rates in found.items():
        if (4, 4) in rates and (16, 4) in rates:
            many, few = rates[(16, 4)], rates[(4, 4)]
            lines.append(
                f"- {store}, {describe(variant)}: 16 workers on 4 sessions {many:,.1f} turns/s, "
                f"4 on 4 {few:,.1f} turns/s: {many / few:.2f}x (target ≥ 1: "
                f"{'met' if many >= few else '**not met**'})."
            )
    return lines


def describe(variant: Variant) -> str:
    routing = "turns round the sessions" if variant.routing == "round" else "sticky routing"
    model = f", model calls of {variant.model_ms:g} ms" if variant.model_ms else ", no model time"
    return routing + model


def shapes_of(workers: list[int], sessions: list[str]) -> list[tuple[int, int]]:
    """The (workers, sessions) pairs to run, without repeats; ``w`` is the worker count."""
    pairs = [(n, n if s == "w" else int(s)) for n in workers for s in sessions]
    return list(dict.fromkeys(pairs))


def report(
    runs: list[Run],
    command: str,
    wall: float,
    load: tuple[float, float, float],
    pg: str | None,
    pg_note: str,
    turns: int,
) -> str:
    versions = f"SQLite {sqlite3.sqlite_version}"
    if pg:
        psycopg_version = importlib.metadata.version("psycopg")
        versions += f", PostgreSQL {pg} on 127.0.0.1, psycopg {psycopg_version}"
    lines = [
        "## Worker processes on shared sessions",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, total wall time {wall:,.0f} s  ",
        f"Machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {versions}, SQLiteStore defaults (WAL, "
        'synchronous="NORMAL"); '
        f"load average {load[0]:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end (a shared machine: other work on it shows up "
        "as noise)",
        "",
        "Setup: the load harness `ce.core.testing.load` (`python -m ce.core.testing.load`). "
        f"N worker processes (spawn), each with its own `ContextEngine` "
        "(`RuntimeConfig(model_hint='gpt-4o')`, tiktoken, redaction on) on the store URL, start "
        f"together and run {turns} turns each over S shared sessions (turn t of worker w on "
        "session (w + t) mod S, so N / S workers write each session at once). A turn is what "
        "a plugin records for "
        "one question with one tool round, six engine calls, each its own commit: "
        "`prepare_turn` (new user message), `record_model_call` (the reply with a tool "
        "call, its usage), `ingest_evidence` (the tool's output), `record_tool_call`, "
        "`prepare_call` (the tool message), `record_model_call` (the answer, its "
        "`llm_output` evidence, its usage). In the rows with a model time of 0 ms no model "
        "runs, so those figures are the engine's and the store's cost alone; the others "
        "await that long for each of the turn's two model calls (before its "
        "`record_model_call`). Rows routed `round` send each worker's turns round the "
        "sessions as above; `sticky` rows keep worker w on session w mod S. Each worker "
        "logs every acknowledged call (one JSON line, written to the operating system, not "
        "fsync'd: a SIGKILL does not lose it). Turns/s is all workers' completed turns over "
        "the wall time from the start barrier to the last worker's exit; latency is one "
        "turn's wall time in its worker; worker CPU per turn is the CPU time of all "
        "workers (every thread) from the start barrier to their last turn, over the turns. "
        "On SQLite the engine holds the "
        "session for every write, from its catch-up read to its commit, with the store's "
        "per-session lock (a byte of the lock file beside the database: writers of the "
        "session queue for it in the kernel, writers of other sessions go on, and the "
        "file's write lock is taken for the commit alone), so no commit is ever refused. On "
        "PostgreSQL the engine commits optimistically; a version conflict is counted each "
        "time such a commit was refused because another process wrote the session since "
        "this engine read it; the engine then reads the session afresh and does the call "
        "once more holding the session row's lock from the catch-up read to the commit, a "
        "commit no other writer can get ahead of, and holds the session for its next writes "
        "to it while they keep meeting other writers'. Had the engine raised "
        "`VersionConflictError` anyway, the worker would count it (in parentheses) and retry "
        "at once. A full load is the engine reading a whole session (its first use, and "
        "after every conflict); otherwise a stale cached session catches up with only the "
        "new records. Afterwards the checker reads every session back and compares it with the "
        "logs: lost = acknowledged records missing, duplicated = records stored twice; it "
        "also checks that every tool message answers exactly one call and that a fresh "
        "engine's `prepare_turn` keeps tool pairs intact.",
        "",
        "| store | workers | sessions | routing, model time | turns | wall (s) | turns/s "
        "| engine calls/s "
        "| turn p50 (ms) | turn p95 (ms) | worker CPU per turn (ms) "
        "| version conflicts (raised to the worker) "
        "| conflicts per turn | full session loads | lost | duplicated | check |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    kill_lines = []
    for run in runs:
        r, c = run.result, run.result.check
        calls = c.operations_acknowledged / r.wall_s if r.wall_s else 0.0
        verdict = "pass" if c.ok else "FAIL: " + "; ".join(c.problems)
        row = (
            f"| {run.store} | {r.config.workers} | {r.config.sessions} "
            f"| {r.config.routing}, {r.config.model_ms:g} ms | {r.turns:,} "
            f"| {r.wall_s:,.1f} | {r.turns_per_s:,.1f} | {calls:,.0f} | {r.turn_ms(50):,.0f} "
            f"| {r.turn_ms(95):,.0f} | {r.cpu_ms_per_turn:,.1f} "
            f"| {r.conflicts:,} ({r.retries:,}) "
            f"| {r.conflicts / max(1, r.turns):.1f} | {r.reloads:,} "
            f"| {c.lost} | {c.duplicated} | {verdict} |"
        )
        if r.kills:
            kill_lines.append((run, r.kills[0]))
        else:
            lines.append(row)
    lines += [
        "",
        "Acceptance, 16 workers on 4 sessions against 4 workers on 4 sessions, same store, "
        "same run:",
        "",
        *acceptance(runs),
        "",
        "Reading the figures: one worker measures the cost of a turn itself; SQLite does not "
        'flush each commit to disk (`synchronous="NORMAL"`) while PostgreSQL with '
        "`synchronous_commit=on` waits for its WAL flush on every commit, and answers over a "
        "socket, hence the gap per engine call. With no model time the workers do nothing but "
        "engine and store work, so with 2 CPUs the figures are bound by CPU time per turn, "
        "and three things raise it with more workers: (1) turns round the sessions make each "
        "worker's turn follow about N - 1 turns of other workers on its session since its own "
        "last one, whose records it reads and indexes before its call (about 11 rows a "
        "turn), and with N / S workers on a session each of its six calls follows the others' "
        "calls; (2) every worker reads each session whole the first time it serves it; (3) 16 "
        "processes on 2 CPUs cost more CPU per turn than 4 even when they share nothing "
        "(caches, scheduling): compare the sticky rows of 4 workers on 4 sessions and 16 on "
        "16, where no worker ever reads another's records. No commit waits for another "
        "session's work and none is refused on SQLite; on PostgreSQL each conflict adds a "
        "refused commit, a full load of the session and the call done again. With the "
        "model's time the workers spend most of a turn waiting for the model, as an app's "
        "do, and the engine holds a session only during its own calls, never during a model "
        "call: more workers then serve more turns. Sticky routing (a conversation kept on "
        "one worker, which a load balancer's session affinity gives) removes most of the "
        "catch-up. Correctness does not depend on any of it"
        + (
            " (lost and duplicated are 0 in every run)."
            if all(run.result.check.ok for run in runs)
            else " (but see the failed checks above)."
        ),
    ]
    if pg_note:
        lines += ["", pg_note]
    if kill_lines:
        lines += [
            "",
            "Crash mid-turn: 4 workers on 4 sessions; worker 0 stops in its middle turn once its "
            "`record_tool_call` is committed, before the call returns (so before it is "
            "logged), and the parent SIGKILLs it; the others finish.",
            "",
            "| store | killed in | stored of that call | its tool call left without a result "
            "| turns completed by the others | lost | duplicated | unacknowledged | partial "
            "calls | orphan tool results | fresh `prepare_turn` pairs intact | check |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for run, kill in kill_lines:
            c = run.result.check
            lines.append(
                f"| {run.store} | turn {kill.turn}, `{kill.in_flight}` | {kill.in_flight_stored} "
                f"| {'yes' if kill.unanswered_call else 'no'} "
                f"| {sum(w.turns_done for w in run.result.workers if not w.killed):,} | {c.lost} "
                f"| {c.duplicated} | {c.unacknowledged} | {c.partial_operations} "
                f"| {c.orphan_tool_results} | {'yes' if not c.pair_failures else 'no'} "
                f"| {'pass' if c.ok else 'FAIL'} |"
            )
        lines += [
            "",
            "Each engine call is one atomic commit, so the killed call is stored wholly or "
            "not at all; a turn is several calls, so a kill between them leaves the turn's "
            "earlier calls stored: here the assistant's tool call and its `tool_call` record "
            "without the tool message. The engine treats such a call as unanswered and leaves "
            "it out of every assembled input (the checker's fresh `prepare_turn` shows the "
            "pairs intact).",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,4,16", help="comma-separated worker counts")
    parser.add_argument("--turns", type=int, default=20, help="turns per worker")
    parser.add_argument(
        "--sessions", default="1,4,16", help="comma-separated session counts; w: one per worker"
    )
    parser.add_argument(
        "--model-ms", type=float, default=50.0, help="model time per call in the extra runs"
    )
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="server to use")
    parser.add_argument("--skip-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    shapes = shapes_of([int(n) for n in args.workers.split(",")], args.sessions.split(","))
    started, load = time.perf_counter(), os.getloadavg()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:

        def sqlite_url() -> tuple[str, Callable[[], None]]:
            path = Path(tmp) / f"{secrets.token_hex(4)}.db"
            return f"sqlite:///{path}", lambda: None

        runs += run_store("SQLite", sqlite_url, shapes, args.turns, args.model_ms)
    pg = None if args.skip_postgres else postgres_version(args.postgres)
    pg_note = ""
    if pg is None:
        pg_note = "PostgreSQL: not run " + (
            "(--skip-postgres)." if args.skip_postgres else f"(no server at {args.postgres})."
        )
    else:

        def postgres_url() -> tuple[str, Callable[[], None]]:
            schema = f"bench_workers_{secrets.token_hex(4)}"
            return (
                schema_url(args.postgres, schema),
                lambda: drop_schema(args.postgres, schema),
            )

        runs += run_store("PostgreSQL", postgres_url, shapes, args.turns, args.model_ms)
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    section = report(
        runs,
        command,
        time.perf_counter() - started,
        load,
        pg,
        pg_note,
        args.turns,
    )
    print(section)
    if args.write:
        write_section(args.write, "workers", section)
        print(f"wrote {args.write}", file=sys.stderr)
    if not all(run.result.check.ok for run in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
