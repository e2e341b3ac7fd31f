"""``credit: per_turn``: turn returns, GRPO/RLOO over them, and the token layout of the
turn rewards, each against a plain-Python loop; ``broadcast`` stays today's GRPO/RLOO."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentrl.algos import AdvantageInputs, AlgorithmConfig, compute_advantages, turn_returns
from agentrl.algos.turns import turn_layout
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.trainer.batch import Sample, build_batch
from agentrl.trainer.steps import add_advantages

from .common import (
    group_baseline,
    group_uids,
    groups_of,
    ragged_mask,
    randn,
    valid_positions,
)

EPS = 1e-6


def random_turns(gen: torch.Generator, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` turn index: model tokens split into consecutive turns at random."""
    turns = torch.full(mask.shape, -1, dtype=torch.long)
    for i, row in enumerate(mask.tolist()):
        turn = 0
        for t in valid_positions(row):
            turns[i, t] = turn
            if bool(torch.rand((), generator=gen) < 0.3):
                turn += 1
    return turns


def make_inputs(seed: int, batch: int = 10, length: int = 8) -> AdvantageInputs:
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, batch, length)
    rewards = torch.round(randn(gen, batch, length) * 2) / 2 * mask  # ties: zero-std groups
    return AdvantageInputs(
        token_level_rewards=rewards,
        response_mask=mask,
        index=group_uids(gen, batch),
        turn_index=random_turns(gen, mask),
    )


# -- plain-Python references ---------------------------------------------------------


def ref_turn_returns(inputs, gamma):
    """Per row: the turn rewards R_k, then G_k = Σ_{k'≥k} γ^(k'-k) R_k', one at a time."""
    rewards = inputs.token_level_rewards.tolist()
    turns = inputs.turn_index.tolist()
    per_token, first = [], []
    for r, mrow, trow in zip(rewards, inputs.response_mask.tolist(), turns, strict=True):
        pos = valid_positions(mrow)
        num = max((trow[t] for t in pos), default=-1) + 1
        turn_reward = [0.0] * num
        for t in pos:
            turn_reward[trow[t]] += r[t]
        g = [0.0] * num
        for k in range(num):
            g[k] = sum(gamma ** (j - k) * turn_reward[j] for j in range(k, num))
        per_token.append([g[trow[t]] if t in pos else 0.0 for t in range(len(r))])
        first.append(g[0] if num else 0.0)
    return per_token, first


def ref_grpo(credited, scores, mask, index, norm_by_std):
    """(credited - mean_g scores) / (std_g scores + ε) on model tokens."""
    adv = [[0.0] * len(row) for row in credited]
    for members in groups_of(index).values():
        mean, std = group_baseline([scores[i] for i in members])
        for i in members:
            for t in valid_positions(mask[i]):
                centered = credited[i][t] - mean
                adv[i][t] = centered / (std + EPS) if norm_by_std else centered
    return adv


def ref_rloo(credited, scores, mask, index):
    adv = [[0.0] * len(row) for row in credited]
    for members in groups_of(index).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            baseline = sum(others) / len(others) if others else 0.0
            for t in valid_positions(mask[i]):
                adv[i][t] = credited[i][t] - baseline
    return adv


def ref_turn_layout(mask, score, ends, rewards):
    """The documented layout, turn by turn."""
    n = len(mask)
    positions = [t for t in range(n) if mask[t]]
    if not positions:
        return [-1] * n, [0.0] * n
    raw = {t: sum(1 for e in ends if e <= t) for t in positions}
    raw_rewards = [*list(rewards), 0.0]
    present = sorted(set(raw.values()))
    raw_rewards[present[-1]] += score - sum(rewards)
    merged = dict.fromkeys(present, 0.0)
    for k, r in enumerate(raw_rewards):
        before = [p for p in present if p <= k]
        merged[before[-1] if before else present[0]] += r
    turns, token_rewards = [-1] * n, [0.0] * n
    for t in positions:
        turns[t] = present.index(raw[t])
    for raw_k in present:
        last = max(t for t in positions if raw[t] == raw_k)
        token_rewards[last] = merged[raw_k]
    return turns, token_rewards


def run(name, inputs, **cfg):
    return compute_advantages(inputs, AlgorithmConfig(adv_estimator=name, **cfg))


