"""The toy training task shared by the training tests: reward = vowels in the response."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.config import AgentRLConfig, load_config
from agentrl.testing.serving import worker_port

TOY_REWARD = Path(__file__).parent / "toy" / "reward.py"


def toy_row(request: str, **extra_info: object) -> dict:
    """A row of the toy task: one user message, the vowel reward, ``extra_info`` if any."""
    row = {
        "prompt": [{"role": "user", "content": request}],
        "data_source": "toy",
        "reward_model": {"ground_truth": "", "style": "rule"},
    }
    return {**row, "extra_info": extra_info} if extra_info else row


def _write_rows(path: Path, count: int) -> None:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    with path.open("w") as f:
        for i in range(count):
            f.write(json.dumps(toy_row(f"Say something about {words[i % 8]}.")) + "\n")


def toy_config(
    tiny_checkpoint: Path, tmp: Path, steps: int, extra: list[str] = ()
) -> AgentRLConfig:
    """A small GRPO run on the toy task: 1 rollout replica, 2 FSDP ranks."""
    return load_config(None, toy_overrides(tiny_checkpoint, tmp, steps, extra))


def toy_overrides(tiny_checkpoint: Path, tmp: Path, steps: int, extra: list[str] = ()) -> list[str]:
    """``toy_config``'s dotted overrides (``agentrl train`` takes them as they are)."""
    _write_rows(tmp / "train.jsonl", 32)
    return [
        f"model.path={tiny_checkpoint}",
        f"data.train_files=[{tmp / 'train.jsonl'}]",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "server.num_replicas=1",
        f"server.http_port={worker_port(18768)}",
        "server.engine.max_model_len=256",
        "server.engine.kv_cache_memory_bytes=33554432",
        "rollout.n=4",
        "rollout.max_response_length=24",
        "rollout.num_workers=1",
        "rollout.temperature=1.0",
        f"reward.reward_fn_path={TOY_REWARD}",
        "algorithm.adv_estimator=grpo",
        "workers.actor.world_size=2",
        "workers.actor.num_cpus_per_worker=0",
        "workers.actor.mini_batch_size=16",
        "workers.actor.optim.lr=0.02",
        "workers.actor.optim.warmup_steps=0",
        "workers.actor.optim.weight_decay=0.0",
        f"trainer.total_steps={steps}",
        f"trainer.run_dir={tmp / 'run'}",
        "trainer.samples_to_save=2",
        "ray.num_cpus=2",
        *extra,
    ]
