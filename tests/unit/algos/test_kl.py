"""KL estimators, KL penalty and loss, entropy: against scalar float64 formulas."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import (
    AdaptiveKLController,
    FixedKLController,
    KLConfig,
    apply_kl_penalty,
    entropy_bonus,
    entropy_from_logits,
    kl_estimate,
    kl_loss,
)

from .common import EXP_REL_TOL, ragged_mask, randn, reference_agg, valid_positions


def ref_kl(lp, ref, kind):
    d = lp - ref
    if kind in ("k1", "kl"):
        return d
    if kind == "abs":
        return abs(d)
    if kind in ("k2", "mse"):
        return 0.5 * d * d
    neg = min(max(-d, -20.0), 20.0)
    return min(max(math.exp(neg) - neg - 1, -10.0), 10.0)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"])
def test_estimators_match_scalar_formulas(kind):
    gen = torch.Generator().manual_seed(0)
    lp, ref = randn(gen, 5, 6), randn(gen, 5, 6)
    got = kl_estimate(lp, ref, kind)
    want = [
        [ref_kl(a, b, kind) for a, b in zip(r1, r2, strict=True)]
        for r1, r2 in zip(lp.tolist(), ref.tolist(), strict=True)
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_k3_is_clamped_and_has_finite_gradients_at_extreme_ratios():
    lp = torch.tensor([50.0, -50.0, 0.0], requires_grad=True)
    out = kl_estimate(lp, torch.zeros(3), "k3")
    out.sum().backward()
    assert out.tolist() == pytest.approx([10.0, 10.0, 0.0])
    assert torch.isfinite(lp.grad).all()


def test_unknown_estimator_is_named():
    with pytest.raises(ValueError, match="'k4'"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    ctrl.update(10.0, n_steps=1000)
    assert ctrl.value == 0.05


@pytest.mark.parametrize(
    ("current", "factor"), [(0.1, 1.0), (0.15, 1 + 0.2 * 0.5), (0.0, 1 - 0.2 * 0.5), (0.11, 1.05)]
)
def test_adaptive_controller_moves_proportionally_with_clipped_error(current, factor):
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current, n_steps=50)
    assert ctrl.value == pytest.approx(0.2 * factor)


def test_a_restored_adaptive_controller_continues_from_its_saved_coefficient():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(0.0, n_steps=50)
    restored = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value != 0.2
    restored.load_state_dict({})  # a checkpoint from before controllers were saved
    assert restored.value == ctrl.value


def test_a_fixed_controller_keeps_the_config_s_coefficient_on_resume():
    saved = FixedKLController(0.05).state_dict()
    resumed = FixedKLController(0.01)  # the resumed run's config asks for another β
    resumed.load_state_dict(saved)
    assert saved == {} and resumed.value == 0.01


def test_config_builds_the_controller_it_names():
    assert isinstance(KLConfig().make_controller(), FixedKLController)
    adaptive = KLConfig(kl_ctrl_type="adaptive", kl_coef=0.3, target_kl=0.05).make_controller()
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target) == (0.3, 0.05)


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_kl_penalty_subtracts_beta_kl_on_model_tokens_and_updates_the_controller(kind):
    gen = torch.Generator().manual_seed(1)
    mask = ragged_mask(gen, 6, 7)
    scores, lp, ref = randn(gen, 6, 7), randn(gen, 6, 7), randn(gen, 6, 7)
    ctrl = AdaptiveKLController(0.1, target_kl=0.5, horizon=60)
    rewards, metrics = apply_kl_penalty(scores, lp, ref, mask, ctrl, kind)

    row_kls = []
    for i, mrow in enumerate(mask.tolist()):
        pos = valid_positions(mrow)
        for t in range(7):
            penalty = 0.1 * ref_kl(lp[i, t].item(), ref[i, t].item(), kind) if t in pos else 0.0
            assert rewards[i, t].item() == pytest.approx(scores[i, t].item() - penalty)
        if pos:
            row_kls.append(
                sum(ref_kl(lp[i, t].item(), ref[i, t].item(), kind) for t in pos) / len(pos)
            )
    current = sum(row_kls) / len(row_kls)
    assert metrics["kl_penalty"].item() == pytest.approx(current)
    assert metrics["kl_coef"].item() == pytest.approx(0.1)
    error = min(max(current / 0.5 - 1, -0.2), 0.2)
    assert ctrl.value == pytest.approx(0.1 * (1 + error * 6 / 60))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_kl_loss_aggregates_the_estimate(mode):
    gen = torch.Generator().manual_seed(2)
    mask = ragged_mask(gen, 5, 6)
    lp, ref = randn(gen, 5, 6), randn(gen, 5, 6)
    want = reference_agg(
        [
            [ref_kl(a, b, "k3") for a, b in zip(r1, r2, strict=True)]
            for r1, r2 in zip(lp.tolist(), ref.tolist(), strict=True)
        ],
        mask.tolist(),
        mode,
    )
    assert kl_loss(lp, ref, mask, "k3", mode).item() == pytest.approx(want)


def test_kl_loss_of_identical_policies_is_zero_with_zero_gradient():
    lp = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    loss = kl_loss(lp, lp.detach(), torch.ones(3, 4))
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(lp.grad == 0)


def test_entropy_matches_the_sum_over_the_vocabulary():
    gen = torch.Generator().manual_seed(3)
    logits = randn(gen, 3, 4, 11, scale=5.0)
    got = entropy_from_logits(logits)
    for idx in [(0, 0), (1, 2), (2, 3)]:
        z = logits[idx].tolist()
        top = max(z)
        norm = sum(math.exp(v - top) for v in z)
        probs = [math.exp(v - top) / norm for v in z]
        want = -sum(p * math.log(p) for p in probs)
        assert got[idx].item() == pytest.approx(want, rel=EXP_REL_TOL)
    # The trainer passes the log-partition it computed for the log-probs.
    log_z = torch.logsumexp(logits, dim=-1)
    torch.testing.assert_close(entropy_from_logits(logits, log_z), got, rtol=0, atol=0)


def test_entropy_is_finite_for_huge_logits_and_extremes_are_right():
    logits = torch.tensor([[1e4, -1e4, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    ent = entropy_from_logits(logits)
    ent.sum().backward()
    assert ent.tolist() == pytest.approx([0.0, math.log(3)], abs=1e-6)
    assert torch.isfinite(logits.grad).all()


def test_entropy_bonus_is_minus_coef_times_aggregated_entropy():
    gen = torch.Generator().manual_seed(4)
    mask = ragged_mask(gen, 4, 5)
    ent = torch.rand(4, 5, generator=gen, dtype=torch.float64)
    want = -0.01 * reference_agg(ent.tolist(), mask.tolist(), "seq-mean-token-sum")
    got = entropy_bonus(ent, mask, 0.01, "seq-mean-token-sum")
    assert got.item() == pytest.approx(want)