def assert_close(got, want):
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-9)


# -- turn returns and the estimators ----------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gamma=st.floats(0.0, 1.0))
def test_turn_returns_match_the_loop(seed, gamma):
    inputs = make_inputs(seed)
    per_token, first = turn_returns(
        inputs.token_level_rewards, inputs.response_mask, inputs.turn_index, gamma
    )
    want_tokens, want_first = ref_turn_returns(inputs, gamma)
    assert_close(per_token, want_tokens)
    assert_close(first, want_first)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    gamma=st.floats(0.0, 1.0),
    name=st.sampled_from(["grpo", "dr_grpo", "rloo"]),
    norm_by_std=st.booleans(),
)
def test_per_turn_group_estimators_match_the_loop(seed, gamma, name, norm_by_std):
    inputs = make_inputs(seed)
    got = run(name, inputs, credit="per_turn", gamma=gamma, norm_adv_by_std_in_grpo=norm_by_std)
    credited, first = ref_turn_returns(inputs, gamma)
    mask = inputs.response_mask.tolist()
    if name == "rloo":
        want = ref_rloo(credited, first, mask, inputs.index)
    else:
        want = ref_grpo(credited, first, mask, inputs.index, norm_by_std and name == "grpo")
    assert_close(got.advantages, want)
    assert_close(got.returns, want)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(["grpo", "dr_grpo", "rloo"]),
    norm_by_std=st.booleans(),
)
def test_broadcast_is_the_episode_estimator_and_ignores_turns(seed, name, norm_by_std):
    inputs = make_inputs(seed)
    got = run(name, inputs, norm_adv_by_std_in_grpo=norm_by_std)
    mask = inputs.response_mask.tolist()
    scores = [
        sum(r[t] for t in valid_positions(m))
        for r, m in zip(inputs.token_level_rewards.tolist(), mask, strict=True)
    ]
    credited = [[s] * len(m) for s, m in zip(scores, mask, strict=True)]
    if name == "rloo":
        want = ref_rloo(credited, scores, mask, inputs.index)
    else:
        want = ref_grpo(credited, scores, mask, inputs.index, norm_by_std and name == "grpo")
    assert_close(got.advantages, want)
    # The turn index changes nothing under broadcast.
    without_turns = AdvantageInputs(
        inputs.token_level_rewards, inputs.response_mask, index=inputs.index
    )
    again = run(name, without_turns, norm_adv_by_std_in_grpo=norm_by_std)
    assert torch.equal(got.advantages, again.advantages)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_per_turn_with_one_turn_per_row_is_broadcast(name):
    inputs = make_inputs(7)
    one_turn = AdvantageInputs(inputs.token_level_rewards, inputs.response_mask, inputs.index)
    torch.testing.assert_close(
        run(name, one_turn, credit="per_turn", gamma=0.7).advantages,
        run(name, one_turn).advantages,
        rtol=1e-12,
        atol=1e-12,
    )


def test_hand_computed_group_of_two():
    # A: turns rewarded [1, 2]; B: turns rewarded [0, 0, 4]; γ = 0.5.
    # G_A = [1 + 0.5·2, 2] = [2, 2];  G_B = [0.25·4, 0.5·4, 4] = [1, 2, 4].
    # GRPO: mean G_0 = 1.5, std = sqrt(0.5); RLOO: the other's G_0 is the baseline.
    rewards = torch.tensor([[0, 1, 0, 2, 0, 0, 0], [0, 0, 0, 0, 0, 0, 4]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1, 1]], dtype=torch.float64)
    turns = torch.tensor([[0, 0, -1, 1, -1, -1, -1], [0, -1, 1, 1, -1, 2, 2]])
    inputs = AdvantageInputs(rewards, mask, index=["p", "p"], turn_index=turns)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    grpo = run("grpo", inputs, credit="per_turn", gamma=0.5).advantages
    assert_close(grpo, [[a, a, 0, a, 0, 0, 0], [-a, 0, a, a, 0, 5 * a, 5 * a]])
    rloo = run("rloo", inputs, credit="per_turn", gamma=0.5).advantages
    assert_close(rloo, [[1, 1, 0, 1, 0, 0, 0], [-1, 0, 0, 0, 0, 2, 2]])


