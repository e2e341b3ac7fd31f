"""Policy losses: values, gradients and metrics against per-token float64 references."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import LOSS_AGG_MODES, PolicyLossConfig, get_policy_loss, register_policy_loss

from .common import ragged_mask, randn, reference_agg, valid_positions

LOSSES = ("vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo")
CFG = PolicyLossConfig(
    clip_ratio_low=0.2,
    clip_ratio_high=0.28,
    clip_ratio_c=3.0,
    clip_cov_ratio=0.2,
    clip_cov_lb=-10.0,
    clip_cov_ub=10.0,
    kl_cov_ratio=0.2,
    ppo_kl_coef=0.7,
)


def make_batch(seed, batch=6, length=8, spread=0.3):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, batch, length)
    old = -3 * torch.rand(batch, length, generator=gen, dtype=torch.float64)
    new = old + randn(gen, batch, length, scale=spread)
    adv = randn(gen, batch, length)
    weights = torch.rand(batch, length, generator=gen, dtype=torch.float64) * 2
    return old, new, adv, mask, weights


def clip(x, lo, hi):
    return min(max(x, lo), hi)


def ref_ppo(old, new, adv, mask, cfg):
    """Per-token loss, d(loss)/d(log π) and (clip, dual-clip) flags."""
    loss, grad, flags = [], [], []
    for o_row, n_row, a_row in zip(old, new, adv, strict=True):
        lrow, grow, frow = [], [], []
        for o, n, a in zip(o_row, n_row, a_row, strict=True):
            r = math.exp(clip(n - o, -20, 20))
            unclipped = -a * r
            clipped = -a * clip(r, 1 - cfg.clip_low, 1 + cfg.clip_high)
            ppo = max(unclipped, clipped)
            dual = a < 0 and ppo > -a * cfg.clip_ratio_c
            lrow.append(-a * cfg.clip_ratio_c if dual else ppo)
            grow.append(0.0 if dual or clipped > unclipped else -a * r)
            frow.append((clipped > unclipped, dual))
        loss.append(lrow)
        grad.append(grow)
        flags.append(frow)
    return loss, grad, flags


def ref_gspo(old, new, adv, mask, cfg):
    loss, grad, flags = [], [], []
    for o_row, n_row, a_row, m_row in zip(old, new, adv, mask, strict=True):
        pos = valid_positions(m_row)
        s = math.exp(sum(n_row[t] - o_row[t] for t in pos) / len(pos)) if pos else 1.0
        lrow, grow, frow = [], [], []
        for a in a_row:
            unclipped, clipped = -a * s, -a * clip(s, 1 - cfg.clip_low, 1 + cfg.clip_high)
            lrow.append(max(unclipped, clipped))
            grow.append(0.0 if clipped > unclipped else -a * s)
            frow.append((clipped > unclipped, False))
        loss.append(lrow)
        grad.append(grow)
        flags.append(frow)
    return loss, grad, flags


def ref_gpg(old, new, adv, mask, cfg):
    loss = [
        [-a * n for n, a in zip(n_row, a_row, strict=True)]
        for n_row, a_row in zip(new, adv, strict=True)
    ]
    grad = [[-a for a in a_row] for a_row in adv]
    flags = [[(False, False)] * len(r) for r in adv]
    return loss, grad, flags


def ref_cispo(old, new, adv, mask, cfg):
    loss, grad, flags = [], [], []
    for o_row, n_row, a_row in zip(old, new, adv, strict=True):
        lrow, grow, frow = [], [], []
        for o, n, a in zip(o_row, n_row, a_row, strict=True):
            r = math.exp(n - o)
            rc = clip(r, 1 - cfg.clip_low, 1 + cfg.clip_high)
            lrow.append(-rc * a * n)
            grow.append(-rc * a)
            frow.append((rc != r, False))
        loss.append(lrow)
        grad.append(grow)
        flags.append(frow)
    return loss, grad, flags


def ref_geo_mean(old, new, adv, mask, cfg):
    """Each token carries its row loss; the gradient assumes token-mean aggregation."""
    total_tokens = sum(len(valid_positions(m)) for m in mask)
    loss, grad, flags = [], [], []
    for o_row, n_row, a_row, m_row in zip(old, new, adv, mask, strict=True):
        pos = valid_positions(m_row)
        seq_adv = sum(a_row[t] for t in pos) / len(pos) if pos else 0.0
        sign = -1.0 if seq_adv < 0 else 1.0
        kept, frow = [], []
        for o, n in zip(o_row, n_row, strict=True):
            lr = n - o
            lr_clipped = clip(lr, -cfg.clip_low, cfg.clip_high)
            chosen = sign * min(sign * lr, sign * lr_clipped)
            kept.append(chosen)
            frow.append((chosen != lr, False))
        s = math.exp(sum(kept[t] for t in pos) / len(pos)) if pos else 1.0
        loss.append([-seq_adv * s] * len(a_row))
        grad.append(
            [-seq_adv * s / total_tokens if not frow[t][0] else 0.0 for t in range(len(a_row))]
        )
        flags.append(frow)
    return loss, grad, flags


REFERENCES = {
    "vanilla": ref_ppo,
    "gspo": ref_gspo,
    "gpg": ref_gpg,
    "cispo": ref_cispo,
    "geo_mean": ref_geo_mean,
}


def frac(flags, mask, which):
    pairs = [
        (f[which], m)
        for frow, mrow in zip(flags, mask, strict=True)
        for f, m in zip(frow, mrow, strict=True)
    ]
    n = sum(1 for _, m in pairs if m > 0)
    return sum(1 for f, m in pairs if m > 0 and f) / n


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(sorted(REFERENCES)),
    mode=st.sampled_from(LOSS_AGG_MODES),
    weighted=st.booleans(),
)
def test_loss_value_matches_reference(seed, name, mode, weighted):
    old, new, adv, mask, weights = make_batch(seed)
    cfg = CFG.model_copy(update={"loss_agg_mode": mode})
    out = get_policy_loss(name)(
        old, new, adv, mask, cfg, rollout_is_weights=weights if weighted else None
    )
    loss, _, _ = REFERENCES[name](old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), cfg)
    if weighted:
        loss = [
            [x * w for x, w in zip(lr, wr, strict=True)]
            for lr, wr in zip(loss, weights.tolist(), strict=True)
        ]
    assert out.loss.item() == pytest.approx(reference_agg(loss, mask.tolist(), mode), rel=1e-9)


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("seed", range(3))
def test_gradient_and_metrics_match_reference(name, seed):
    old, new, adv, mask, _ = make_batch(seed)
    new = new.clone().requires_grad_(True)
    out = get_policy_loss(name)(old, new, adv, mask, CFG)
    out.loss.backward()
    ref = REFERENCES[name]
    _, grad, flags = ref(old.tolist(), new.detach().tolist(), adv.tolist(), mask.tolist(), CFG)
    n_tokens = mask.sum().item()
    if name != "geo_mean":  # the geo_mean reference already holds the aggregated gradient
        grad = [[g / n_tokens for g in row] for row in grad]
    want_grad = torch.tensor(grad, dtype=torch.float64) * mask
    torch.testing.assert_close(new.grad, want_grad, rtol=1e-9, atol=1e-12)
    m = mask.tolist()
    assert out.metrics["clipfrac"].item() == pytest.approx(frac(flags, m, 0))
    assert out.metrics["clipfrac_lower"].item() == pytest.approx(frac(flags, m, 1))
    want_kl = sum((old - new.detach())[mask.bool()].tolist()) / n_tokens
    assert out.metrics["ppo_kl"].item() == pytest.approx(want_kl, rel=1e-9)


def cov_matrix(adv, logp, mask):
    pos = [(i, t) for i, mrow in enumerate(mask) for t in valid_positions(mrow)]
    a_mean = sum(adv[i][t] for i, t in pos) / len(pos)
    l_mean = sum(logp[i][t] for i, t in pos) / len(pos)
    return pos, {(i, t): (adv[i][t] - a_mean) * (logp[i][t] - l_mean) for i, t in pos}


@pytest.mark.parametrize("seed", range(4))
def test_clip_cov_zeroes_randomly_drawn_high_covariance_tokens(seed):
    old, new, adv, mask, weights = make_batch(seed, batch=8, length=10, spread=0.5)
    cfg = PolicyLossConfig(clip_ratio=0.2, clip_cov_ratio=0.1, clip_cov_lb=0.0, clip_cov_ub=1.5)
    new = new.clone().requires_grad_(True)
    torch.manual_seed(seed)
    out = get_policy_loss("clip_cov")(old, new, adv, mask, cfg, rollout_is_weights=weights)
    out.loss.backward()

    o, n, a, m = old.tolist(), new.detach().tolist(), adv.tolist(), mask.tolist()
    loss, grad, flags = ref_ppo(o, n, a, m, cfg.model_copy(update={"clip_ratio_c": 1e9}))
    pos, cov = cov_matrix(a, n, m)
    candidates = [p for p in pos if not flags[p[0]][p[1]][0] and 0.0 < cov[p] < 1.5]
    num_cut = max(int(0.1 * len(pos)), 1)
    torch.manual_seed(seed)
    cut = {candidates[k] for k in torch.randperm(len(candidates))[:num_cut].tolist()}
    assert len(cut) == min(num_cut, len(candidates)) > 0
    w = weights.tolist()
    loss = [
        [0.0 if (i, t) in cut else x * w[i][t] for t, x in enumerate(r)] for i, r in enumerate(loss)
    ]
    assert out.loss.item() == pytest.approx(reference_agg(loss, m, "token-mean"), rel=1e-9)
    for i, t in cut:
        assert new.grad[i, t] == 0
    for i, t in pos:
        if (i, t) not in cut:
            assert new.grad[i, t].item() == pytest.approx(grad[i][t] * w[i][t] / len(pos), rel=1e-9)
    assert out.metrics["clip_cov_frac"].item() == pytest.approx(len(cut) / len(pos))


@pytest.mark.parametrize("seed", range(4))
def test_kl_cov_penalises_the_top_covariance_tokens(seed):
    old, new, adv, mask, weights = make_batch(seed, batch=8, length=10)
    cfg = PolicyLossConfig(kl_cov_ratio=0.15, ppo_kl_coef=0.7)
    new = new.clone().requires_grad_(True)
    out = get_policy_loss("kl_cov")(old, new, adv, mask, cfg, rollout_is_weights=weights)
    out.loss.backward()

    o, n, a, m, w = (
        old.tolist(),
        new.detach().tolist(),
        adv.tolist(),
        mask.tolist(),
        weights.tolist(),
    )
    pos, cov = cov_matrix(a, n, m)
    top = set(sorted(pos, key=lambda p: cov[p], reverse=True)[: max(int(0.15 * len(pos)), 1)])
    loss = [[0.0] * len(r) for r in a]
    for i, t in pos:
        lr = n[i][t] - o[i][t]
        loss[i][t] = (-a[i][t] * math.exp(lr) + (0.7 * abs(lr) if (i, t) in top else 0.0)) * w[i][t]
        want_grad = -a[i][t] * math.exp(lr) + (0.7 * math.copysign(1, lr) if (i, t) in top else 0)
        assert new.grad[i, t].item() == pytest.approx(want_grad * w[i][t] / len(pos), rel=1e-9)
    assert out.loss.item() == pytest.approx(reference_agg(loss, m, "token-mean"), rel=1e-9)
    assert out.metrics["kl_cov_frac"].item() == pytest.approx(len(top) / len(pos))


def test_kl_cov_with_zero_ratio_is_plain_policy_gradient():
    old, new, adv, mask, _ = make_batch(0)
    cfg = PolicyLossConfig(kl_cov_ratio=0.0)
    out = get_policy_loss("kl_cov")(old, new, adv, mask, cfg)
    want = reference_agg((-adv * (new - old).exp()).tolist(), mask.tolist(), "token-mean")
    assert out.loss.item() == pytest.approx(want, rel=1e-9)
    assert out.metrics["kl_cov_frac"].item() == 0


def test_dual_clip_caps_the_loss_of_a_bad_action_with_a_huge_ratio():
    cfg = PolicyLossConfig(clip_ratio=0.2, clip_ratio_c=3.0)
    new = torch.log(torch.tensor([[10.0, 10.0]], dtype=torch.float64)).requires_grad_(True)
    out = get_policy_loss("vanilla")(
        torch.zeros(1, 2, dtype=torch.float64),
        new,
        torch.tensor([[-1.0, 1.0]]),
        torch.ones(1, 2),
        cfg,
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx((3.0 - 1.2) / 2)
    assert new.grad.tolist() == [[0.0, 0.0]]
    assert out.metrics["clipfrac_lower"].item() == 0.5


def test_clip_higher_lets_positive_ratios_grow_further_than_they_may_shrink():
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28)
    ratios = torch.tensor([[1.25, 1.30, 0.75]], dtype=torch.float64)
    out = get_policy_loss("vanilla")(
        torch.zeros(1, 3, dtype=torch.float64),
        ratios.log(),
        torch.ones(1, 3),
        torch.ones(1, 3),
        cfg,
    )
    assert out.loss.item() == pytest.approx(-(1.25 + 1.28 + 0.75) / 3)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_give_finite_loss_and_gradients(name, dtype):
    gen = torch.Generator().manual_seed(7)
    mask = ragged_mask(gen, 6, 8).to(dtype)
    old = torch.full((6, 8), -1.0, dtype=dtype)
    signs = torch.where(torch.rand(6, 8, generator=gen) < 0.5, -1.0, 1.0).to(dtype)
    new = (old + 50 * signs).requires_grad_(True)
    adv = randn(gen, 6, 8).to(dtype)
    out = get_policy_loss(name)(old, new, adv, mask, CFG, rollout_is_weights=torch.ones_like(old))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert torch.isfinite(new.grad).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", LOSSES)
def test_all_masked_batch_gives_zero_loss_and_finite_gradients(name):
    old, new, adv, _, _ = make_batch(0)
    new = new.clone().requires_grad_(True)
    out = get_policy_loss(name)(old, new, adv, torch.zeros_like(old), CFG)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.all(new.grad == 0)
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", LOSSES)
def test_zero_rollout_is_weights_remove_all_gradient(name):
    old, new, adv, mask, _ = make_batch(1)
    new = new.clone().requires_grad_(True)
    torch.manual_seed(0)
    out = get_policy_loss(name)(old, new, adv, mask, CFG, rollout_is_weights=torch.zeros_like(old))
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.all(new.grad == 0)


def test_unknown_loss_and_duplicate_registration_are_refused():
    with pytest.raises(ValueError, match=r"registered: .*'vanilla'"):
        get_policy_loss("ppo2")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda *a, **k: None)
