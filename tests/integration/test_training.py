"""A short real GRPO run: tiny model, Ray Serve + vLLM-CPU rollouts, 2 FSDP2 ranks.

The toy task rewards vowels in the response; the policy must learn to emit more of them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import ray
from ray import serve
from toy_task import toy_config

from agentrl.trainer.trainer import Trainer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def ray_session():
    yield
    serve.shutdown()
    ray.shutdown()


async def test_grpo_run_raises_the_toy_reward(tiny_checkpoint, tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("grpo")
    trainer = Trainer(toy_config(tiny_checkpoint, tmp, steps=10))
    trainer.setup()
    try:
        history = await trainer.fit()
    finally:
        trainer.shutdown()
    rewards = [h["reward/score/mean"] for h in history]
    assert len(history) == 10
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.03, rewards
    # Weights reached the servers every step, and the recomputed log-probs of the
    # rollout tokens match what vLLM reported for them (same fp32 weights).
    assert [h["trainer/version"] for h in history] == list(range(1, 11))
    assert max(h["mismatch/mismatch_kl"] for h in history) <= 1e-3
    run = tmp / "run"
    assert (run / "metrics.jsonl").read_text().count("\n") == 10
    assert (run / "samples" / "step_1.txt").exists()
    assert (run / "checkpoints" / "step_10").exists()


async def test_ppo_with_critic_kl_in_reward_and_dynamic_sampling(
    tiny_checkpoint, tmp_path_factory, ray_session
):
    tmp = tmp_path_factory.mktemp("ppo")
    extra = [
        "algorithm.adv_estimator=gae",
        "algorithm.gamma=1.0",
        "algorithm.lam=0.95",
        "algorithm.kl.use_kl_in_reward=true",
        "algorithm.kl.kl_coef=0.01",
        "algorithm.dynamic_sampling.enable=true",
        "workers.ref.num_cpus_per_worker=0",
        "workers.critic.world_size=2",
        "workers.critic.num_cpus_per_worker=0",
        "workers.critic.mini_batch_size=16",
    ]
    trainer = Trainer(toy_config(tiny_checkpoint, tmp, steps=3, extra=extra))
    trainer.setup()
    try:
        history = await trainer.fit()
    finally:
        trainer.shutdown()
    assert len(history) == 3
    for h in history:
        assert np.isfinite(h["critic/value_loss"]) and np.isfinite(h["actor/loss"])
        assert "actor/reward_kl_coef" in h
        assert h["dapo/num_gen_batches"] >= 1
    # The KL penalty starts at 0 (policy == reference) and grows once the policy moves.
    assert history[0]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert history[-1]["actor/reward_kl_penalty"] > 0


async def test_trainer_resumes_from_its_run_directory(
    tiny_checkpoint, tmp_path_factory, ray_session
):
    tmp = tmp_path_factory.mktemp("resume")
    first = Trainer(toy_config(tiny_checkpoint, tmp, steps=2, extra=["trainer.save_every=1"]))
    first.setup()
    try:
        await first.fit()
        loader_state = first.loader.state_dict()
    finally:
        first.shutdown()
    second = Trainer(toy_config(tiny_checkpoint, tmp, steps=3))
    second.setup()
    try:
        assert (second.step, second.version) == (2, 2)
        assert second.loader.state_dict() == loader_state
        history = await second.fit()
    finally:
        second.shutdown()
    assert len(history) == 1
    assert history[0]["trainer/version"] == 3.0
    steps = [json.loads(line)["step"] for line in (tmp / "run" / "metrics.jsonl").open()]
    assert steps == [1, 2, 3]
