"""What a call that goes back costs (a regenerate, an edit), against one that continues.

A chat app passes its whole conversation to ``prepare_call(..., rewind=True)`` on every call,
as the plugins do. The session holds N messages (user questions and answers of about 60
tokens each, and a system message, recorded as a plugin records a conversation it meets: a
``prepare_call`` with it, then the reply) in an SQLite file. Timed, in one process, each run
on a file of its own: the **writer** (the engine that wrote the session, then made a call
before, a question and its reply) and a **warm** engine (one that made that call before on
a copy of the stored session) making a call that continues (one new question), a regenerate
(the conversation without its last answer) and an edit (its last question replaced); and a
**cold** engine (a new process or worker: the session not read yet) making the same calls.
Median of ``--repeat`` runs (each after ``gc.collect()``), ms. Run::

    python benchmarks/bench_going_back.py [--sizes 50,2000,8000] [--repeat 5]
                                          [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from _report import package_version, section_head, write_section  # noqa: E402

from ce.core.config import BudgetConfig, RuntimeConfig  # noqa: E402
from ce.core.engine import ContextEngine  # noqa: E402
from ce.core.schema import Message, Role  # noqa: E402
from ce.core.stores import SQLiteStore  # noqa: E402

CONFIG = RuntimeConfig(
    model_hint="gpt-4o",
    budget=BudgetConfig(max_input_tokens=8000 + 1024, reserved_reply_tokens=1024),
)
SYSTEM = Message(role=Role.SYSTEM, content="You answer briefly.")
PAD = "the quick brown fox jumps over the lazy dog; " * 5
CALLS: dict[str, Callable[[list[Message]], list[Message]]] = {
    "continues": lambda h: [*h, Message(role=Role.USER, content="One more question?")],
    "regenerate": lambda h: h[:-1],
    "edit": lambda h: [*h[:-2], Message(role=Role.USER, content="The question, edited?")],
}


def conversation(size: int) -> list[Message]:
    out: list[Message] = []
    for i in range(size // 2):
        out.append(Message(role=Role.USER, content=f"question {i}: {PAD}"))
        out.append(Message(role=Role.ASSISTANT, content=f"answer {i}: {PAD}"))
    return out


def turn(engine: ContextEngine, history: list[Message], question: str, answer: str) -> None:
    """One call as a plugin records it: the conversation and a question, then the reply."""
    history.append(Message(role=Role.USER, content=question))
    engine.sync.prepare_call("s", [SYSTEM, *history], rewind=True)
    history.append(Message(role=Role.ASSISTANT, content=answer))
    engine.sync.commit_assistant_message("s", history[-1])


MODES = ("writer", "warm", "cold")


def populate(engine: ContextEngine, history: list[Message]) -> None:
    """The conversation as a plugin meets it: a call with it, its last answer the reply."""
    turn(engine, list(history[:-2]), history[-2].content, history[-1].content)


def timed(path: Path, history: list[Message], call: str, mode: str) -> float:
    engine = ContextEngine(SQLiteStore(str(path)), config=CONFIG)
    history = list(history)
    try:
        if mode == "writer":  # the engine wrote the session: it holds all of it
            populate(engine, history)
        if mode != "cold":  # a call before
            turn(engine, history, "A question before?", "An answer before.")
        pending = [SYSTEM, *CALLS[call](history)]
        gc.collect()  # what the runs before left is not collected in this one's time
        start = time.perf_counter()
        engine.sync.prepare_call("s", pending, rewind=True)
        return time.perf_counter() - start
    finally:
        engine.sync.close()


def measure(size: int, repeat: int, directory: Path) -> dict[tuple[str, str], float]:
    original = directory / f"s{size}.db"
    history = conversation(size)
    engine = ContextEngine(SQLiteStore(str(original)), config=CONFIG)
    populate(engine, history)
    engine.sync.close()
    with sqlite3.connect(original) as db:  # all of it in the file each run copies
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    results: dict[tuple[str, str], float] = {}
    for mode in MODES:
        for call in CALLS:
            times = []
            for n in range(repeat):
                path = directory / f"s{size}-{call}-{mode}-{n}.db"
                if mode != "writer":  # the writer writes a file of its own
                    shutil.copy(original, path)
                times.append(timed(path, history, call, mode))
            results[(call, mode)] = statistics.median(times) * 1000
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,2000,8000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    command = "python benchmarks/bench_going_back.py"
    if args.sizes != "50,2000,8000":
        command += f" --sizes {args.sizes}"
    if args.repeat != 5:
        command += f" --repeat {args.repeat}"
    if args.write:
        command += f" --write {args.write}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            r = measure(size, args.repeat, Path(tmp))
            cells = " | ".join(f"{r[(c, m)]:.1f}" for m in MODES for c in CALLS)
            rows.append(f"| {size:,} | {cells} |")
            print(rows[-1], flush=True)
    lines = [
        "## Going back: a regenerate or an edit against a call that continues",
        "",
        *section_head(command, f"ce-core {package_version('ce-core')}"),
        "",
        "`prepare_call(session, [system, *conversation], rewind=True)` on a session of N "
        "stored messages (questions and answers of about 60 tokens and the system message, "
        "SQLite file, `gpt-4o`, "
        "8,000-token budget): the conversation with one new question (continues), without "
        "its last answer (regenerate), with its last question replaced (edit). Writer: the "
        "engine that wrote the session (it holds all of it) made the call before, a question "
        "and its reply; warm: an engine that made that call on the stored session (it holds "
        "the session's newest records); cold: a new engine (another "
        f"worker). Median of {args.repeat} runs, each on a fresh copy of the file after "
        "`gc.collect()`, ms.",
        "",
        "| N messages "
        + "".join(f"| {m}: {c} " for m in MODES for c in ("continues", "regenerate", "edit"))
        + "|",
        "| ---: " + "| ---: " * 3 * len(MODES) + "|",
        *rows,
        "",
        "A call that goes back takes the turns after its point back (see "
        "docs/concepts/budget.md) and rebuilds what the engine derived from the records it "
        "holds (the index of their blocks, the lookup of their messages): a worker that read "
        "the session's newest records goes back on them, and reads the whole session only "
        "when the documents retrieved for the withdrawn turns reach past them; the writer, "
        "holding all of a session of over 1,024 messages, reads its newest records afresh "
        "(at 2,000 and 8,000 messages here) rather than rebuild over every message.",
    ]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_section(args.write, "going-back", section)


if __name__ == "__main__":
    main()
