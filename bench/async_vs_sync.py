"""Synchronous vs one-step-off (η = 1) vs η = 2 training: trained tokens per second, same run.

Modes (``--modes``): ``sync`` (``Trainer``), ``eta1`` and ``eta2`` (``AsyncTrainer`` with
the configured ``trainer.stale_policy``, ``drop`` by default) and ``eta1_downweight``
(η = 1, stale episodes trained with a smaller weight instead of dropped).

Toy workload (the default): every step takes ``--batch`` prompts × ``--n`` samples, and
each prompt asks for an answer of a fixed length drawn once from a lognormal (median
``--median`` tokens, σ ``--sigma``, capped at ``--max-length``, seed ``--seed``), so a
synchronous step waits for its longest answer while an async producer keeps starting new
groups. Every mode reads the same rows in the same order. ``--recipe`` runs a recipe's
real workload instead (e.g. ``recipes/retool/cpu.yaml``; validation off). Real parts:
Ray Serve + vLLM-CPU rollout replicas, FSDP2 actor ranks, GRPO updates, weight pushes.

Headline, over the measured steps (all but the first, which warms up) and their wall
time: **trained tokens per second** (model tokens of the samples that went into an
update) and trained episodes per second. ``--runs`` repeats every mode, interleaved, every
other run in reverse order (sync, η = 1, η = 2, then η = 2, η = 1, sync, ...): a machine
whose speed drifts steadily over the bench then favours no mode, where a fixed order would
favour the modes run last; ``speedup_<mode>`` is the mean over runs of run *i*'s trained
tokens/s ÷ sync's in run *i*, with its SE (``speedup_<mode>_se``) and every run's ratio
(``speedup_<mode>_runs``); ``speedup_episodes_<mode>`` likewise for episodes/s.
``summary`` holds each mode's mean, SD and SE over runs. A mode that drops or never
finishes the long episodes trains fewer, shorter ones, so each mode also accounts for
every episode it started over the whole run (warm-up included): ``episodes_started`` =
``episodes_trained`` + ``episodes_dropped_stale`` (more than η versions old when its
batch formed) + ``episodes_failed`` + ``episodes_filtered`` (in a batch but not trained:
dynamic sampling or a skipped update) + ``episodes_unfinished`` (still generating, or
finished but never taken, when the run ended), with ``mean_trained_length``;
``episodes_downweighted_stale`` were trained at a lower weight.

    .venv/bin/python bench/async_vs_sync.py [--steps 21 --model builtin:tiny-qwen2]
    .venv/bin/python bench/async_vs_sync.py --recipe recipes/retool/cpu.yaml \\
        --modes sync,eta1 --steps 9 --runs 3 --tag retool \\
        algorithm.dynamic_sampling.enable=false  # the same 32 episodes a step in both modes

Prints a table and writes ``bench/results/async_vs_sync.json``
(``async_vs_sync_<tag>.json`` with ``--tag``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import serve
from rich.console import Console
from rich.table import Table

from agentrl.config import AgentRLConfig, load_config
from agentrl.models import resolve_model_path
from agentrl.testing.benchmarks import measured_code, provenance
from agentrl.testing.spread import mean_sd_se
from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.batch import Sample
from agentrl.trainer.batches import StepBatch
from agentrl.trainer.trainer import Trainer

LOGGER = logging.getLogger("bench.async_vs_sync")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TOY_REWARD = ROOT / "tests" / "integration" / "toy" / "reward.py"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
TOY_ROWS = 256
MODES = {
    "sync": ["trainer.max_staleness=0"],
    "eta1": ["trainer.max_staleness=1"],
    "eta2": ["trainer.max_staleness=2"],
    "eta1_downweight": ["trainer.max_staleness=1", "trainer.stale_policy=downweight"],
}
"""Each mode's config overrides; ``sync`` runs ``Trainer``, the others ``AsyncTrainer``."""
SUMMARY_FIELDS = (
    "trained_tokens_per_s",
    "trained_episodes_per_s",
    "trained_tokens",
    "trained_episodes",
    "mean_trained_length",
    "step_s",
)


@dataclass
class ModeResult:
    """One mode's throughput over the measured steps and its episode accounting."""

    steps: int
    wall_s: float
    trained_tokens: int
    trained_episodes: int
    trained_tokens_per_s: float
    trained_episodes_per_s: float
    mean_trained_length: float
    episodes_started: int
    episodes_generated: int
    episodes_trained: int
    episodes_dropped_stale: int
    episodes_failed: int
    episodes_filtered: int
    episodes_unfinished: int
    episodes_downweighted_stale: int
    step_s: float
    trainer_idle_s: float
    weight_sync_ms: float
    load_avg_5m: float
    """The machine's 5-minute load average when the mode ended (2 cores here: more than
    about 3 means something else was running)."""


