"""FSDP2 workers as real Ray actors with gloo on the tiny model.

One Ray start per module; one 2-rank actor group is shared by the tests, which
compare it with plain single-process transformers + torch code on the same data.
"""

from __future__ import annotations

import sys

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from agentrl.core.config import RayConfig
from agentrl.server.launch import init_ray
from agentrl.trainer import (
    ActorConfig,
    ActorGroup,
    CriticConfig,
    CriticGroup,
    LoRAConfig,
    MicroBatch,
    OptimConfig,
    ReferenceConfig,
    ReferenceGroup,
)
from agentrl.trainer.dispatch import mini_batch_ranges, select_rows

pytestmark = pytest.mark.integration

PROMPT, RESPONSE, ROWS = 10, 8, 8
# Adam's step g/(|g| + eps) amplifies a gradient difference dg (float summation order,
# ~1e-8 here) of the elements with |g| near eps to lr·dg/eps: eps=1e-4 keeps that far
# below the 1e-5 parameter tolerance (with the default 1e-8, a few elements differ
# by ~1e-4 after four steps, though losses and grad norms agree to 1e-6).
OPTIM = OptimConfig(
    lr=1e-3,
    eps=1e-4,
    warmup_steps=2,
    schedule="cosine",
    min_lr_ratio=0.1,
    grad_clip=1.0,
    weight_decay=0.01,
)
TOTAL_STEPS = 6


def actor_config() -> ActorConfig:
    # Small token budget: several packed micro-batches per mini-batch and rank.
    return ActorConfig(
        world_size=2,
        num_cpus_per_worker=0.5,
        mini_batch_size=4,
        max_tokens_per_micro_batch=24,
        optim=OPTIM,
    )


def ppo_clip_loss(log_probs, entropy, mb: MicroBatch):
    """Token-mean PPO-clip over the whole mini-batch (normalised by the global count)."""
    mask = mb["response_mask"].float()
    ratio = torch.exp(log_probs - mb["old_log_probs"])
    adv = mb["advantages"]
    per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    clipfrac = (((ratio - 1).abs() > 0.2).float() * mask).sum() / mask.sum().clamp(min=1)
    return (per_token * mask).sum() / mb.global_num_tokens, {"clipfrac": clipfrac}


