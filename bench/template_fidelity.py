"""Template fidelity per model family: random conversations, token for token.

For every family of ``agentrl.testing.families`` (a real tokenizer, a chat template and
the installed vLLM's tool-call and reasoning parsers), ``--conversations`` random
tool-calling conversations run through ``ToolAgentLoop`` and ``GatewayService`` against a
scripted engine that emits each turn as the family's template writes it
(``agentrl.testing.fidelity`` says what is generated and checked). Counted per family:
tokens that drift from the template's render of the whole conversation, calls the
parser did not recover (loop and gateway), mask errors and gateway samples that differ
from what the engine saw. Work goes out in units of 250 conversations of one family, each
from its own seeded stream, over ``--workers`` processes (default: one per CPU), so the
result does not depend on the number of workers.

    .venv/bin/python bench/template_fidelity.py [--conversations 10000] [--families qwen3 ...]

Prints a table and writes ``bench/results/template_fidelity.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import multiprocessing
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from rich.table import Table

from agentrl.testing.benchmarks import measured_code, provenance
from agentrl.testing.families import FAMILIES, family
from agentrl.testing.fidelity import FidelityHarness, random_conversation

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "template_fidelity.json"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])


COUNTS = ("drifted_tokens", "unparsed_calls", "mask_errors", "gateway_mismatches", "drift_reports")
SUMMED = ("conversations", "assistant_turns", "tool_calls", *COUNTS, "failed_conversations")
"""What a family's row sums over its work units."""
CHUNK = 250
"""Conversations per work unit: a worker checks one unit of one family at a time."""


@functools.cache
def _harness(name: str) -> tuple[FidelityHarness, list[str]]:
    """The family's harness and special tokens, built once per worker process."""
    harness = FidelityHarness.of(family(name))
    return harness, list(harness.rendering.tokenizer.all_special_tokens)


def check_chunk(name: str, chunk: int, count: int, seed: int) -> dict[str, Any]:
    """Check ``count`` random conversations of family ``name``: work unit ``chunk``, whose
    conversations come from their own seeded stream, so a result does not depend on how
    many workers ran or in what order."""
    return asyncio.run(_check_chunk(name, chunk, count, seed))


async def _check_chunk(name: str, chunk: int, count: int, seed: int) -> dict[str, Any]:
    harness, specials = _harness(name)
    model = family(name)
    rng = random.Random(f"{seed}:{name}:{chunk}")
    part: dict[str, Any] = dict.fromkeys(SUMMED, 0)
    part["first_failures"] = []
    start = time.perf_counter()
    for _ in range(count):
        conversation = random_conversation(
            rng,
            specials,
            model.reasoning_parser is not None,
            max_calls_per_turn=3 if model.parallel_calls else 1,
        )
        report = await harness.check(conversation)
        part["conversations"] += 1
        part["assistant_turns"] += len(conversation.turns)
        part["tool_calls"] += len(conversation.calls)
        for key in COUNTS:
            part[key] += getattr(report, key)
        if not report.ok:
            part["failed_conversations"] += 1
            if len(part["first_failures"]) < 3:
                part["first_failures"].append(report.detail)
    part["seconds"] = time.perf_counter() - start
    return part


def _family_row(name: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One family's row: its work units' counts summed (``seconds``: their checking time,
    summed over workers), the first three failures in unit order."""
    model = family(name)
    row: dict[str, Any] = {
        "family": name,
        "tool_parser": model.tool_parser,
        "reasoning_parser": model.reasoning_parser,
        "source": model.source,
    }
    for key in SUMMED:
        row[key] = sum(part[key] for part in parts)
    row["first_failures"] = [f for part in parts for f in part["first_failures"]][:3]
    row["seconds"] = round(sum(part["seconds"] for part in parts), 1)
    return row


def run_families(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    """Every family's row, its work units spread over ``args.workers`` processes."""
    units = [
        (name, chunk, min(CHUNK, args.conversations - chunk * CHUNK))
        for name in args.families
        for chunk in range(math.ceil(args.conversations / CHUNK))
    ]
    parts: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in args.families}
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    # spawn: a forked worker would inherit the parent's tokenizer thread pools.
    context = multiprocessing.get_context("spawn")
    with (
        Progress(*columns, TimeRemainingColumn(), console=console) as progress,
        ProcessPoolExecutor(args.workers, mp_context=context) as pool,
    ):
        tasks = {name: progress.add_task(name, total=args.conversations) for name in args.families}
        futures = {
            pool.submit(check_chunk, name, chunk, count, args.seed): (name, chunk)
            for name, chunk, count in units
        }
        for future in as_completed(futures):
            name, chunk = futures[future]
            try:
                parts[name][chunk] = future.result()
            except Exception:
                pool.shutdown(cancel_futures=True)  # fail now, not after every queued unit
                raise
            progress.advance(tasks[name], parts[name][chunk]["conversations"])
    return [_family_row(name, [p for _, p in sorted(parts[name].items())]) for name in parts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    console = Console()
    started = provenance(ROOT, MEASURED)  # the commit of the measured files, at the start
    wall = time.perf_counter()
    rows = run_families(args, console)
    wall = time.perf_counter() - wall

    table = Table(title="Template fidelity: random conversations through loop and gateway")
    for column in ("family", "parsers", "conversations", "tool calls"):
        table.add_column(column)
    for column in (*(count.replace("_", " ") for count in COUNTS), "check s"):
        table.add_column(column)
    for row in rows:
        parsers = row["tool_parser"] + (
            f" + {row['reasoning_parser']}" * bool(row["reasoning_parser"])
        )
        table.add_row(
            row["family"],
            parsers,
            str(row["conversations"]),
            str(row["tool_calls"]),
            *(str(row[count]) for count in COUNTS),
            str(row["seconds"]),
        )
    Console(width=150).print(table)  # a log file or pipe gets the whole table too
    console.print(f"{wall:.0f} s wall on {args.workers} worker(s); check s: summed over workers")
    result = {
        **started,
        "families": len(rows),
        "conversations": sum(r["conversations"] for r in rows),
        "conversations_per_family": args.conversations,
        "workers": args.workers,
        "wall_seconds": round(wall, 1),
        **{count: sum(r[count] for r in rows) for count in COUNTS},
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