class CountingTrainer(Trainer):
    """``Trainer`` that counts, per step, the episodes generated (synchronous loop), the
    samples and model tokens each update trained on, and when the step ended."""

    def __init__(self, cfg: AgentRLConfig) -> None:
        super().__init__(cfg)
        self._step_counts: Counter[str] = Counter()

    async def train_on(self, batch: StepBatch, metrics: dict[str, float]) -> dict[str, float]:
        metrics = await super().train_on(batch, metrics)
        # After the update: the batch holds dynamic sampling's extra groups too.
        self._step_counts["generated"] += len(batch.episodes)
        self._step_counts["failed"] += sum(not (e.ok and e.outputs) for e in batch.episodes)
        return metrics

    def _save_samples(self, samples: list[Sample]) -> None:
        # Called with exactly the samples of an update that goes ahead.
        super()._save_samples(samples)
        self._step_counts["trained_tokens"] += sum(s.output.num_model_tokens for s in samples)
        self._step_counts["trained_episodes"] += len({s.episode_id for s in samples})

    async def _finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        metrics |= {f"bench/{k}": float(v) for k, v in self._step_counts.items()}
        self._step_counts.clear()
        logged = await super()._finish_step(metrics)
        return logged | {"bench/end_s": time.perf_counter()}


class CountingAsyncTrainer(CountingTrainer, AsyncTrainer):
    """``AsyncTrainer`` with the bench's counters."""


def _toy_lengths(args: argparse.Namespace) -> list[int]:
    rng = np.random.default_rng(args.seed)
    draws = rng.lognormal(math.log(args.median), args.sigma, size=TOY_ROWS)
    return [int(x) for x in np.clip(np.rint(draws), 1, args.max_length)]


def _toy_config(args: argparse.Namespace, tmp: Path, mode: str) -> AgentRLConfig:
    with (tmp / "train.jsonl").open("w") as f:
        for i, length in enumerate(_toy_lengths(args)):
            row = {
                "prompt": [{"role": "user", "content": f"Tell story number {i}."}],
                "data_source": "toy",
                "reward_model": {"ground_truth": "", "style": "rule"},
                "extra_info": {"response_tokens": length},
            }
            f.write(json.dumps(row) + "\n")
    return load_config(
        None,
        [
            f"model.path={args.model or resolve_model_path('builtin:tiny-qwen2')}",
            f"data.train_files=[{tmp / 'train.jsonl'}]",
            f"data.train_batch_size={args.batch}",
            "data.shuffle=false",
            "server.num_replicas=2",
            f"server.engine.max_model_len={args.max_length + 128}",
            "server.engine.kv_cache_memory_bytes=134217728",
            f"rollout.n={args.n}",
            f"rollout.max_response_length={args.max_length}",
            "rollout.agent_name=agentrl.testing.loops:FixedLengthLoop",
            "rollout.num_workers=1",
            f"reward.reward_fn_path={TOY_REWARD}",
            "workers.actor.world_size=2",
            "workers.actor.num_cpus_per_worker=0",
            f"workers.actor.mini_batch_size={args.batch * args.n}",
            "workers.actor.optim.lr=1e-4",
            "ray.num_cpus=2",
            *_run_overrides(args, tmp, mode),
        ],
    )


def _recipe_config(args: argparse.Namespace, tmp: Path, mode: str) -> AgentRLConfig:
    model = [f"model.path={args.model}"] if args.model else []
    return load_config(
        args.recipe, [*model, "trainer.val_every=0", *_run_overrides(args, tmp, mode)]
    )


def _run_overrides(args: argparse.Namespace, tmp: Path, mode: str) -> list[str]:
    return [
        f"trainer.total_steps={args.steps}",
        f"trainer.run_dir={tmp / 'run'}",
        "trainer.samples_to_save=0",
        *MODES[mode],
        *args.overrides,
    ]


async def _run(args: argparse.Namespace, mode: str) -> ModeResult:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cfg = (_recipe_config if args.recipe else _toy_config)(args, tmp, mode)
        trainer = (CountingTrainer if mode == "sync" else CountingAsyncTrainer)(cfg)
        trainer.setup()
        try:
            history = await trainer.fit()
            queue = trainer.batches.queue.metrics() if mode != "sync" else None
        finally:
            trainer.shutdown()
    return _result(history, queue, os.getloadavg()[1])


