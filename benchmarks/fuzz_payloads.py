"""Payload fuzz: random histories x budgets through the engine; every assembled input is
checked against the OpenAI chat, Anthropic Messages and Gemini contents conventions
(``ce.core.testing.payloads``) and against its budget. Not part of CI's default sessions (the
property test in tests/core/test_payloads.py is); run it with any virtualenv holding ce-core:

    python benchmarks/fuzz_payloads.py [--histories 10000] [--budgets 10] [--workers 2]
        [--images 0.5] [--write docs/benchmarks.md]

``--images SHARE``: that share of the questions carries one to three pictures of random
sizes (counted by OpenAI's image rule for gpt-4o).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from _report import cpu_model, write_section  # noqa: E402

from ce.core import (  # noqa: E402
    BudgetConfig,
    BudgetExceededError,
    RuntimeConfig,
    to_anthropic_messages,
    to_gemini_request,
    to_openai_messages,
)
from ce.core.testing import deterministic_engine  # noqa: E402
from ce.core.testing.histories import write_random_history  # noqa: E402
from ce.core.testing.payloads import (  # noqa: E402
    anthropic_problems,
    gemini_problems,
    openai_problems,
)

RESERVE = 100


@dataclass
class Tally:
    """What one worker (or the whole run) counted."""

    payloads: int = 0
    must_exceeded: int = 0
    invalid: int = 0
    over_budget: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.payloads += other.payloads
        self.must_exceeded += other.must_exceeded
        self.invalid += other.invalid
        self.over_budget += other.over_budget
        self.examples.extend(other.examples)


def _chunk(first: int, count: int, budgets: int, images: float = 0.0) -> Tally:
    """Histories ``first .. first+count-1`` (seeded by their number), each assembled under
    ``budgets`` random budgets."""
    tally = Tally()

    async def one(seed: int) -> None:
        rng = random.Random(seed)
        if images > 0:  # pictures need room while the history is written
            roomy = BudgetConfig(max_input_tokens=1_000_000)
            engine = deterministic_engine(RuntimeConfig(model_hint="gpt-4o", budget=roomy))
        else:
            engine = deterministic_engine()
        await write_random_history(engine, "s", rng, rng.randint(1, 8), images=images)
        for _ in range(budgets):
            budget = rng.randint(200, 6000)
            config = RuntimeConfig(
                model_hint="gpt-4o",
                budget=BudgetConfig(max_input_tokens=budget, reserved_reply_tokens=RESERVE),
            )
            try:
                result = await engine.prepare_call("s", [], config)
            except BudgetExceededError:
                tally.must_exceeded += 1
                continue
            tally.payloads += 1
            parts = list(result.assembled_input.parts)
            problems = (
                openai_problems(to_openai_messages(parts))
                + anthropic_problems(to_anthropic_messages(parts))
                + gemini_problems(to_gemini_request(parts))
            )
            if problems:
                tally.invalid += 1
                if len(tally.examples) < 3:
                    tally.examples.append(f"seed {seed}, budget {budget}: {problems[:2]}")
            if result.assembled_input.total_tokens > budget - RESERVE:
                tally.over_budget += 1

    async def run() -> None:
        for seed in range(first, first + count):
            await one(seed)

    asyncio.run(run())
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--histories", type=int, default=10_000)
    parser.add_argument("--budgets", type=int, default=10, help="budgets per history")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--images", type=float, default=0.0, help="share of questions with pictures"
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args()
    command = "python benchmarks/fuzz_payloads.py"
    if args.histories != 10_000:
        command += f" --histories {args.histories}"
    if args.budgets != 10:
        command += f" --budgets {args.budgets}"
    if args.images:
        command += f" --images {args.images:g}"
    if args.write:
        command += f" --write {args.write}"

    started = time.perf_counter()
    size = max(1, args.histories // (args.workers * 8))
    chunks = [(i, min(size, args.histories - i)) for i in range(0, args.histories, size)]
    totals = Tally()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [
            pool.submit(_chunk, first, count, args.budgets, args.images) for first, count in chunks
        ]
        for future in futures:
            totals.add(future.result())
    examples = totals.examples
    elapsed = time.perf_counter() - started
    pictures = (
        f"; {args.images:.0%} of the questions with 1-3 pictures of random sizes"
        if args.images
        else ""
    )
    lines = [
        "## Payload fuzz: every assembled input against three providers' conventions",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; {args.workers} worker processes, "
        f"{elapsed:.0f} s",
        "",
        f"{args.histories:,} random histories (1-8 turns: answers, parallel tool calls answered "
        "by tool messages or by recorded runs with result evidence, failed runs, calls never "
        "answered, text tool use: ReAct steps and their observations; tool results fenced"
        f"{pictures}), each assembled under {args.budgets} random budgets (200-6,000 input "
        f"tokens, {RESERVE} reserved for the reply); each assembled input converted to an "
        "OpenAI chat request, an Anthropic Messages request and a Gemini `contents` request "
        "and checked (`ce.core.testing.payloads`).",
        "",
        "| histories x budgets | payloads checked | must blocks over budget (raised) "
        "| invalid payloads | budget overruns |",
        "| ---: | ---: | ---: | ---: | ---: |",
        f"| {args.histories * args.budgets:,} | {totals.payloads:,} "
        f"| {totals.must_exceeded:,} | **{totals.invalid:,}** "
        f"| **{totals.over_budget:,}** |",
    ]
    if examples:
        lines += ["", "First problems:", *(f"- {e}" for e in examples[:5])]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_section(args.write, "fuzz", section)


if __name__ == "__main__":
    main()
