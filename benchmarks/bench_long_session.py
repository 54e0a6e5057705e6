"""What a turn costs as one session grows: the engine's calls of a turn, early and late.

One process, one ``ContextEngine`` (``gpt-4o`` tokenizer, budget 8,000 input tokens) on an
``SQLiteStore`` file, one session per shape:

- ``tool``: what a plugin records for a question with one tool round (the turn of
  ``ce.core.testing.load``): ``prepare_turn`` (the question), ``record_model_call`` (the reply
  with a tool call), ``ingest_evidence`` (the tool's output), ``record_tool_call``,
  ``prepare_call`` (question, call, result), ``record_model_call`` (the answer). Every turn
  adds four messages, two evidences (the tool result and the answer's ``llm_output``), a tool
  run and two usage records.
- ``rag``: a chat with retrieval under a long system instruction (60 rules, 5,800
  characters): two retrieved documents (``ingest_evidence``), ``prepare_turn`` (a short
  question), ``commit_assistant_message`` (a short answer). The kept conversation is a
  window of hundreds of short messages, and the system message changes with the documents on
  every turn.

The median of each call over windows of 100 turns early and late in the session says whether
a turn's cost follows what is new (flat) or the history (growing). Not a test: numbers depend
on the machine.

    python benchmarks/bench_long_session.py [--turns 2000] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from _report import package_version, section_head, write_section  # noqa: E402

from ce.core import BudgetConfig, ContextEngine, RuntimeConfig  # noqa: E402
from ce.core.schema import EvidenceSource, EvidenceType, Message, Role, SourceKind  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402
from ce.core.testing.load import STEPS, turn_steps  # noqa: E402

BUDGET = 8_000
REPLY_TOKENS = 1_024
WINDOW = 100
TOOL_STEPS = (  # the names of the reported columns, for the calls of STEPS
    "prepare_turn",
    "record_model_call (tool call)",
    "ingest_evidence",
    "record_tool_call",
    "prepare_call",
    "record_model_call (answer)",
)
RAG_STEPS = ("ingest_evidence ×2", "prepare_turn", "commit_assistant_message")
RULES = "\n\n".join(
    f"Rule {i}: when the customer asks about topic {i}, answer briefly, cite the policy and"
    " offer more help."
    for i in range(60)
)

Step = Callable[[], Awaitable[Any]]


def tool_steps(engine: ContextEngine, session_id: str, turn: int) -> list[Step]:
    """The six engine calls of tool turn ``turn``, in order (the load harness's turn)."""
    steps = turn_steps(engine, session_id, f"t{turn}")
    return [steps[name] for name in STEPS]


def rag_steps(engine: ContextEngine, session_id: str, turn: int) -> list[Step]:
    """The engine calls of retrieval turn ``turn``, in order."""
    source = EvidenceSource(kind=SourceKind.RAG, uri="kb://policies")

    async def retrieve() -> None:
        for n in (2 * turn, 2 * turn + 1):
            text = f"Policy {n}: refunds within {n % 60 + 1} days of delivery. " * 3
            await engine.ingest_evidence(session_id, text, source, EvidenceType.RAG_DOC)

    async def ask() -> Any:
        if turn == 0:
            await engine.set_system_instruction(session_id, RULES)
        question = Message(role=Role.USER, content=f"Question {turn}: can I still get a refund?")
        return await engine.prepare_turn(session_id, question)

    answer = Message(role=Role.ASSISTANT, content=f"Answer {turn}: yes, within the window.")
    return [retrieve, ask, lambda: engine.commit_assistant_message(session_id, answer)]


SHAPES: dict[str, tuple[tuple[str, ...], Callable[[ContextEngine, str, int], list[Step]], int]] = {
    # steps, the turn's engine calls, messages a turn adds
    "tool": (TOOL_STEPS, tool_steps, 4),
    "rag": (RAG_STEPS, rag_steps, 2),
}


async def measure(path: Path, turns: int, shape: str) -> list[list[float]]:
    """Seconds of each step of every turn of ``shape``."""
    config = RuntimeConfig(
        model_hint="gpt-4o",
        budget=BudgetConfig(
            max_input_tokens=BUDGET + REPLY_TOKENS, reserved_reply_tokens=REPLY_TOKENS
        ),
    )
    engine = ContextEngine(store=SQLiteStore(str(path)), config=config)
    steps = SHAPES[shape][1]
    out: list[list[float]] = []
    try:
        for turn in range(turns):
            times = []
            for step in steps(engine, shape, turn):
                start = time.perf_counter()
                await step()
                times.append(time.perf_counter() - start)
            out.append(times)
    finally:
        await engine.close()
    return out


def windows(turns: int) -> list[int]:
    """The first turn of each window of ``WINDOW`` turns reported."""
    starts = [WINDOW // 5, turns // 4, turns // 2, turns - WINDOW]
    return sorted({s for s in starts if 0 <= s <= turns - WINDOW})


def table(shape: str, times: list[list[float]], turns: int) -> list[str]:
    steps, _, added = SHAPES[shape]
    rows = []
    for first in windows(turns):
        block = times[first : first + WINDOW]
        medians = [statistics.median(t[i] for t in block) * 1e3 for i in range(len(steps))]
        cells = " | ".join(f"{m:.2f}" for m in medians)
        total = sum(medians)
        window = f"{first + 1:,}-{first + WINDOW:,}"
        rows.append(f"| {window} | {added * first:,} | {cells} | **{total:.2f}** |")
    header = " | ".join(f"`{s}`" for s in steps)
    return [
        f"| `{shape}` turns | messages before | {header} | total |",
        "| --- | ---: | " + " | ".join("---:" for _ in steps) + " | ---: |",
        *rows,
    ]


def report(results: dict[str, list[list[float]]], command: str, turns: int) -> str:
    versions = ", ".join(f"{n} {package_version(n)}" for n in ("ce-core", "tiktoken", "pydantic"))
    tables: list[str] = []
    for shape, times in results.items():
        tables.extend([*table(shape, times, turns), ""])
    return (
        "\n".join(
            [
                "## A turn's engine calls as one session grows",
                "",
                *section_head(command, versions),
                "",
                "One engine (`gpt-4o` tokenizer, budget"
                f" {BUDGET:,} input tokens, SQLite file), one session per shape, {turns:,} turns."
                " `tool`: what a plugin records for a question with one tool round (the turn of"
                " `ce.core.testing.load`), six engine calls; a turn adds four messages, two"
                " evidences, a tool run and two usage records. `rag`: a chat with retrieval under"
                " a 5,800-character system instruction (60 rules): two retrieved documents, the"
                " question's `prepare_turn` and the answer; a turn adds two short messages and two"
                " evidences, so the kept conversation is a window of hundreds of messages and the"
                " system message changes with the documents every turn. Medians of each call (ms)"
                f" over windows of {WINDOW} turns; the messages column is what the session held"
                " before the window. A flat row-to-row total means a turn costs what is new, not"
                " the history.",
                "",
                *tables,
            ]
        ).rstrip("\n")
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2_000, help="turns of the session")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    if args.turns < 2 * WINDOW:
        parser.error(f"--turns must be at least {2 * WINDOW}")
    command = "python benchmarks/bench_long_session.py"
    if args.turns != 2_000:
        command += f" --turns {args.turns}"
    if args.write:
        command += f" --write {args.write}"
    results: dict[str, list[list[float]]] = {}
    for shape in SHAPES:
        with tempfile.TemporaryDirectory() as tmp:
            results[shape] = asyncio.run(measure(Path(tmp) / "sessions.db", args.turns, shape))
    section = report(results, command, args.turns)
    print(section)
    if args.write:
        write_section(args.write, "long-session", section)


if __name__ == "__main__":
    main()
