"""The full ReTool-mini CPU recipe as a benchmark: does the reward curve rise, how fast?

Runs ``recipes/retool/run_cpu.sh`` (data prep, the cold-start SFT, then RL:
SmolLM2-135M-Instruct, reasoning-gym arithmetic, sandboxed code interpreter, 2 vLLM-CPU
replicas, 2 FSDP2 ranks, η = 1) and reads its ``metrics.jsonl``.

    .venv/bin/python bench/retool_cpu.py [--direct-fraction F --tag NAME] [dotted overrides]

``--direct-fraction`` sets the share of cold-start demonstrations that answer without the
tool (``RETOOL_DIRECT_FRACTION`` of ``run_cpu.sh``; the recipe's default is 0.5).

Writes ``bench/results/retool_cpu.json`` (``retool_cpu_<tag>.json`` with ``--tag``).
Held out (greedy, before training and at each validation): ``reward_first``/
``reward_last``, ``accuracy_first``/``accuracy_last``, ``tool_use_*`` (episodes that
called the tool) and ``valid_call_rate_*`` (calls that ran), with their curves.
Training: the per-step reward, tool-use and valid-call curves, with
``train_reward_first``/``train_reward_last`` (``train_tool_use_*`` and
``train_valid_call_rate_*`` alike) averaged over the first and the last ``WINDOW`` steps
(one step scores only 8 problems at temperature 0.8, too few for a single point to say
much). Also ``minutes``, for the whole job (data prep and cold start
included), the dotted ``overrides`` given and the git ``commit`` it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
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


def _ratio_curve(records: list[dict], numerator: str, denominator: str) -> list:
    return [
        (r["step"], r[numerator] / r[denominator])
        for r in records
        if r.get(denominator) and numerator in r
    ]


def _ends(payload: dict, name: str, curve: list[tuple[int, float]]) -> None:
    payload[f"{name}_curve"] = curve
    payload[f"{name}_first"] = curve[0][1] if curve else None
    payload[f"{name}_last"] = curve[-1][1] if curve else None


def summarize(records: list[dict], minutes: float) -> dict:
    """The benchmark's result from a run's ``metrics.jsonl`` records."""
    payload: dict = {"benchmark": "retool_cpu", "minutes": minutes}
    _ends(payload, "reward", _curve(records, "val/score/mean"))
    _ends(payload, "accuracy", _curve(records, "val/acc/mean"))
    _ends(payload, "tool_use", _curve(records, "val/tool_used/mean"))
    _ends(
        payload,
        "valid_call_rate",
        _ratio_curve(records, "val/rollout/tool_calls/ok", "val/rollout/tool_calls"),
    )
    train_reward = _curve(records, "reward/score/mean")
    train_tool_use = _curve(records, "reward/tool_used/mean")
    payload |= {
        "train_reward_curve": train_reward,
        "train_reward_window": WINDOW,
        "train_reward_first": _window_mean(train_reward, last=False),
        "train_reward_last": _window_mean(train_reward, last=True),
        "train_accuracy_curve": _curve(records, "reward/acc/mean"),
        "train_tool_use_curve": train_tool_use,
        "train_tool_use_first": _window_mean(train_tool_use, last=False),
        "train_tool_use_last": _window_mean(train_tool_use, last=True),
    }
    train_valid = _ratio_curve(records, "rollout/tool_calls/ok", "rollout/tool_calls")
    payload |= {
        "train_valid_call_rate_curve": train_valid,
        "train_valid_call_rate_first": _window_mean(train_valid, last=False),
        "train_valid_call_rate_last": _window_mean(train_valid, last=True),
    }
    return payload


def _commit() -> str:
    """The checked-out commit, with ``+dirty`` when tracked files have changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return f"{head}+dirty" if dirty else head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--direct-fraction", type=float, default=None, help="default: the recipe's (0.5)"
    )
    parser.add_argument("--tag", default="", help="results go to retool_cpu_<tag>.json")
    args, overrides = parser.parse_known_args()
    results = RESULTS.with_stem(f"{RESULTS.stem}_{args.tag}") if args.tag else RESULTS
    # The trainer appends to an existing run's metrics: start from an empty run directory.
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    start = time.perf_counter()
    command = [str(ROOT / "recipes" / "retool" / "run_cpu.sh"), f"trainer.run_dir={RUN_DIR}"]
    env = dict(os.environ)
    if args.direct_fraction is not None:
        env["RETOOL_DIRECT_FRACTION"] = str(args.direct_fraction)
    subprocess.run([*command, *overrides], cwd=ROOT, check=True, env=env)
    minutes = (time.perf_counter() - start) / 60
    records = [json.loads(x) for x in (RUN_DIR / "metrics.jsonl").read_text().splitlines()]
    direct = env.get("RETOOL_DIRECT_FRACTION")
    payload = summarize(records, minutes) | {
        "direct_fraction": float(direct) if direct is not None else "recipe default",
        "overrides": overrides,
        "commit": _commit(),
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(payload, indent=2))
    table = Table(title=f"ReTool-mini on this CPU ({minutes:.1f} min)")
    for column in ("", "first", "last"):
        table.add_column(column, justify="right")
    rows = [
        ("held-out reward", "reward"),
        ("held-out accuracy", "accuracy"),
        ("held-out tool use", "tool_use"),
        ("held-out valid calls", "valid_call_rate"),
        (f"train reward ({WINDOW}-step mean)", "train_reward"),
        (f"train tool use ({WINDOW}-step mean)", "train_tool_use"),
        (f"train valid calls ({WINDOW}-step mean)", "train_valid_call_rate"),
    ]
    for label, key in rows:
        first, last = payload[f"{key}_first"], payload[f"{key}_last"]
        table.add_row(label, *(f"{v:.3f}" if v is not None else "-" for v in (first, last)))
    Console().print(table)
    Console().print(f"wrote {results}")


if __name__ == "__main__":
    main()
