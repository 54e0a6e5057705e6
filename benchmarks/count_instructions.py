"""Machine instructions per model call with the LangChain (or LlamaIndex) plugin, counted by
callgrind.

Wall-clock figures on a shared 2-CPU machine move by 20-40 % from one run to the next, more
than a change to the per-call path does. An instruction count moves much less (two runs of
one version mostly within 1 %, though a run now and then counts 10-20 % more, most likely where
the store's background checkpoints and the collector's passes fall; repeat a count
that surprises). This script runs the
call of ``bench_langchain.py`` (5 sessions holding the 50-message history, 30 calls to warm
up, then ``--calls`` more, ``invoke``, or ``ainvoke`` on one event loop with ``--ainvoke``,
with ``ce.langchain.install(engine)``; with ``--llamaindex`` the call of
``bench_llamaindex.py``, ``chat`` or ``achat``, with ``ce.llamaindex.install(engine)``) under
``valgrind --tool=callgrind`` once with no timed calls and once with them; the difference
divided by the calls is what one call costs (the interpreter, SQLite, pydantic, tiktoken and
the engine together; startup and the warm-up cancel out; after the warm-up the heap is
collected and frozen, see :func:`settle_heap`). Needs valgrind on ``PATH``.

    python benchmarks/count_instructions.py [--calls 100] [--ainvoke] [--llamaindex]

``--run N`` is the inner run under valgrind (not for direct use).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import _report  # noqa: E402, F401  (tiktoken: the offline encodings)

SESSIONS = 5
WARM_CALLS = 30
QUESTIONS = 400  # made in every run alike (their making is not a call's cost)


def settle_heap() -> None:
    """Collect, then freeze what survives: a later full collection walks only what the
    counted calls added. Otherwise whether one falls among the counted calls (walking every
    object of the process: 1-2 million instructions a call over 100 calls) depends on what
    the process allocated before, and moves the count more than a change of the call does."""
    gc.collect()
    gc.freeze()


def run(calls: int, awaited: bool, framework: str) -> None:
    """The measured process: build the bench of ``framework`` (``langchain`` or
    ``llamaindex``), warm up, make ``calls`` calls (the async ones when ``awaited``), exit
    at once."""
    import asyncio
    import importlib

    import history

    bench_module = importlib.import_module(f"bench_{framework}")
    plugin = importlib.import_module(f"ce.{framework}")

    with tempfile.TemporaryDirectory() as tmp:
        bench = bench_module.Bench(Path(tmp), calls, SESSIONS)
        bench.questions = iter([q for q, _ in history.next_turns(QUESTIONS)])
        bench.populate()
        bench.installed = True
        plugin.install(bench.engine)
        if awaited:

            async def calls_awaited() -> None:
                for _ in range(WARM_CALLS):
                    await bench.time_async()
                settle_heap()
                for _ in range(calls):
                    await bench.time_async()

            asyncio.run(calls_awaited())
        else:
            for _ in range(WARM_CALLS):
                bench.time_sync()
            settle_heap()
            for _ in range(calls):
                bench.time_sync()
        sys.stdout.flush()
        os._exit(0)  # no teardown in the count


def instructions(calls: int, awaited: bool, framework: str) -> int:
    """Instructions callgrind counts for a process making ``calls`` timed calls."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/callgrind.out",
                sys.executable,
                str(HERE),
                "--run",
                str(calls),
                *(["--ainvoke"] if awaited else []),
                *(["--llamaindex"] if framework == "llamaindex" else []),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in callgrind's output:\n{out.stderr}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="calls counted")
    parser.add_argument(
        "--ainvoke", action="store_true", help="count the async call (ainvoke, achat)"
    )
    parser.add_argument(
        "--llamaindex", action="store_true", help="count LlamaIndex's chat, not LangChain's"
    )
    parser.add_argument("--run", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.calls <= QUESTIONS - SESSIONS - WARM_CALLS:
        parser.error(f"--calls must be between 1 and {QUESTIONS - SESSIONS - WARM_CALLS}")
    framework = "llamaindex" if args.llamaindex else "langchain"
    if args.run is not None:
        run(args.run, args.ainvoke, framework)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    # once without valgrind: every module compiled and cached, so that neither counted
    # process compiles what the other one reads from its cache
    subprocess.run(
        [
            sys.executable,
            str(HERE),
            "--run",
            "0",
            *(["--ainvoke"] if args.ainvoke else []),
            *(["--llamaindex"] if args.llamaindex else []),
        ],
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    base = instructions(0, args.ainvoke, framework)
    total = instructions(args.calls, args.ainvoke, framework)
    per_call = (total - base) / args.calls
    names = {"langchain": ("invoke", "ainvoke"), "llamaindex": ("chat", "achat")}
    call = names[framework][args.ainvoke]
    print(f"{per_call / 1e6:.2f} million instructions per {call} call ({args.calls} calls)")


if __name__ == "__main__":
    main()