def _total(history: list[dict[str, float]], key: str) -> int:
    return int(sum(h.get(f"bench/{key}", 0.0) for h in history))


def _result(
    history: list[dict[str, float]], queue: dict[str, float] | None, load: float
) -> ModeResult:
    measured = history[1:]
    wall = history[-1]["bench/end_s"] - history[0]["bench/end_s"]
    tokens, episodes = _total(measured, "trained_tokens"), _total(measured, "trained_episodes")
    trained = _total(history, "trained_episodes")
    if queue is None:  # synchronous: every started episode finished within its step
        started = generated = _total(history, "generated")
        failed, dropped, unfinished, downweighted = _total(history, "failed"), 0, 0, 0
    else:
        generated, started, failed, dropped, unfinished, downweighted = _queue_accounting(queue)

    def mean(key: str) -> float:
        return float(np.mean([h.get(key, 0.0) for h in measured]))

    return ModeResult(
        steps=len(measured),
        wall_s=wall,
        trained_tokens=tokens,
        trained_episodes=episodes,
        trained_tokens_per_s=tokens / wall,
        trained_episodes_per_s=episodes / wall,
        mean_trained_length=tokens / episodes if episodes else 0.0,
        episodes_started=started,
        episodes_generated=generated,
        episodes_trained=trained,
        episodes_dropped_stale=dropped,
        episodes_failed=failed,
        episodes_filtered=started - trained - dropped - failed - unfinished,
        episodes_unfinished=unfinished,
        episodes_downweighted_stale=downweighted,
        step_s=mean("timing/step"),
        trainer_idle_s=mean("timing/wait_for_batch") if queue else mean("timing/gen"),
        weight_sync_ms=1000 * mean("timing/weight_sync"),
        load_avg_5m=load,
    )


