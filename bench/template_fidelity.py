"""Template fidelity per model family: random conversations, token for token.

For every family of ``agentrl.testing.families`` (a real tokenizer, a chat template and
the installed vLLM's tool-call and reasoning parsers), ``--conversations`` random
tool-calling conversations run through ``ToolAgentLoop`` and ``GatewayService`` against a
scripted engine that emits each turn as the family's template writes it
(``agentrl.testing.fidelity`` says what is generated and checked). Counted per family:
tokens that drift from the template's render of the whole conversation, calls the
parser did not recover (loop and gateway), mask errors and gateway samples that differ
from what the engine saw.

    .venv/bin/python bench/template_fidelity.py [--conversations 10000] [--families qwen3 ...]

Prints a table and writes ``bench/results/template_fidelity.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from rich.table import Table

from agentrl.testing.benchmarks import provenance
from agentrl.testing.families import FAMILIES, family
from agentrl.testing.fidelity import FidelityHarness, random_conversation

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "template_fidelity.json"
# The code this bench measures: a change here makes a recorded result stale.
MEASURED = [
    "agent_loops",
    "tools",
    "server/gateway",
    "agentrl/chat_template.py",
    "agentrl/core/trajectory.py",
    "agentrl/testing/families.py",
    "agentrl/testing/fidelity.py",
]


async def run_family(name: str, conversations: int, seed: int, progress, task) -> dict:
    model = family(name)
    tokenizer = model.tokenizer()
    harness = FidelityHarness(
        tokenizer, model.tools_in_system_prompt, model.tool_parser, model.reasoning_parser
    )
    specials = list(tokenizer.all_special_tokens)
    rng = random.Random(seed)
    row = {
        "family": name,
        "tool_parser": model.tool_parser,
        "reasoning_parser": model.reasoning_parser,
        "source": model.source,
        "conversations": 0,
        "assistant_turns": 0,
        "tool_calls": 0,
        "drifted_tokens": 0,
        "unparsed_calls": 0,
        "mask_errors": 0,
        "gateway_mismatches": 0,
        "failed_conversations": 0,
        "first_failures": [],
    }
    start = time.perf_counter()
    for _ in range(conversations):
        conversation = random_conversation(
            rng,
            specials,
            model.reasoning_parser is not None,
            max_calls_per_turn=3 if model.parallel_calls else 1,
        )
        report = await harness.check(conversation)
        row["conversations"] += 1
        row["assistant_turns"] += len(conversation.turns)
        row["tool_calls"] += len(conversation.calls)
        for key in ("drifted_tokens", "unparsed_calls", "mask_errors", "gateway_mismatches"):
            row[key] += getattr(report, key)
        if not report.ok:
            row["failed_conversations"] += 1
            if len(row["first_failures"]) < 3:
                row["first_failures"].append(report.detail)
        progress.advance(task)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    console = Console()
    started = provenance(ROOT, MEASURED)  # the commit of the measured files, at the start
    rows = []
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeRemainingColumn(), console=console) as progress:
        for name in args.families:
            task = progress.add_task(name, total=args.conversations)
            rows.append(await run_family(name, args.conversations, args.seed, progress, task))

    table = Table(title="Template fidelity: random conversations through loop and gateway")
    for column in ("family", "parsers", "conversations", "tool calls", "drifted tokens"):
        table.add_column(column)
    for column in ("unparsed calls", "mask errors", "gateway mismatches", "s"):
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
            str(row["drifted_tokens"]),
            str(row["unparsed_calls"]),
            str(row["mask_errors"]),
            str(row["gateway_mismatches"]),
            str(row["seconds"]),
        )
    console.print(table)
    result = {
        **started,
        "families": len(rows),
        "conversations": sum(r["conversations"] for r in rows),
        "conversations_per_family": args.conversations,
        "drifted_tokens": sum(r["drifted_tokens"] for r in rows),
        "unparsed_calls": sum(r["unparsed_calls"] for r in rows),
        "mask_errors": sum(r["mask_errors"] for r in rows),
        "gateway_mismatches": sum(r["gateway_mismatches"] for r in rows),
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
