"""DAPO dynamic sampling and overlong punishment."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import DynamicSampler, DynamicSamplingError, filter_groups, overlong_penalty

from .common import group_uids


def ref_filter(metric, index):
    groups: dict[str, list[float]] = {}
    for value, key in zip(metric, index, strict=True):
        groups.setdefault(key, []).append(value)
    return [len(groups[k]) == 1 or len(set(groups[k])) > 1 for k in index]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 20))
def test_filter_keeps_groups_with_differing_rewards_and_singletons(seed, batch):
    gen = torch.Generator().manual_seed(seed)
    index = group_uids(gen, batch)
    metric = torch.randint(0, 2, (batch,), generator=gen).double()
    assert filter_groups(metric, index).tolist() == ref_filter(metric.tolist(), index)


def test_filter_treats_float_noise_free_equal_rewards_as_flat():
    metric = torch.tensor([0.1, 0.1, 0.1, 0.2, 0.3])
    assert filter_groups(metric, ["a", "a", "a", "b", "b"]).tolist() == [False] * 3 + [True] * 2


def gen_batch(rewards_per_group: list[list[float]], tag: str):
    metric = [r for g in rewards_per_group for r in g]
    index = [f"{tag}{g}" for g, rewards in enumerate(rewards_per_group) for _ in rewards]
    return tag, torch.tensor(metric), index


def test_sampler_fills_across_batches_and_drops_surplus_groups():
    sampler: DynamicSampler[str] = DynamicSampler(num_groups=3, max_num_gen_batches=5)
    first = gen_batch([[1, 1], [0, 1], [0, 0]], "a")
    second = gen_batch([[1, 0], [1, 1], [0, 1], [1, 0]], "b")
    assert sampler.add(*first).tolist() == [2, 3]
    assert not sampler.is_full
    assert sampler.add(*second).tolist() == [0, 1, 4, 5]
    assert sampler.is_full
    assert sampler.metrics() == {
        "num_gen_batches": 2.0,
        "num_groups_kept": 3.0,
        "num_groups_filtered": 3.0,
        "num_groups_surplus": 1.0,
        "filtered_group_fraction": 3 / 7,
    }
    parts = sampler.take()
    assert [(b, idx.tolist()) for b, idx in parts] == [("a", [2, 3]), ("b", [0, 1, 4, 5])]
    assert not sampler.is_full and sampler.metrics()["num_gen_batches"] == 0


def test_sampler_raises_a_clear_error_when_generation_budget_runs_out():
    sampler: DynamicSampler[str] = DynamicSampler(num_groups=2, max_num_gen_batches=2)
    sampler.add(*gen_batch([[1, 1], [0, 1]], "a"))
    with pytest.raises(DynamicSamplingError, match=r"kept 1/2 groups .* after 2 generation"):
        sampler.add(*gen_batch([[0, 0]], "b"))
    assert sampler.metrics()["num_gen_batches"] == 2
    assert sampler.metrics()["num_groups_filtered"] == 2


def test_sampler_with_zero_budget_is_unbounded():
    sampler: DynamicSampler[int] = DynamicSampler(num_groups=1, max_num_gen_batches=0)
    for i in range(50):
        sampler.add(i, torch.tensor([1.0, 1.0]), ["x", "x"])
    sampler.add(50, torch.tensor([1.0, 0.0]), ["y", "y"])
    assert sampler.is_full and len(sampler.take()) == 51


def test_sampler_refuses_to_add_when_full_and_bad_arguments():
    sampler: DynamicSampler[int] = DynamicSampler(num_groups=1)
    sampler.add(0, torch.tensor([1.0, 0.0]), ["x", "x"])
    with pytest.raises(RuntimeError, match="call take"):
        sampler.add(1, torch.tensor([1.0, 0.0]), ["x", "x"])
    with pytest.raises(ValueError, match="num_groups must be ≥ 1, got 0"):
        DynamicSampler(num_groups=0)
    with pytest.raises(ValueError, match="max_num_gen_batches must be ≥ 0, got -1"):
        DynamicSampler(num_groups=1, max_num_gen_batches=-1)


def ref_overlong(length, max_len, buffer, factor):
    expected = max_len - buffer
    if length <= expected:
        return 0.0
    return -factor * min((length - expected) / buffer, 1.0)


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_overlong_penalty_ramps_linearly_over_the_buffer(factor):
    lengths = torch.tensor([0, 10, 12, 13, 15, 16, 20])
    got = overlong_penalty(lengths, max_response_length=16, buffer_length=4, penalty_factor=factor)
    want = [ref_overlong(n, 16, 4, factor) for n in lengths.tolist()]
    assert got.tolist() == pytest.approx(want)


def test_overlong_buffer_must_fit_in_the_response():
    with pytest.raises(ValueError, match="got 32"):
        overlong_penalty(torch.tensor([1]), max_response_length=16, buffer_length=32)
