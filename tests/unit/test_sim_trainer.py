"""The simulated trainer (workers.backend=sim): its time model, its role groups, bad input,
and the GPUs a modeled cluster asks Ray for (none)."""

from __future__ import annotations

import time

import pytest
import torch

from agentrl.config import load_config
from agentrl.server.deployment import build_rollout_app
from agentrl.trainer.sim import WEIGHT_TAG, SimActorGroup, SimClock, sim_groups
from agentrl.trainer.sim_model import TrainerTimeModel

SIM = ["server.engine.backend=sim", "workers.backend=sim", "model.path=unused"]


def _batch(lengths: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """A left-padded prompt / right-padded response batch of (prompt, response) lengths."""
    prompt = max(p for p, _ in lengths)
    response = max(r for _, r in lengths)
    attention = torch.zeros(len(lengths), prompt + response, dtype=torch.long)
    response_mask = torch.zeros(len(lengths), response)
    for i, (p, r) in enumerate(lengths):
        attention[i, prompt - p : prompt + r] = 1
        response_mask[i, :r] = 1
    return {
        "attention_mask": attention,
        "response_mask": response_mask,
        "rollout_log_probs": -torch.rand(len(lengths), response),
    }


# -- time model, against a hand computation from the profile's constants -------------------


def test_a_forward_pass_costs_the_kaplan_flops_at_the_profiles_mfu():
    model = TrainerTimeModel.named("qwen2.5-7b-h100", 8)
    # Qwen2.5-7B: 7.61e9 parameters, 28 layers, 28 heads x 128; H100 989.4 TFLOP/s, MFU 0.4.
    linear = 2 * 7.61e9 * (100 + 300)
    attention = 2 * 28 * (28 * 128) * (100 * 101 // 2 + 300 * 301 // 2)
    seconds = (linear + attention) / (8 * 989.4e12 * 0.4)
    assert model.pass_s([100, 300]) == pytest.approx(seconds, rel=1e-12)
    # An update is forward + backward (3 passes), 4 with gradient checkpointing, per epoch.
    assert model.update_passes(1, False) == 3 and model.update_passes(2, True) == 8
    assert model.pass_s([100, 300], 3) == pytest.approx(3 * seconds, rel=1e-12)


def test_a_weight_push_is_the_nvlink_gather_then_the_network_send():
    model = TrainerTimeModel.named("llama3.1-8b-h200", 8, push_bandwidth=25e9)
    weights = 8.03e9 * 2  # bf16
    assert model.push_s() == pytest.approx(weights / 450e9 + weights / 25e9, rel=1e-12)


def test_the_config_builds_the_time_model_of_its_settings():
    cfg = load_config(None, [*SIM, "workers.sim.num_gpus=16", "workers.sim.mfu=0.3"])
    model = cfg.workers.sim.time_model()
    assert (model.profile.name, model.num_gpus, model.mfu) == ("qwen2.5-7b-h100", 16, 0.3)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["workers.sim.profile=gpt-9"],
            "unknown simulation profile 'gpt-9'; available: qwen2.5-7b-h100, llama3.1-8b-h200",
        ),
        # 16 bytes x 7.61e9 parameters = 121.8 GB > 77 GB of one H100 after the reserve.
        (["workers.sim.num_gpus=1"], r"num_gpus=1 cannot hold .* 121\.8 GB .*num_gpus >= 2"),
        (["workers.sim.profile=qwen2.5-32b-tp4-h100", "workers.sim.num_gpus=4"], ">= 7"),
        (["workers.sim.mfu=1.5"], "mfu"),
        (["workers.sim.push_bandwidth=0"], "push_bandwidth"),
    ],
)
def test_bad_settings_name_the_wrong_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, [*SIM, *overrides])


