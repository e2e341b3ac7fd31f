"""Rollout importance sampling against a per-token float64 reference of the spec."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import AlgorithmConfig, compute_mismatch_metrics, compute_rollout_is_weights

from .common import EXP_REL_TOL, ragged_mask, randn, valid_positions

IS_STATS = ("mean", "std", "min", "max", "p25", "p50", "p75", "p95", "p99", "eff_sample_size")
SEQ_STATS = ("mean", "std", "min", "max", "max_deviation", "fraction_high", "fraction_low")
MISMATCH = (
    "mismatch_kl",
    "mismatch_k3_kl",
    "mismatch_training_ppl",
    "mismatch_rollout_ppl",
    "mismatch_training_log_ppl",
    "mismatch_rollout_log_ppl",
    "mismatch_ppl_ratio",
    "mismatch_log_ppl_diff",
    "mismatch_log_ppl_abs_diff",
    "mismatch_log_ppl_diff_max",
    "mismatch_log_ppl_diff_min",
)


def expected_keys(level, mode):
    keys = [f"rollout_is_{s}" for s in IS_STATS]
    keys += ["rollout_is_veto_fraction", "rollout_is_catastrophic_token_fraction"]
    if mode == "mask":
        keys.append("rollout_is_masked_fraction")
    if level != "token":
        keys += [f"rollout_is_seq_{s}" for s in SEQ_STATS]
    return {"mismatch/" + k for k in (*keys, *MISMATCH)}


def make_logprobs(seed, batch=7, length=9, spread=0.4):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, batch, length)
    rollout = -3 * torch.rand(batch, length, generator=gen, dtype=torch.float64)
    old = rollout + randn(gen, batch, length, scale=spread)
    return old, rollout, mask


def mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def pop_std(xs):
    m = mean(xs)
    return math.sqrt(mean([(x - m) ** 2 for x in xs]))


def reference(old, rollout, mask, upper, lower, level, mode, veto):
    """Weights and metrics, one row and token at a time, following the spec."""
    log_lower = math.log(lower) if lower > 0 else -math.inf
    weights = [[0.0] * len(r) for r in old]
    raw_tokens, applied_tokens, seq_weights = [], [], []
    catastrophic = vetoed = masked = tokens = nonempty = 0
    for i, mrow in enumerate(mask):
        pos = valid_positions(mrow)
        if not pos:
            continue
        nonempty += 1
        lr = {t: old[i][t] - rollout[i][t] for t in pos}
        is_vetoed = False
        for t in pos:
            if veto is not None and lr[t] < math.log(veto):
                catastrophic += 1
                is_vetoed = True
        vetoed += is_vetoed
        if level == "sequence":
            seq_log_w = sum(lr.values())
        elif level == "geometric":
            seq_log_w = sum(lr.values()) / len(pos)
        if level != "token":
            seq_weights.append(math.exp(min(max(seq_log_w, -20), 20)))
        for t in pos:
            log_w = lr[t] if level == "token" else seq_log_w
            raw = math.exp(min(max(log_w, -20), 20))
            inside = log_lower <= log_w <= math.log(upper)
            if mode == "truncate":
                bounded = min(raw, upper)
            else:
                bounded = raw if inside else 0.0
                masked += not inside
            weights[i][t] = 0.0 if is_vetoed else bounded
            raw_tokens.append(raw)
            applied_tokens.append(weights[i][t])
            tokens += 1
    m = {
        "rollout_is_mean": mean(raw_tokens),
        "rollout_is_std": pop_std(raw_tokens),
        "rollout_is_min": min(raw_tokens, default=0.0),
        "rollout_is_max": max(raw_tokens, default=0.0),
        "rollout_is_veto_fraction": vetoed / nonempty if nonempty else 0.0,
        "rollout_is_catastrophic_token_fraction": catastrophic / tokens if tokens else 0.0,
    }
    for p in (25, 50, 75, 95, 99):
        m[f"rollout_is_p{p}"] = float(np.percentile(raw_tokens, p)) if raw_tokens else 0.0
    second = mean([w * w for w in applied_tokens])
    m["rollout_is_eff_sample_size"] = mean(applied_tokens) ** 2 / second if second > 0 else 0.0
    if mode == "mask":
        m["rollout_is_masked_fraction"] = masked / tokens if tokens else 0.0
    if level != "token":
        m["rollout_is_seq_mean"] = mean(seq_weights)
        m["rollout_is_seq_std"] = pop_std(seq_weights)
        m["rollout_is_seq_min"] = min(seq_weights, default=0.0)
        m["rollout_is_seq_max"] = max(seq_weights, default=0.0)
        m["rollout_is_seq_max_deviation"] = max((abs(w - 1) for w in seq_weights), default=0.0)
        m["rollout_is_seq_fraction_high"] = mean([float(w > upper) for w in seq_weights])
        m["rollout_is_seq_fraction_low"] = mean([float(w < lower) for w in seq_weights])
    m |= reference_mismatch(old, rollout, mask)
    return weights, {"mismatch/" + k: v for k, v in m.items()}


def reference_mismatch(old, rollout, mask):
    kl, k3, train_lp, roll_lp = [], [], [], []
    for i, mrow in enumerate(mask):
        pos = valid_positions(mrow)
        for t in pos:
            d = old[i][t] - rollout[i][t]
            kl.append(-d)
            k3.append(math.exp(min(max(d, -20), 20)) - min(max(d, -20), 20) - 1)
        if pos:
            train_lp.append(-mean([old[i][t] for t in pos]))
            roll_lp.append(-mean([rollout[i][t] for t in pos]))
    diff = [a - b for a, b in zip(train_lp, roll_lp, strict=True)]
    return {
        "mismatch_kl": mean(kl),
        "mismatch_k3_kl": mean(k3),
        "mismatch_training_log_ppl": mean(train_lp),
        "mismatch_training_ppl": mean([math.exp(x) for x in train_lp]),
        "mismatch_rollout_log_ppl": mean(roll_lp),
        "mismatch_rollout_ppl": mean([math.exp(x) for x in roll_lp]),
        "mismatch_ppl_ratio": mean([math.exp(x) for x in diff]),
        "mismatch_log_ppl_diff": mean(diff),
        "mismatch_log_ppl_abs_diff": mean([abs(x) for x in diff]),
        "mismatch_log_ppl_diff_max": max(diff, default=0.0),
        "mismatch_log_ppl_diff_min": min(diff, default=0.0),
    }


def compare(got, want):
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].item() == pytest.approx(value, rel=EXP_REL_TOL, abs=1e-12), key


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    level=st.sampled_from(["token", "sequence", "geometric"]),
    mode=st.sampled_from(["truncate", "mask"]),
    threshold=st.sampled_from([1.2, 2.0, 5.0]),
    lower=st.sampled_from([None, 0.0, 0.7]),
    veto=st.sampled_from([None, 1e-4, 0.6]),
    spread=st.sampled_from([0.05, 0.4, 1.5]),
)
def test_weights_and_metrics_match_the_spec_reference(
    seed, level, mode, threshold, lower, veto, spread
):
    old, rollout, mask = make_logprobs(seed, spread=spread)
    got = compute_rollout_is_weights(
        old,
        rollout,
        mask,
        threshold=threshold,
        threshold_lower=lower,
        level=level,
        mode=mode,
        veto_threshold=veto,
    )
    lower_bound = 1 / threshold if lower is None else lower
    want_w, want_m = reference(
        old.tolist(), rollout.tolist(), mask.tolist(), threshold, lower_bound, level, mode, veto
    )
    torch.testing.assert_close(got.weights, torch.tensor(want_w, dtype=torch.float64))
    assert set(got.metrics) == expected_keys(level, mode)
    compare(got.metrics, want_m)


def test_metrics_only_mode_returns_no_weights_but_every_metric():
    old, rollout, mask = make_logprobs(0)
    applied = compute_rollout_is_weights(old, rollout, mask, threshold=2.0, mode="mask")
    monitored = compute_rollout_is_weights(
        old, rollout, mask, threshold=2.0, mode="mask", apply_weights=False
    )
    assert monitored.weights is None
    assert monitored.metrics.keys() == applied.metrics.keys()
    for key, value in applied.metrics.items():
        assert monitored.metrics[key] == value


def test_no_threshold_switches_rollout_is_off():
    old, rollout, mask = make_logprobs(0)
    assert compute_rollout_is_weights(old, rollout, mask, threshold=None) == (None, {})


def test_sequence_weight_is_the_product_of_token_ratios():
    old = torch.tensor([[0.1, 0.2, 9.0], [0.3, -0.1, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    zeros = torch.zeros_like(old)
    seq = compute_rollout_is_weights(old, zeros, mask, threshold=10.0, level="sequence")
    geo = compute_rollout_is_weights(old, zeros, mask, threshold=10.0, level="geometric")
    assert seq.weights[0].tolist() == pytest.approx([math.exp(0.3)] * 2 + [0.0])
    assert seq.weights[1].tolist() == pytest.approx([math.exp(0.2)] * 3)
    assert geo.weights[0].tolist() == pytest.approx([math.exp(0.15)] * 2 + [0.0])


def test_one_catastrophic_token_vetoes_its_whole_sequence_only():
    rollout = torch.zeros(3, 4, dtype=torch.float64)
    old = torch.zeros(3, 4, dtype=torch.float64)
    old[1, 2] = math.log(1e-5)
    out = compute_rollout_is_weights(old, rollout, torch.ones(3, 4), threshold=2.0)
    assert out.weights[1].tolist() == [0.0] * 4
    assert out.weights[[0, 2]].tolist() == [[1.0] * 4] * 2
    assert out.metrics["mismatch/rollout_is_veto_fraction"].item() == pytest.approx(1 / 3)
    assert out.metrics["mismatch/rollout_is_catastrophic_token_fraction"].item() == 1 / 12


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_extreme_log_ratios_stay_finite_in_float32(level, mode):
    gen = torch.Generator().manual_seed(3)
    mask = ragged_mask(gen, 8, 16).float()
    rollout = torch.full((8, 16), -2.0)
    signs = torch.where(torch.rand(8, 16, generator=gen) < 0.5, -1.0, 1.0)
    old = rollout + 50 * signs
    out = compute_rollout_is_weights(
        old, rollout, mask, threshold=2.0, level=level, mode=mode, veto_threshold=None
    )
    assert torch.isfinite(out.weights).all()
    assert out.weights.max() <= 2.0
    assert all(torch.isfinite(v) for v in out.metrics.values())
    assert out.metrics["mismatch/rollout_is_max"].item() <= math.exp(20) * (1 + 1e-6)


def test_all_masked_batch_gives_zero_weights_and_finite_metrics():
    old, rollout, _ = make_logprobs(1)
    out = compute_rollout_is_weights(
        old, rollout, torch.zeros_like(old), threshold=2.0, level="sequence", mode="mask"
    )
    assert torch.all(out.weights == 0)
    assert all(torch.isfinite(v) and v == 0 for v in out.metrics.values())


def test_padding_log_probs_are_never_read():
    old, rollout, mask = make_logprobs(2)
    clean = compute_rollout_is_weights(old, rollout, mask, threshold=2.0, level="geometric")
    junk_old = torch.where(mask.bool(), old, torch.nan)
    junk_rollout = torch.where(mask.bool(), rollout, -torch.inf)
    junk = compute_rollout_is_weights(
        junk_old, junk_rollout, mask, threshold=2.0, level="geometric"
    )
    torch.testing.assert_close(junk.weights, clean.weights)
    for key, value in clean.metrics.items():
        torch.testing.assert_close(junk.metrics[key], value)


def test_weights_carry_no_gradient():
    old, rollout, mask = make_logprobs(0)
    old.requires_grad_(True)
    out = compute_rollout_is_weights(old, rollout, mask, threshold=2.0)
    assert not out.weights.requires_grad


def test_mismatch_metrics_alone_match_the_reference():
    old, rollout, mask = make_logprobs(5, spread=0.8)
    got = compute_mismatch_metrics(old, rollout, mask)
    want = reference_mismatch(old.tolist(), rollout.tolist(), mask.tolist())
    compare(got, {"mismatch/" + k: v for k, v in want.items()})


def test_identical_policies_show_no_mismatch():
    _, rollout, mask = make_logprobs(6)
    out = compute_rollout_is_weights(rollout.clone(), rollout, mask, threshold=2.0)
    m = {k.removeprefix("mismatch/"): v.item() for k, v in out.metrics.items()}
    assert m["mismatch_kl"] == m["mismatch_k3_kl"] == m["mismatch_log_ppl_abs_diff"] == 0
    assert m["mismatch_ppl_ratio"] == m["rollout_is_mean"] == m["rollout_is_eff_sample_size"] == 1


def test_percentiles_match_numpy_on_a_large_batch():
    gen = torch.Generator().manual_seed(9)
    old = randn(gen, 64, 257, scale=0.3)
    out = compute_rollout_is_weights(
        old, torch.zeros_like(old), torch.ones_like(old), threshold=2.0
    )
    # numpy gets torch's own exp (see EXP_REL_TOL): this test is about the quantile rule.
    raw = old.exp().numpy().ravel()
    for p in (25, 50, 75, 95, 99):
        got = out.metrics[f"mismatch/rollout_is_p{p}"].item()
        assert got == pytest.approx(np.percentile(raw, p), rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold": 0.5}, "must be ≥ 1"),
        ({"threshold": 2.0, "threshold_lower": 3.0}, r"lower threshold 3.0 must lie in \[0, 2.0\]"),
        ({"threshold": -1.0}, "must be > 0"),
        ({"threshold": 2.0, "veto_threshold": 0.0}, "veto_threshold must be > 0"),
        ({"threshold": 2.0, "level": "row"}, "unknown rollout_is_level 'row'"),
        ({"threshold": 2.0, "mode": "clip"}, "unknown rollout_is_mode 'clip'"),
    ],
)
def test_bad_settings_are_rejected_with_the_value(kwargs, match):
    old, rollout, mask = make_logprobs(0)
    with pytest.raises(ValueError, match=match):
        compute_rollout_is_weights(old, rollout, mask, **kwargs)


def test_config_rejects_thresholds_that_cannot_bracket_one():
    with pytest.raises(ValueError, match="must be ≥ 1"):
        AlgorithmConfig(rollout_is_threshold=0.8)
    cfg = AlgorithmConfig(rollout_is_threshold=0.8, rollout_is_threshold_lower=0.5)
    assert cfg.rollout_is_threshold_lower == 0.5
