"""``make_actor_loss``: the entropy term is ``algos.entropy_bonus`` of the same tokens."""

from __future__ import annotations

import torch

from agentrl.algos import AlgorithmConfig, agg_loss
from agentrl.trainer.losses import make_actor_loss
from agentrl.trainer.micro_batch import MicroBatch


def _micro_batch() -> MicroBatch:
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    old = -torch.rand(2, 4, generator=gen)
    return MicroBatch(
        data={
            "response_mask": mask,
            "old_log_probs": old,
            "advantages": torch.randn(2, 4, generator=gen),
        },
        global_num_tokens=int(mask.sum()),
        global_num_seqs=2,
    )


def test_entropy_coeff_subtracts_coeff_times_aggregated_entropy_from_the_loss() -> None:
    micro = _micro_batch()
    log_probs = (micro["old_log_probs"] + 0.05).requires_grad_()
    entropy = torch.rand(2, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()
    plain = AlgorithmConfig()
    with_bonus = AlgorithmConfig.model_validate({"kl": {"entropy_coeff": 0.01}})

    base, base_metrics = make_actor_loss(plain)(log_probs, entropy, micro)
    loss, metrics = make_actor_loss(with_bonus)(log_probs, entropy, micro)

    ent = agg_loss(entropy, micro["response_mask"], "token-mean", denominator=5)
    assert torch.equal(metrics["entropy"], base_metrics["entropy"])
    torch.testing.assert_close(metrics["entropy"], ent.detach())
    torch.testing.assert_close(loss, base - 0.01 * ent)
    (grad,) = torch.autograd.grad(loss - base, entropy)
    expected = -0.01 * micro["response_mask"] / 5
    torch.testing.assert_close(grad, expected)


def test_without_entropy_coeff_the_entropy_is_a_metric_only() -> None:
    micro = _micro_batch()
    log_probs = micro["old_log_probs"].clone().requires_grad_()
    entropy = torch.rand(2, 4).requires_grad_()
    loss, metrics = make_actor_loss(AlgorithmConfig())(log_probs, entropy, micro)
    without, _ = make_actor_loss(AlgorithmConfig())(log_probs, None, micro)
    torch.testing.assert_close(loss, without)
    assert "entropy" in metrics
