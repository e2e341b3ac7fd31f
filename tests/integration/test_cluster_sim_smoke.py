"""A simulated cluster through the real control path: 2 sim replicas, the sim trainer.

Ray Serve, the router, the agent-loop worker, the trajectory queue, the staleness rule,
the weight push and the checkpoint are real; only GPU time is modeled (slept).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
import torch
from ray import serve
from toy_task import toy_config

from agentrl.rollout.episode import make_requests
from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.checkpoint import TRAINER_STATE_FILE

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

STEPS = 2
SCALE = 0.05  # wall seconds per modeled second, trainer and engines alike


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    yield
    serve.shutdown()
    ray.shutdown()


def _sim_config(tiny_checkpoint, tmp_path, *extra: str):
    """The toy task on 2 sim replicas of long-tail answers and the sim trainer."""
    sim = [
        "server.num_replicas=2",
        "server.engine.backend=sim",
        "server.engine.max_model_len=2048",
        "server.engine.sim.response_length_median=200",
        "server.engine.sim.response_length_p99=1500",
        f"server.engine.sim.time_scale={SCALE}",
        "rollout.max_response_length=1600",
        "workers.backend=sim",
        "workers.sim.num_gpus=2",
    ]
    return toy_config(tiny_checkpoint, tmp_path, STEPS, extra=[*sim, *extra])


async def test_two_sim_replicas_and_the_sim_trainer_run_the_async_loop(tiny_checkpoint, tmp_path):
    cfg = _sim_config(tiny_checkpoint, tmp_path, "trainer.max_staleness=1")
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    try:
        history = await trainer.fit()
        replicas = await trainer.processes.client.control.stats()
    finally:
        trainer.shutdown()

    episodes = cfg.data.train_batch_size * cfg.rollout.n
    assert [h["trainer/episodes"] for h in history] == [episodes] * STEPS
    assert [h["trainer/version"] for h in history] == [1.0, 2.0]
    assert max(h.get("async/staleness/max", 0) for h in history) <= 1
    # Every replica serves the last pushed version, and its GPU time was modeled.
    assert [r["weight_version"] for r in replicas] == [STEPS, STEPS]
    assert all(r["backend"] == "sim" and r["busy_s"] > 0 for r in replicas)
    # The update slept its modeled time (scaled); the rollout's log-probs were the policy's.
    for h in history:
        assert h["timing/train"] >= SCALE * h["actor/sim_update_s"]
        assert h["actor/sim_update_s"] > 0
    checkpoint = torch.load(
        tmp_path / "run" / "checkpoints" / f"step_{STEPS}" / TRAINER_STATE_FILE,
        weights_only=False,
    )
    assert (checkpoint["extra"]["step"], checkpoint["extra"]["version"]) == (STEPS, STEPS)
    assert checkpoint["step"] == STEPS


async def test_the_straggler_options_keep_synchronous_steps_on_one_version(
    tiny_checkpoint, tmp_path
):
    """η = 0 with over-sampling and partial groups: every step trains a full batch of
    groups, each with at least min_group_size episodes, all sampled by the version the
    step starts from (the over-sampled groups that finish a step late are stale, and
    dropped); a partial group's stragglers are cancelled."""
    cfg = _sim_config(
        tiny_checkpoint, tmp_path, "trainer.max_staleness=0", "trainer.oversample_groups=1"
    )
    cfg.trainer.min_group_size = cfg.rollout.n - 1
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    try:
        history = await trainer.fit()
        queue = trainer.batches.queue.metrics()
    finally:
        trainer.shutdown()
    batch = cfg.data.train_batch_size
    for h in history:
        assert batch * (cfg.rollout.n - 1) <= h["trainer/episodes"] <= batch * cfg.rollout.n
        assert h["async/staleness/max"] == 0
    assert [h["trainer/version"] for h in history] == [1.0, 2.0]
    # Every episode that came back went into a batch, was late, was dropped or waits.
    taken = sum(h["trainer/episodes"] for h in history)
    accounted = (
        taken
        + queue.get("async/dropped_stale", 0)
        + len(trainer.batches.queue.pending_episode_ids())
    )
    assert accounted == queue["async/episodes_in"]
    if queue.get("async/partial_groups", 0):
        assert sum(h["async/aborted_stragglers"] for h in history) > 0


async def _replica_stats_until(trainer, done, timeout_s: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await trainer.processes.client.control.stats()
        if done(stats) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.2)


async def test_an_episode_given_up_is_aborted_on_its_replica(tiny_checkpoint, tmp_path):
    """Cancelling an episode's task in the driver (a partial group's straggler, a stopping
    run) cancels it on its agent-loop worker, whose pending generation ends on the
    replica at once instead of at its length."""
    cfg = _sim_config(
        tiny_checkpoint,
        tmp_path,
        "server.num_replicas=1",
        "server.engine.sim.response_length_median=1500",
        "server.engine.sim.response_length_p99=1500",
        "server.engine.sim.time_scale=1.0",  # 1500 tokens: about 20 s of modeled decode
    )
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    try:
        manager = trainer.processes.manager
        rows = [{"prompt": [{"role": "user", "content": "Count to a thousand."}]}]
        requests = make_requests(rows, 2, manager.default_sampling())
        episodes = [asyncio.create_task(manager.run(r)) for r in requests]
        running = await _replica_stats_until(trainer, lambda s: s[0]["num_running"] == 2)
        assert running[0]["num_running"] == 2
        episodes[0].cancel()
        after = await _replica_stats_until(trainer, lambda s: s[0]["aborted"] == 1, 10.0)
        assert (after[0]["aborted"], after[0]["num_running"]) == (1, 1)
        assert not episodes[1].done()
        episodes[1].cancel()
        await asyncio.gather(*episodes, return_exceptions=True)
    finally:
        trainer.shutdown()