def _queue_accounting(queue: dict[str, float]) -> tuple[int, int, int, int, int, int]:
    """Generated, started, failed, dropped as stale, unfinished and down-weighted episodes,
    from the queue's counters at the end of the run (``TrajectoryQueue.metrics``)."""
    count = {key.removeprefix("async/"): int(value) for key, value in queue.items()}
    generated = count.get("episodes_in", 0)
    started = generated + count.get("running", 0)  # running ones were cancelled at the end
    dropped = count.get("dropped_stale", 0)
    taken = count.get("episodes_out", 0) + dropped + count.get("dropped_group_episodes", 0)
    failed, downweighted = count.get("failed_episodes", 0), count.get("downweighted_stale", 0)
    return generated, started, failed, dropped, started - taken, downweighted


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    if args.recipe:
        return {
            "recipe": args.recipe,
            "model": args.model,
            "steps": args.steps,
            "overrides": args.overrides,
        }
    lengths = np.array(_toy_lengths(args))
    return {
        **{k: getattr(args, k) for k in ("steps", "batch", "n", "median", "sigma", "seed")},
        "max_length": args.max_length,
        "model": args.model or "builtin:tiny-qwen2",
        "overrides": args.overrides,
        "rows": TOY_ROWS,
        "row_length_mean": float(lengths.mean()),
        "row_length_p50_p90_p99_max": [
            *(float(np.percentile(lengths, q)) for q in (50, 90, 99)),
            int(lengths.max()),
        ],
        "rows_capped": int((lengths == args.max_length).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=None, help="a recipe's config: its real workload")
    parser.add_argument("--model", default=None, help="default: tiny-qwen2 / the recipe's")
    parser.add_argument("--modes", default="sync,eta1,eta2", help=f"of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=21, help="the first one warms up")
    parser.add_argument("--runs", type=int, default=1, help="runs of every mode, interleaved")
    parser.add_argument("--batch", type=int, default=4, help="toy: prompts per step")
    parser.add_argument("--n", type=int, default=4, help="toy: samples per prompt")
    parser.add_argument("--median", type=float, default=32, help="toy: median answer length")
    parser.add_argument("--sigma", type=float, default=1.0, help="toy: lognormal σ")
    parser.add_argument("--max-length", type=int, default=512, help="toy: length cap")
    parser.add_argument("--seed", type=int, default=0, help="toy: seed of the lengths")
    parser.add_argument("--tag", default=None, help="write async_vs_sync_<tag>.json")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    _console_logging()
    if args.model:
        args.model = resolve_model_path(args.model)
    modes = args.modes.split(",")
    if "sync" not in modes or not set(modes) <= set(MODES):
        parser.error(f"--modes: sync and any of {', '.join(MODES)}")

    args.started = provenance(ROOT, MEASURED)
    path = RESULTS / (f"async_vs_sync_{args.tag}.json" if args.tag else "async_vs_sync.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[ModeResult]] = {mode: [] for mode in modes}
    started = time.monotonic()
    try:
        for run in range(args.runs):
            for position, mode in enumerate(modes if run % 2 == 0 else modes[::-1]):
                done = run * len(modes) + position
                _announce(done, args.runs * len(modes), mode, time.monotonic() - started)
                results[mode].append(asyncio.run(_run(args, mode)))
                path.write_text(json.dumps(_payload(args, results), indent=2) + "\n")
    finally:
        serve.shutdown()
        ray.shutdown()
    _print_table(results)
    Console().print(f"wrote {path}")


def _ratios(results: dict[str, list[ModeResult]], name: str, field: str) -> list[float]:
    """Run i's ``field`` for ``name`` over sync's in run i, for the runs both finished."""
    pairs = zip(results[name], results["sync"], strict=False)
    return [getattr(r, field) / getattr(s, field) for r, s in pairs]


def _payload(args: argparse.Namespace, results: dict[str, list[ModeResult]]) -> dict[str, Any]:
    others = [name for name, runs in results.items() if name != "sync" and runs]
    payload: dict[str, Any] = {
        "benchmark": "async_vs_sync",
        **args.started,
        "workload": _workload(args),
        "runs": args.runs,
        "modes": {name: [asdict(r) for r in runs] for name, runs in results.items()},
        "summary": {
            name: {field: mean_sd_se([getattr(r, field) for r in runs]) for field in SUMMARY_FIELDS}
            for name, runs in results.items()
            if runs
        },
    }
    for name in others:
        for key, field in (
            ("speedup", "trained_tokens_per_s"),
            ("speedup_episodes", "trained_episodes_per_s"),
        ):
            ratios = _ratios(results, name, field)
            stats = mean_sd_se(ratios)
            payload |= {
                f"{key}_{name}": stats["mean"],
                f"{key}_{name}_se": stats["se"],
                f"{key}_{name}_runs": ratios,
            }
    return payload


def _console_logging() -> None:
    """Warnings, plus the trainer's one line per step (``agentrl.tracking``) and this
    bench's own lines; Serve's INFO bookkeeping (app ready, deleting) is left out."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for name in ("agentrl.tracking", LOGGER.name):
        logging.getLogger(name).setLevel(logging.INFO)
    # A filter, not a level: importing ray.serve sets that logger's level to INFO again.
    logging.getLogger("ray.serve").addFilter(lambda record: record.levelno >= logging.WARNING)


def _announce(done: int, total: int, mode: str, elapsed_s: float) -> None:
    """One console line as each run starts: which of how many, elapsed, time left."""
    left = f", about {elapsed_s / done * (total - done) / 60:.0f} min left" if done else ""
    LOGGER.info(
        "run %d of %d: %s (%.0f min elapsed%s)", done + 1, total, mode, elapsed_s / 60, left
    )


def _print_table(results: dict[str, list[ModeResult]]) -> None:
    runs = len(results["sync"])
    table = Table(title=f"Async vs sync training: trained tokens per second, {runs} run(s) each")
    columns = ("mode", "tokens/s (± SD)", "episodes/s", "mean len", "started", "trained")
    for col in (*columns, "stale", "down-weighted", "failed", "filtered", "unfinished"):
        table.add_column(col, justify="right")
    table.add_column("speedup (± SE)", justify="right")
    for name, mode_runs in results.items():
        tokens = mean_sd_se([r.trained_tokens_per_s for r in mode_runs])
        counts = [
            sum(getattr(r, field) for r in mode_runs)
            for field in (
                "episodes_started",
                "episodes_trained",
                "episodes_dropped_stale",
                "episodes_downweighted_stale",
                "episodes_failed",
                "episodes_filtered",
                "episodes_unfinished",
            )
        ]
        speedup = mean_sd_se(_ratios(results, name, "trained_tokens_per_s"))
        table.add_row(
            name,
            f"{tokens['mean']:.1f} ± {tokens['sd']:.1f}",
            f"{np.mean([r.trained_episodes_per_s for r in mode_runs]):.2f}",
            f"{np.mean([r.mean_trained_length for r in mode_runs]):.1f}",
            *map(str, counts),
            f"{speedup['mean']:.2f}x ± {speedup['se']:.2f}",
        )
    Console(width=170).print(table)
    Console().print("episode counts are summed over runs")


if __name__ == "__main__":
    main()