def test_a_critic_needs_room_for_its_own_states_when_the_trainer_starts():
    # Actor + critic: 2 x 121.8 GB = 243.5 GB, more than 3 x 77 GB.
    cfg = load_config(None, [*SIM, "workers.sim.num_gpus=3"])
    with pytest.raises(ValueError, match=r"\(actor \+ critic\): 243\.5 GB .*num_gpus >= 4"):
        sim_groups(cfg, with_ref=False, with_critic=True)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["server.engine.backend=vllm"], "needs server.engine.backend in .* got 'vllm'"),
        (["weight_sync.kind=gloo"], "weight_sync.kind=object_store, got 'gloo'"),
    ],
)
def test_a_simulated_trainer_refuses_what_it_cannot_push_to(overrides, message):
    cfg = load_config(None, [*SIM, *overrides])
    with pytest.raises(ValueError, match=message):
        sim_groups(cfg, with_ref=False, with_critic=False)


# -- the role groups -----------------------------------------------------------------------


def test_each_call_sleeps_its_modeled_time_scaled_and_counts_it():
    cfg = load_config(None, [*SIM, "server.engine.sim.time_scale=0.5"])
    actor, ref, critic = sim_groups(cfg, with_ref=True, with_critic=True)
    model, clock = actor.clock.model, actor.clock
    assert clock.time_scale == 0.5 and ref.clock is clock and critic.clock is clock
    # Sequences of 12 + 8000 and 3 + 1000 tokens (prompt + response).
    batch = _batch([(12, 8000), (3, 1000)])
    lengths = [8012, 1003]
    start = time.perf_counter()
    metrics = actor.update_actor(batch, loss_fn=None)
    wall = time.perf_counter() - start
    assert metrics["actor/sim_update_s"] == pytest.approx(model.pass_s(lengths, 3))
    assert wall == pytest.approx(0.5 * model.pass_s(lengths, 3), abs=0.05)
    out = ref.compute_log_prob(batch, with_entropy=True)
    assert torch.equal(out["log_probs"], batch["rollout_log_probs"])
    assert not out["entropy"].any()
    assert not critic.compute_values(batch)["values"].any()
    assert critic.update_critic(batch, None)["critic/sim_update_s"] == pytest.approx(
        model.pass_s(lengths, 3)
    )
    assert clock.busy_s == pytest.approx(
        {
            "actor": model.pass_s(lengths, 3),
            "ref": model.pass_s(lengths),
            "critic": model.pass_s(lengths, 4),
        }
    )


def test_the_weights_are_one_tag_sent_after_the_modeled_push():
    cfg = load_config(None, [*SIM, "workers.sim.time_scale=0.01"])
    actor, _, _ = sim_groups(cfg, with_ref=False, with_critic=False)
    start = time.perf_counter()
    weights = list(actor.named_weights(1024))
    assert time.perf_counter() - start >= 0.01 * actor.clock.model.push_s()
    assert [name for name, _ in weights] == [WEIGHT_TAG]
    assert actor.clock.busy_s == {"push": pytest.approx(actor.clock.model.push_s())}


def test_a_checkpoint_holds_the_update_count_and_the_trainers_extra(tmp_path):
    cfg = load_config(None, SIM)
    clock = SimClock(cfg.workers.sim.time_model(), time_scale=1e-6)
    actor = SimActorGroup(clock, cfg.workers.actor)
    actor.update_actor(_batch([(2, 3)]), None)
    actor.save_checkpoint(str(tmp_path / "step_1"), extra={"step": 1, "version": 1})
    restored = SimActorGroup(clock, cfg.workers.actor)
    assert restored.load_checkpoint(str(tmp_path / "step_1")) == {"step": 1, "version": 1}
    assert restored.updates == 1
    with pytest.raises(FileNotFoundError, match=r"no trainer_state\.pt"):
        restored.load_checkpoint(str(tmp_path / "missing"))


# -- no GPU for a modeled replica ------------------------------------------------------------


@pytest.mark.parametrize(("backend", "gpus"), [("sim", 0), ("null", 0), ("vllm", 1)])
def test_only_a_real_engine_asks_ray_for_a_gpu(monkeypatch, backend, gpus):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = load_config(None, ["model.path=unused", f"server.engine.backend={backend}"])
    deployment = build_rollout_app(cfg.model, cfg.server)._bound_deployment
    assert deployment.ray_actor_options["num_gpus"] == gpus
