"""What a call that goes back costs (a regenerate, an edit), against one that continues.

A chat app passes its whole conversation to ``prepare_call(..., rewind=True)`` on every call,
as the plugins do. The session holds N messages (user questions and answers of about 60
tokens each, and a system message, recorded as a plugin records a conversation it meets: a
``prepare_call`` with it, then the reply) in an SQLite file. Timed, each on a copy of
the file of its own, in one process: a **warm** engine (the session cached by its call
before, a question and its reply) making a call that continues (one new question), a
regenerate (the conversation without its last answer) and an edit (its last question
replaced); and a **cold** engine (a
new process or worker: the session not read yet) making the same calls. Median of ``--repeat``
runs (each on a fresh copy, after ``gc.collect()``), ms. Run::

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


def timed(path: Path, history: list[Message], call: str, warm: bool) -> float:
    engine = ContextEngine(SQLiteStore(str(path)), config=CONFIG)
    history = list(history)
    try:
        if warm:  # a call before: this engine holds the session (its newest records)
            turn(engine, history, "A question before?", "An answer before.")
        pending = [SYSTEM, *CALLS[call](history)]
        gc.collect()  # what the runs before left is not collected in this one's time
        start = time.perf_counter()
        engine.sync.prepare_call("s", pending, rewind=True)
        return time.perf_counter() - start
    finally:
        engine.sync.close()


def measure(size: int, repeat: int, directory: Path) -> dict[tuple[str, bool], float]:
    original = directory / f"s{size}.db"
    history = conversation(size)
    engine = ContextEngine(SQLiteStore(str(original)), config=CONFIG)
    last = history.pop()  # the conversation met by a plugin, its last answer the reply
    turn(engine, history[:-1], history[-1].content, last.content)
    history.append(last)
    engine.sync.close()
    with sqlite3.connect(original) as db:  # all of it in the file each run copies
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    results: dict[tuple[str, bool], float] = {}
    for warm in (True, False):
        for call in CALLS:
            times = []
            for n in range(repeat):
                copy = directory / f"s{size}-{call}-{warm}-{n}.db"
                shutil.copy(original, copy)
                times.append(timed(copy, history, call, warm))
            results[(call, warm)] = statistics.median(times) * 1000
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
            cells = " | ".join(f"{r[(c, w)]:.1f}" for w in (True, False) for c in CALLS)
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
        "its last answer (regenerate), with its last question replaced (edit). Warm: the "
        "engine made the call before it, a question and its reply (it holds the session's "
        "newest records); cold: a new engine (another "
        f"worker). Median of {args.repeat} runs, each on a fresh copy of the file after "
        "`gc.collect()`, ms.",
        "",
        "| N messages | warm: continues | warm: regenerate | warm: edit "
        "| cold: continues | cold: regenerate | cold: edit |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "A call that goes back takes the turns after its point back (see "
        "docs/concepts/budget.md) and rebuilds what the engine derived from the records it "
        "holds (the index of their blocks, the lookup of their messages): a worker that read "
        "the session's newest records goes back on them, and reads the whole session only "
        "when the documents retrieved for the withdrawn turns reach past them.",
    ]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_section(args.write, "going-back", section)


if __name__ == "__main__":
    main()
