"""Where the time of one LangChain model call with the plugin goes, by part of the code.

The calls of ``bench_langchain.py`` (5 sessions holding the 50-message history, 30 calls to
warm up, then ``--calls`` more, ``invoke``, or ``ainvoke`` on one event loop with
``--ainvoke``, the plugin installed once) with a timer around each of the functions in
``PARTS``: the share of the calls' wall time spent inside each, and its time per call. A part
nested in another is counted in both (``›`` marks a part of the row above it). The timers
cost a little of their own, so the total is a bit above the benchmark's; the shares are what
to read. A function that was renamed or moved fails the script: update ``PARTS``.

    python benchmarks/breakdown_call.py [--calls 300] [--ainvoke]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import inspect
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import _report  # noqa: E402, F401  (tiktoken: the offline encodings)

SESSIONS = 5
WARM_CALLS = 30

# (module, attribute path, what it is); a function is timed where its callers look it up
PARTS: list[tuple[str, str, str]] = [
    ("ce.core.engine._engine", "ContextEngine.prepare_call", "prepare_call"),
    ("ce.core.engine._prepare", "Preparer._prepare", "prepare_call › select and assemble"),
    ("ce.core.pipeline._prune", "GreedyPriorityPruner.prune", "› › prune"),
    ("ce.core.pipeline._index", "SessionIndex._render_group", "› › › render a message group"),
    ("ce.core.engine._writes", "HistoryWriter._record_pending", "prepare_call › new messages"),
    ("ce.core.engine._core", "EngineCore._persist_or_carry", "prepare_call › carry to commit"),
    ("ce.core.engine._engine", "ContextEngine.record_model_call", "record_model_call"),
    ("ce.core.engine._core", "EngineCore._write_reply", "record_model_call › the reply"),
    ("ce.core.engine._core", "EngineCore._add_evidence", "record_model_call › output evidence"),
    ("ce.core.engine._core", "EngineCore._persist", "record_model_call › commit"),
    ("ce.core.stores.base", "BaseStore._checked", "› › records to JSON"),
    ("ce.core.stores._sqlite_write", "apply", "› › SQL statements"),
    ("ce.core.engine._core", "EngineCore._entry", "engine: catch up with the store (both calls)"),
    ("ce.core.integration._history", "HistoryMemo.convert", "plugin: app messages in"),
    ("ce.core.integration._inject", "assembled_to_openai", "plugin: assembled input out"),
    ("ce.langchain._inject", "reconcile", "plugin: onto the app's messages"),
    ("ce.core.integration._history", "History.unchanged", "› changed in place?"),
    ("ce.langchain._record", "RecordingHandler.on_chat_model_start", "plugin: run start"),
    ("tiktoken.core", "Encoding.encode_ordinary", "tokenizer (within the above)"),
    ("ce.core.redaction", "RegexRedactor.redact_text", "redaction (within the above)"),
]


def _timed(totals: Counter[str], label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await function(*args, **kwargs)
            finally:
                totals[label] += time.perf_counter() - start

        return timed_async

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - start

    return timed


def instrument(totals: Counter[str]) -> None:
    """Put a timer around every function of ``PARTS``."""
    for module_name, path, label in PARTS:
        owner: Any = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for attribute in outer:
            owner = getattr(owner, attribute)
        if name not in vars(owner):
            raise SystemExit(f"{module_name}.{path} is not defined there: update PARTS")
        setattr(owner, name, _timed(totals, label, getattr(owner, name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls timed")
    parser.add_argument("--ainvoke", action="store_true", help="time ainvoke, not invoke")
    args = parser.parse_args()
    totals: Counter[str] = Counter()
    instrument(totals)

    import bench_langchain
    import history

    import ce.langchain

    with tempfile.TemporaryDirectory() as tmp:
        bench = bench_langchain.Bench(Path(tmp), args.calls, SESSIONS)
        turns = history.next_turns(args.calls + WARM_CALLS + SESSIONS)
        bench.questions = iter([question for question, _ in turns])
        bench.populate()
        bench.installed = True
        ce.langchain.install(bench.engine)
        if args.ainvoke:

            async def calls() -> float:
                for _ in range(WARM_CALLS):
                    await bench.time_async()
                totals.clear()
                start = time.perf_counter()
                for _ in range(args.calls):
                    await bench.time_async()
                await bench.engine.flush()  # the last calls' records, queued on the loop
                return time.perf_counter() - start

            total = asyncio.run(calls())
        else:
            for _ in range(WARM_CALLS):
                bench.time_sync()
            totals.clear()
            start = time.perf_counter()
            for _ in range(args.calls):
                bench.time_sync()
            total = time.perf_counter() - start
        ce.langchain.uninstall()
    call = "ainvoke" if args.ainvoke else "invoke"
    print(f"{args.calls} `{call}` calls, {total / args.calls * 1e3:.3f} ms per call\n")
    print("| part | share of the calls' time | per call (µs) |")
    print("| --- | ---: | ---: |")
    for _, _, label in PARTS:
        spent = totals[label]
        print(f"| {label} | {spent / total:.1%} | {spent / args.calls * 1e6:.0f} |")


if __name__ == "__main__":
    main()