def make_batch(seed: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """Ragged rows: prompts left-padded, responses right-padded, some tool tokens masked."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (ROWS, PROMPT + RESPONSE), generator=g)
    attn = torch.zeros_like(ids)
    for row in range(ROWS):
        prompt_len = int(torch.randint(2, PROMPT + 1, (1,), generator=g))
        response_len = int(torch.randint(1, RESPONSE + 1, (1,), generator=g))
        attn[row, PROMPT - prompt_len : PROMPT + response_len] = 1
    ids = ids * attn
    response_mask = attn[:, PROMPT:].clone()
    response_mask[::3, 2:4] = 0  # tool-output tokens: attended, not trained on
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "response_mask": response_mask,
        "advantages": torch.randn(ROWS, RESPONSE, generator=g) * response_mask,
    }


def perturbed(log_probs, batch, seed):
    """``log_probs`` plus noise on the loss tokens: old log-probs whose ratio is not 1."""
    noise = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(seed))
    return log_probs + 0.1 * noise * batch["response_mask"]


def hf_log_probs(model, batch, with_entropy=False):
    """Plain padded HF forward: log-softmax gathered at the response tokens."""
    attn = batch["attention_mask"]
    positions = (attn.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=batch["input_ids"], attention_mask=attn, position_ids=positions).logits
    logits = logits[:, PROMPT - 1 : -1].float()
    log_probs = logits.log_softmax(-1).gather(-1, batch["input_ids"][:, PROMPT:, None]).squeeze(-1)
    valid = attn[:, PROMPT:]
    if not with_entropy:
        return log_probs * valid
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    return log_probs * valid, entropy * valid


def hf_model(checkpoint, named_weights=None):
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    if named_weights is not None:
        model.load_state_dict(dict(named_weights))
    return model


@pytest.fixture(scope="module")
def ray_cluster():
    if ray.is_initialized():  # an earlier module's, left running
        ray.shutdown()
    init_ray(RayConfig(num_cpus=2, log_to_driver=True))
    # The loss functions below travel to the workers, which cannot import this file.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def actor(ray_cluster, tiny_checkpoint):
    group = ActorGroup(actor_config(), str(tiny_checkpoint), total_training_steps=TOTAL_STEPS)
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def vocab_size(tiny_checkpoint):
    return hf_model(tiny_checkpoint).config.vocab_size


def test_full_state_gather_returns_every_hf_parameter_in_buckets(actor, tiny_checkpoint):
    expected = hf_model(tiny_checkpoint).state_dict()
    buckets = list(actor.iter_weight_buckets(bucket_bytes=50_000))
    assert len(buckets) > 1  # 50 kB buckets
    gathered = [pair for bucket in buckets for pair in bucket]
    assert [name for name, _ in gathered] == list(expected)
    for name, tensor in gathered:
        assert tensor.device.type == "cpu"
        assert tensor.shape == expected[name].shape, name
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_compute_log_prob_matches_hf_forward_on_ragged_padded_batch(
    actor, tiny_checkpoint, vocab_size
):
    batch = make_batch(0, vocab_size)
    model = hf_model(tiny_checkpoint, actor.named_weights())
    with torch.no_grad():
        expected_lp, expected_ent = hf_log_probs(model, batch, with_entropy=True)
    out = actor.compute_log_prob(batch, with_entropy=True)
    torch.testing.assert_close(out["log_probs"], expected_lp, rtol=0, atol=2e-5)
    torch.testing.assert_close(out["entropy"], expected_ent, rtol=0, atol=2e-5)

    ref = ReferenceGroup(
        ReferenceConfig(world_size=1, num_cpus_per_worker=0.5, max_tokens_per_micro_batch=40),
        str(tiny_checkpoint),
    )
    try:
        # Temperature divides the logits before the softmax.
        hot = ref.compute_log_prob(batch, temperature=2.0)["log_probs"]
    finally:
        ref.shutdown()
    with torch.no_grad():
        attn = batch["attention_mask"]
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=attn,
            position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        ).logits[:, PROMPT - 1 : -1]
        expected_hot = (
            (logits / 2.0).log_softmax(-1).gather(-1, batch["input_ids"][:, PROMPT:, None])
        )
    torch.testing.assert_close(hot, expected_hot.squeeze(-1) * attn[:, PROMPT:], rtol=0, atol=2e-5)


def test_two_rank_update_matches_single_process(actor, tiny_checkpoint, vocab_size):
    model = hf_model(tiny_checkpoint, actor.named_weights())
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=OPTIM.lr, betas=OPTIM.betas, eps=OPTIM.eps, weight_decay=0.01
    )
    for call in range(2):
        batch = make_batch(10 + call, vocab_size)
        with torch.no_grad():
            old = hf_log_probs(model, batch)
        batch["old_log_probs"] = perturbed(old, batch, seed=call)

        metrics = actor.update_actor(batch, ppo_clip_loss)

        factor = (call + 1) / OPTIM.warmup_steps  # warmup: steps 0 and 1
        for group in optimizer.param_groups:
            group["lr"] = OPTIM.lr * factor
        losses, norms = [], []
        for rows in mini_batch_ranges(ROWS, 4):
            mini = select_rows(batch, list(rows))
            mask = mini["response_mask"]
            whole = MicroBatch(mini, int(mask.sum()), int((mask.sum(1) > 0).sum()))
            loss, _ = ppo_clip_loss(hf_log_probs(model, mini), None, whole)
            loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())

        assert metrics["actor/num_optimizer_steps"] == 2
        assert metrics["actor/lr"] == pytest.approx(OPTIM.lr * factor)
        assert metrics["actor/loss"] == pytest.approx(sum(losses) / 2, abs=1e-5)
        assert metrics["actor/grad_norm"] == pytest.approx(sum(norms) / 2, rel=1e-5)
        assert 0 <= metrics["actor/clipfrac"] <= 1

    expected = model.state_dict()
    start = hf_model(tiny_checkpoint).state_dict()
    weights = dict(actor.named_weights())
    max_diff = max((weights[n] - t).abs().max().item() for n, t in expected.items())
    max_change = max((weights[n] - t).abs().max().item() for n, t in start.items())
    print(f"max |fsdp - single| = {max_diff:.2e}, max |update| = {max_change:.2e}")
    assert max_diff <= 1e-5
    assert max_change > 1e-3


def test_checkpoint_resume_reproduces_next_steps_and_hf_export_loads(
    actor, tiny_checkpoint, vocab_size, tmp_path
):
    def step(group, seed):
        batch = make_batch(seed, vocab_size)
        old = group.compute_log_prob(batch)["log_probs"]
        batch["old_log_probs"] = perturbed(old, batch, seed)
        return group.update_actor(batch, ppo_clip_loss)

    actor.save_checkpoint(str(tmp_path / "ckpt"), extra={"dataloader": {"epoch": 1, "index": 7}})
    before = [step(actor, 20), step(actor, 21)]

    actor.export_hf(str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    weights = dict(actor.named_weights())
    for name, tensor in exported.state_dict().items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0)
    batch = make_batch(5, vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(
            hf_log_probs(exported, batch),
            actor.compute_log_prob(batch)["log_probs"],
            rtol=0,
            atol=2e-5,
        )

    # A fresh group (new processes) resumes from the checkpoint. It keeps each layer's
    # gathered parameters from forward to backward and attends with masked SDPA over
    # each whole packed micro-batch: the same steps must follow.
    config = actor_config()
    config.fsdp.reshard_after_forward = False
    config.fsdp.attn_implementation = "sdpa"
    resumed = ActorGroup(config, str(tiny_checkpoint), total_training_steps=TOTAL_STEPS)
    try:
        extra = resumed.load_checkpoint(str(tmp_path / "ckpt"))
        after = [step(resumed, 20), step(resumed, 21)]
    finally:
        resumed.shutdown()
    assert extra == {"dataloader": {"epoch": 1, "index": 7}}
    for a, b in zip(before, after, strict=True):
        assert b["actor/lr"] == a["actor/lr"]
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=1e-6)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)


def clipped_value_loss(values, mb: MicroBatch):
    mask = mb["response_mask"].float()
    old = mb["values"]
    clipped = old + (values - old).clamp(-0.5, 0.5)
    err = torch.maximum((values - mb["returns"]) ** 2, (clipped - mb["returns"]) ** 2)
    return 0.5 * (err * mask).sum() / mb.global_num_tokens, {}


def test_critic_learns_returns_with_clipped_value_loss(ray_cluster, tiny_checkpoint, vocab_size):
    config = CriticConfig(
        world_size=2,
        num_cpus_per_worker=0.5,
        mini_batch_size=8,
        max_tokens_per_micro_batch=32,
        optim=OptimConfig(lr=1e-2),
    )
    critic = CriticGroup(config, str(tiny_checkpoint))
    try:
        batch = make_batch(3, vocab_size)
        batch["returns"] = batch["response_mask"].float()
        values = critic.compute_values(batch)["values"]
        assert values.shape == (ROWS, RESPONSE)
        assert torch.all(values == 0)  # zero-initialised head
        losses = []
        for _ in range(4):
            batch["values"] = critic.compute_values(batch)["values"]
            losses.append(critic.update_critic(batch, clipped_value_loss)["critic/loss"])
    finally:
        critic.shutdown()
    assert losses[0] == pytest.approx(0.5)  # values 0, returns 1 on every loss token
    assert losses[-1] < 0.5 * losses[0]


def test_lora_actor_trains_adapters_and_exports_merged_hf_weights(
    ray_cluster, tiny_checkpoint, vocab_size, tmp_path
):
    pytest.importorskip("peft")
    config = ActorConfig(
        world_size=2,
        num_cpus_per_worker=0.5,
        mini_batch_size=8,
        max_tokens_per_micro_batch=32,
        optim=OptimConfig(lr=1e-2),
        lora=LoRAConfig(rank=4, alpha=8.0),
    )
    lora_actor = ActorGroup(config, str(tiny_checkpoint))
    try:
        batch = make_batch(7, vocab_size)
        before = lora_actor.compute_log_prob(batch)["log_probs"]
        batch["old_log_probs"] = perturbed(before, batch, seed=7)
        lora_actor.update_actor(batch, ppo_clip_loss)
        after = lora_actor.compute_log_prob(batch)["log_probs"]
        merged = dict(lora_actor.named_weights())
        lora_actor.export_hf(str(tmp_path / "hf"))
    finally:
        lora_actor.shutdown()
    base = hf_model(tiny_checkpoint).state_dict()
    assert list(merged) == list(base)  # HF names, adapters merged away
    assert (after - before).abs().max() > 1e-3
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(hf_log_probs(exported, batch), after, rtol=0, atol=2e-5)


def entropy_grad_probe_loss(log_probs, entropy, mb: MicroBatch):
    """PPO-clip loss that reports whether the entropy it got carries a gradient."""
    loss, metrics = ppo_clip_loss(log_probs, entropy, mb)
    return loss, metrics | {"entropy_has_grad": torch.tensor(float(entropy.requires_grad))}


def test_metric_only_entropy_has_no_gradient(actor, vocab_size):
    batch = make_batch(40, vocab_size)
    old = actor.compute_log_prob(batch)["log_probs"]
    batch["old_log_probs"] = perturbed(old, batch, 40)
    for entropy_grad in (True, False):
        metrics = actor.update_actor(
            batch, entropy_grad_probe_loss, with_entropy=True, entropy_grad=entropy_grad
        )
        assert metrics["actor/entropy_has_grad"] == float(entropy_grad)
