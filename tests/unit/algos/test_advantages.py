"""Advantage estimators against plain per-row loops in float64."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import (
    AdvantageInputs,
    Advantages,
    AlgorithmConfig,
    compute_advantages,
    get_adv_estimator,
    register_adv_estimator,
    scores_to_token_rewards,
)

from .common import (
    group_baseline,
    group_uids,
    groups_of,
    ragged_mask,
    randn,
    valid_positions,
)

EPS = 1e-6


def make_inputs(seed: int, batch: int = 9, length: int = 7) -> AdvantageInputs:
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, batch, length)
    scores = torch.randint(0, 3, (batch,), generator=gen).double()  # ties make zero-std groups
    rewards = scores_to_token_rewards(scores, mask) + 0.1 * randn(gen, batch, length) * mask
    return AdvantageInputs(
        token_level_rewards=rewards,
        response_mask=mask,
        index=group_uids(gen, batch),
        values=randn(gen, batch, length),
        reward_baselines=randn(gen, batch),
    )


def seq_scores(inputs):
    return [
        sum(r[t] for t in valid_positions(m))
        for r, m in zip(
            inputs.token_level_rewards.tolist(), inputs.response_mask.tolist(), strict=True
        )
    ]


def broadcast(inputs, per_row):
    mask = inputs.response_mask.tolist()
    return [[per_row[i] if m > 0 else 0.0 for m in mrow] for i, mrow in enumerate(mask)]


def whiten(matrix, mask):
    vals = [
        x
        for row, mrow in zip(matrix, mask, strict=True)
        for x, m in zip(row, mrow, strict=True)
        if m > 0
    ]
    n = len(vals)
    mean = sum(vals) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
    return [
        [
            (x - mean) / math.sqrt(var + 1e-8) if m > 0 else 0.0
            for x, m in zip(row, mrow, strict=True)
        ]
        for row, mrow in zip(matrix, mask, strict=True)
    ]


def ref_gae(inputs, gamma, lam):
    rewards, values = inputs.token_level_rewards.tolist(), inputs.values.tolist()
    mask = inputs.response_mask.tolist()
    adv = [[0.0] * len(r) for r in rewards]
    ret = [[0.0] * len(r) for r in rewards]
    for i, mrow in enumerate(mask):
        pos = valid_positions(mrow)
        running = 0.0
        for k in reversed(range(len(pos))):
            t = pos[k]
            next_value = values[i][pos[k + 1]] if k + 1 < len(pos) else 0.0
            delta = rewards[i][t] + gamma * next_value - values[i][t]
            running = delta + gamma * lam * running
            adv[i][t] = running
            ret[i][t] = running + values[i][t]
    return whiten(adv, mask), ret


def ref_grpo(inputs, norm_by_std):
    scores = seq_scores(inputs)
    adv = [0.0] * len(scores)
    for members in groups_of(inputs.index).values():
        mean, std = group_baseline([scores[i] for i in members])
        for i in members:
            adv[i] = (scores[i] - mean) / (std + EPS) if norm_by_std else scores[i] - mean
    return broadcast(inputs, adv)


def ref_rloo(inputs):
    scores = seq_scores(inputs)
    adv = list(scores)
    for members in groups_of(inputs.index).values():
        if len(members) > 1:
            for i in members:
                others = [scores[j] for j in members if j != i]
                adv[i] = scores[i] - sum(others) / len(others)
    return broadcast(inputs, adv)


def ref_reinforce_pp(inputs, gamma):
    rewards, mask = inputs.token_level_rewards.tolist(), inputs.response_mask.tolist()
    returns = [[0.0] * len(r) for r in rewards]
    for i, mrow in enumerate(mask):
        running = 0.0
        for t in reversed(valid_positions(mrow)):
            running = rewards[i][t] + gamma * running
            returns[i][t] = running
    return whiten(returns, mask), returns


def ref_reinforce_pp_baseline(inputs):
    scores = seq_scores(inputs)
    centered = list(scores)
    for members in groups_of(inputs.index).values():
        if len(members) > 1:
            mean = sum(scores[i] for i in members) / len(members)
            for i in members:
                centered[i] = scores[i] - mean
    return whiten(broadcast(inputs, centered), inputs.response_mask.tolist())


def ref_remax(inputs):
    rewards, mask = inputs.token_level_rewards.tolist(), inputs.response_mask.tolist()
    baselines = inputs.reward_baselines.tolist()
    adv = [[0.0] * len(r) for r in rewards]
    ret = [[0.0] * len(r) for r in rewards]
    for i, mrow in enumerate(mask):
        pos = valid_positions(mrow)
        for t in pos:
            ret[i][t] = sum(rewards[i][k] for k in pos if k >= t)
            adv[i][t] = ret[i][t] - baselines[i]
    return adv, ret


def ref_opo(inputs):
    scores = seq_scores(inputs)
    lengths = [len(valid_positions(m)) for m in inputs.response_mask.tolist()]
    adv = list(scores)
    for members in groups_of(inputs.index).values():
        if len(members) > 1:
            total = sum(lengths[i] for i in members)
            base = sum(lengths[i] * scores[i] for i in members) / total if total else 0.0
            for i in members:
                adv[i] = scores[i] - base
    return broadcast(inputs, adv)


def run(name, inputs, **cfg):
    return compute_advantages(inputs, AlgorithmConfig(adv_estimator=name, **cfg))


def assert_close(got, want):
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0))
def test_gae_matches_loop_that_skips_tool_tokens(seed, gamma, lam):
    inputs = make_inputs(seed)
    got = run("gae", inputs, gamma=gamma, lam=lam)
    want_adv, want_ret = ref_gae(inputs, gamma, lam)
    assert_close(got.advantages, want_adv)
    assert_close(got.returns, want_ret)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), norm_by_std=st.booleans())
def test_grpo_matches_group_mean_std_loop(seed, norm_by_std):
    inputs = make_inputs(seed)
    got = run("grpo", inputs, norm_adv_by_std_in_grpo=norm_by_std)
    want = ref_grpo(inputs, norm_by_std)
    assert_close(got.advantages, want)
    assert_close(got.returns, want)


@pytest.mark.parametrize("seed", range(5))
def test_dr_grpo_is_grpo_without_std(seed):
    inputs = make_inputs(seed)
    assert_close(run("dr_grpo", inputs).advantages, ref_grpo(inputs, norm_by_std=False))


@pytest.mark.parametrize("seed", range(5))
def test_rloo_uses_leave_one_out_mean(seed):
    inputs = make_inputs(seed)
    assert_close(run("rloo", inputs).advantages, ref_rloo(inputs))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gamma=st.floats(0.5, 1.0))
def test_reinforce_plus_plus_whitens_discounted_returns(seed, gamma):
    inputs = make_inputs(seed)
    got = run("reinforce_plus_plus", inputs, gamma=gamma)
    want_adv, want_ret = ref_reinforce_pp(inputs, gamma)
    assert_close(got.advantages, want_adv)
    assert_close(got.returns, want_ret)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_plus_plus_baseline_whitens_group_centred_scores(seed):
    inputs = make_inputs(seed)
    assert_close(
        run("reinforce_plus_plus_baseline", inputs).advantages, ref_reinforce_pp_baseline(inputs)
    )


@pytest.mark.parametrize("seed", range(5))
def test_remax_subtracts_the_greedy_baseline(seed):
    inputs = make_inputs(seed)
    got = run("remax", inputs)
    want_adv, want_ret = ref_remax(inputs)
    assert_close(got.advantages, want_adv)
    assert_close(got.returns, want_ret)


@pytest.mark.parametrize("seed", range(5))
def test_opo_uses_length_weighted_baseline(seed):
    inputs = make_inputs(seed)
    assert_close(run("opo", inputs).advantages, ref_opo(inputs))


def test_zero_std_group_gives_zero_advantage_and_singleton_keeps_its_score():
    mask = torch.ones(4, 3, dtype=torch.float64)
    scores = torch.tensor([0.7, 0.7, 0.7, 2.0], dtype=torch.float64)
    inputs = AdvantageInputs(
        scores_to_token_rewards(scores, mask), mask, index=["a", "a", "a", "b"]
    )
    for name in ("grpo", "dr_grpo", "rloo", "opo"):
        adv = run(name, inputs).advantages
        torch.testing.assert_close(
            adv[:3], torch.zeros(3, 3, dtype=torch.float64), atol=1e-9, rtol=0
        )
        torch.testing.assert_close(adv[3, 0].item(), 2.0 / (1 + EPS) if name == "grpo" else 2.0)


ALL = (
    "gae",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
)


@pytest.mark.parametrize("name", ALL)
def test_all_masked_rows_get_zero_and_everything_is_finite(name):
    inputs = make_inputs(3)
    everything_masked = AdvantageInputs(
        inputs.token_level_rewards,
        torch.zeros_like(inputs.response_mask),
        inputs.index,
        inputs.values,
        inputs.reward_baselines,
    )
    for batch in (inputs, everything_masked):
        out = run(name, batch)
        assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
        assert torch.all(out.advantages[batch.response_mask == 0] == 0)
        assert torch.all(out.returns[batch.response_mask == 0] == 0)


@pytest.mark.parametrize("name", ("grpo", "rloo", "opo", "reinforce_plus_plus_baseline"))
def test_tensor_and_string_group_keys_agree(name):
    inputs = make_inputs(4)
    ids = {key: i for i, key in enumerate(dict.fromkeys(inputs.index))}
    as_tensor = AdvantageInputs(
        inputs.token_level_rewards,
        inputs.response_mask,
        torch.tensor([ids[k] for k in inputs.index]),
    )
    torch.testing.assert_close(run(name, as_tensor).advantages, run(name, inputs).advantages)


def test_missing_input_is_named():
    inputs = make_inputs(0)
    bare = AdvantageInputs(inputs.token_level_rewards, inputs.response_mask)
    with pytest.raises(ValueError, match="'gae' needs `values`"):
        run("gae", bare)
    with pytest.raises(ValueError, match="'grpo' needs `index`"):
        run("grpo", bare)
    with pytest.raises(ValueError, match="'remax' needs `reward_baselines`"):
        run("remax", bare)


def test_mismatched_shapes_are_rejected_with_the_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        run("grpo", AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 4), index=["a", "b"]))
    with pytest.raises(ValueError, match="3 entries for 2 rows"):
        run("grpo", AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), index=["a", "b", "c"]))


def test_unknown_estimator_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"registered: .*'grpo'"):
        get_adv_estimator("ppo")


def test_custom_estimator_registers_and_duplicates_are_refused(monkeypatch):
    from agentrl.algos import advantages

    monkeypatch.setattr(advantages, "_REGISTRY", dict(advantages._REGISTRY))  # left as found

    @register_adv_estimator("test_zero")
    def zero(inputs, cfg):
        z = torch.zeros_like(inputs.token_level_rewards)
        return Advantages(z, z)

    assert get_adv_estimator("test_zero") is zero
    with pytest.raises(ValueError, match="already registered"):
        register_adv_estimator("test_zero")(lambda inputs, cfg: None)


def test_scores_land_on_the_last_model_token():
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    rewards = scores_to_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 1.0, 0], [0] * 5, [3.0, 0, 0, 0, 0]]