def test_per_turn_is_refused_with_an_estimator_of_its_own_returns():
    with pytest.raises(ValidationError, match="credit: per_turn works with adv_estimator grpo"):
        AlgorithmConfig(adv_estimator="gae", credit="per_turn")


def test_turn_index_of_the_wrong_shape_is_named():
    inputs = make_inputs(1)
    bad = AdvantageInputs(
        inputs.token_level_rewards, inputs.response_mask, inputs.index, turn_index=torch.zeros(2)
    )
    with pytest.raises(ValueError, match="turn_index"):
        run("grpo", bad, credit="per_turn")


# -- the layout of turn rewards on tokens -----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_turn_layout_matches_the_loop(data):
    length = data.draw(st.integers(0, 12))
    mask = data.draw(st.lists(st.sampled_from([0, 1]), min_size=length, max_size=length))
    ends = sorted(data.draw(st.lists(st.integers(0, length), max_size=5)))
    rewards = data.draw(
        st.lists(st.integers(-4, 4).map(float), min_size=len(ends), max_size=len(ends))
    )
    score = data.draw(st.integers(-8, 8).map(float))
    turns, token_rewards = turn_layout(torch.tensor(mask), score, ends, rewards)
    want_turns, want_rewards = ref_turn_layout(mask, score, ends, rewards)
    assert turns.tolist() == want_turns
    assert token_rewards.tolist() == pytest.approx(want_rewards)
    if any(mask):
        assert float(token_rewards.sum()) == pytest.approx(score)


def test_turn_layout_by_hand():
    mask = torch.tensor([1, 1, 0, 0, 1, 1, 0, 1])
    turns, rewards = turn_layout(mask, 3.0, [2, 6], [0.5, 1.0])
    # Two rewarded turns and a trailing one that gets the rest of the score (3 - 1.5).
    assert turns.tolist() == [0, 0, -1, -1, 1, 1, -1, 2]
    assert rewards.tolist() == [0, 0.5, 0, 0, 0, 1.0, 0, 1.5]
    turns, rewards = turn_layout(mask, 3.0)
    assert turns.tolist() == [0, 0, -1, -1, 0, 0, -1, 0]
    assert rewards.tolist() == [0, 0, 0, 0, 0, 0, 0, 3.0]


@pytest.mark.parametrize(
    ("ends", "rewards", "match"),
    [
        ([2], [1.0, 2.0], "2 turn rewards for 1 turn ends"),
        ([3, 1], [1.0, 2.0], "non-decreasing"),
        ([9], [1.0], r"in \[0, 4\]"),
        ([2], [float("nan")], "finite numbers"),
        ([2], ["1"], "finite numbers"),
    ],
)
def test_malformed_turns_are_refused(ends, rewards, match):
    with pytest.raises(ValueError, match=match):
        turn_layout(torch.ones(4), 1.0, ends, rewards)


# -- through the trainer's batch and advantage step -------------------------------------


def _sample(group: str, mask: list[int], score: float, **extra) -> Sample:
    n = len(mask)
    output = AgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=list(range(3, 3 + n)),
        response_mask=mask,
        response_logprobs=[0.0] * n,
        response_versions=[0 if m else -1 for m in mask],
        extra=extra,
    )
    return Sample(output, group, score)


def test_env_trajectories_get_their_turn_advantages_in_the_batch():
    samples = [
        _sample("g", [1, 1, 0, 1], 3.0, turn_rewards=[1.0, 2.0], turn_ends=[2, 4]),
        _sample("g", [1, 0, 1, 1], 1.0, turn_rewards=[0.0, 1.0], turn_ends=[1, 4]),
    ]
    batch, groups = build_batch(samples, pad_token_id=0)
    cfg = AlgorithmConfig(adv_estimator="rloo", credit="per_turn", gamma=1.0)
    add_advantages(batch, groups, cfg, max_response_length=8)
    # G_A = [3, 2], G_B = [1, 1]: each turn's return minus the other's G_0.
    assert batch["advantages"].tolist() == [[2, 2, 0, 1], [-2, 0, -2, -2]]
    broadcast = dict(batch)
    add_advantages(broadcast, groups, AlgorithmConfig(adv_estimator="rloo"), 8)
    assert broadcast["advantages"].tolist() == [[2, 2, 0, 2], [-2, 0, -2, -2]]
