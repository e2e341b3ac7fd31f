"""Time of one actor update on SmolLM2-135M with 2 FSDP2 ranks (gloo), per FSDP setting.

The ReTool-mini recipe spends most of each step in ``update_actor``. This benchmark times
that call alone on a batch shaped like the recipe's (32 episodes: ~120-token prompts,
responses of 20-192 tokens averaging ~80, some tool-output spans masked), with the
recipe's other actor settings (``recipes/retool/cpu.yaml``), for the attention kernel
× the micro-batch token budget:

- ``sdpa_mb1024`` (the baseline): ``fsdp.attn_implementation=sdpa`` (one masked SDPA over
  each whole packed micro-batch), ``max_tokens_per_micro_batch=1024``;
- ``packed_mb1024``: ``packed_sdpa`` (one causal SDPA per packed sequence), 1024;
- ``sdpa_mb2048`` and ``packed_mb2048``: the same with 2048-token micro-batches (here
  about one per mini-batch and rank).

Each setting gets a fresh actor group; one update warms it up, then ``--repeats`` updates
are timed (wall clock). Reported: median seconds per update and the ratio to the
baseline's median in the same run.

    .venv/bin/python bench/train_step.py [--repeats 3] [--settings sdpa_mb1024,packed_mb2048,...]

Prints a table and writes ``bench/results/train_step.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentrl.local_env import use_local_defaults
from agentrl.testing.benchmarks import measured_code, provenance

_ROOT = Path(__file__).resolve().parents[1]
RESULTS = _ROOT / "bench" / "results" / "train_step.json"
RECIPE = _ROOT / "recipes" / "retool" / "cpu.yaml"
# The code this bench measures, derived from what it and its command line name: a change
# there makes a recorded result stale.
MEASURED = measured_code(__file__, sys.argv[1:])
use_local_defaults(_ROOT / ".cache")

SETTINGS: dict[str, dict[str, object]] = {
    f"{kernel}_mb{tokens}": {
        "fsdp.attn_implementation": "sdpa" if kernel == "sdpa" else "packed_sdpa",
        "max_tokens_per_micro_batch": tokens,
    }
    for tokens in (1024, 2048)
    for kernel in ("sdpa", "packed")
}
BASELINE = "sdpa_mb1024"
ROWS, PROMPT, MAX_RESPONSE = 32, 130, 192
CONSOLE = Console()


def make_batch(vocab_size: int, seed: int = 0) -> dict:
    """A training batch shaped like a ReTool-mini step's, with random tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (ROWS, PROMPT + MAX_RESPONSE), generator=g)
    attention = torch.zeros_like(ids)
    response_mask = torch.zeros(ROWS, MAX_RESPONSE)
    for row in range(ROWS):
        prompt_len = int(torch.randint(110, PROMPT + 1, (1,), generator=g))
        response_len = int(torch.randint(20, 141, (1,), generator=g)) if row % 8 else 192
        attention[row, PROMPT - prompt_len : PROMPT + response_len] = 1
        response_mask[row, :response_len] = 1
        if row % 2:  # a tool call's output: attended, not trained on
            response_mask[row, response_len // 3 : response_len // 3 + 15] = 0
    log_probs = -torch.rand(ROWS, MAX_RESPONSE, generator=g) * response_mask
    return {
        "input_ids": ids * attention,
        "attention_mask": attention,
        "response_mask": response_mask,
        "old_log_probs": log_probs,
        "rollout_log_probs": log_probs.clone(),
        "advantages": torch.randn(ROWS, 1, generator=g).expand(-1, MAX_RESPONSE) * response_mask,
    }


def _recipe_config(overrides: dict[str, object]):
    from agentrl.config import load_config

    return load_config(str(RECIPE), [f"workers.actor.{k}={v}" for k, v in overrides.items()])


def time_setting(name: str, model_path: str, repeats: int) -> dict:
    """Median wall seconds of ``update_actor`` for one setting (fresh actor group)."""
    from transformers import AutoConfig

    from agentrl.trainer import ActorGroup
    from agentrl.trainer.losses import make_actor_loss

    cfg = _recipe_config(SETTINGS[name])
    loss_fn = make_actor_loss(cfg.algorithm)
    group = ActorGroup(cfg.workers.actor, model_path, total_training_steps=repeats + 1)
    try:
        batch = make_batch(AutoConfig.from_pretrained(model_path).vocab_size)
        times = []
        for i in range(repeats + 1):
            start = time.perf_counter()
            group.update_actor(batch, loss_fn, with_entropy=True, entropy_grad=False)
            seconds = time.perf_counter() - start
            CONSOLE.log(f"{name}: update {i} ({'timed' if i else 'warm-up'}) {seconds:.1f} s")
            if i:
                times.append(seconds)
    finally:
        group.shutdown()
    return {"setting": name, "overrides": SETTINGS[name], "seconds": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    args = parser.parse_args()
    started = provenance(_ROOT, MEASURED)
    names = args.settings.split(",")
    if names[0] != BASELINE:
        sys.exit(f"the first setting must be the baseline, {BASELINE}")

    import ray

    from agentrl.models import resolve_model_path

    model_path = resolve_model_path(args.model)
    ray.init(address="local", include_dashboard=False, num_cpus=2, log_to_driver=False)
    try:
        results = [time_setting(name, model_path, args.repeats) for name in names]
    finally:
        ray.shutdown()
    base = statistics.median(results[0]["seconds"])
    for r in results:
        r["median_s"] = statistics.median(r["seconds"])
        r["ratio_to_baseline"] = r["median_s"] / base
    payload = {
        "benchmark": "train_step",
        **started,
        "model": args.model,
        "rows": ROWS,
        "repeats": args.repeats,
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2))
    table = Table(title=f"update_actor, {ROWS} episodes, 2 FSDP2 ranks on CPU")
    for column in ("setting", "median s", "ratio"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(r["setting"], f"{r['median_s']:.1f}", f"{r['ratio_to_baseline']:.2f}")
    CONSOLE.print(table)
    CONSOLE.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
