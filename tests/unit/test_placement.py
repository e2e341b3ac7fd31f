"""Trainer-rank grouping and resource bundles (no Ray needed)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.placement import (
    PlacementConfig,
    RankPlacement,
    RolloutPlacementConfig,
    group_sizes,
    node_capacities,
    rank_bundle,
    rollout_actor_resources,
)


def test_fixed_ranks_per_node_cuts_ranks_into_node_sized_groups():
    assert group_sizes(16, 8) == [8, 8]
    assert group_sizes(10, 4) == [4, 4, 2]
    assert group_sizes(2, 8) == [2]


def test_auto_group_sizes_fill_the_largest_free_node_first():
    assert group_sizes(6, None, [2, 4, 0]) == [4, 2]
    assert group_sizes(3, None, [8, 8]) == [3]


def test_ranks_that_fit_nowhere_yet_wait_in_groups_of_the_largest_node():
    # 2 of 7 ranks fit now; the rest wait for nodes of (at most) 2 free slots.
    assert group_sizes(7, None, [2, 1]) == [2, 1, 2, 2]
    assert group_sizes(3, None, []) == [1, 1, 1]


def test_node_capacity_is_limited_by_the_scarcest_resource():
    bundle = rank_bundle(num_cpus=2, num_gpus=1, node_resource="agentrl_trainer")
    nodes = [
        {"CPU": 16, "GPU": 8, "agentrl_trainer": 8},
        {"CPU": 3, "GPU": 8, "agentrl_trainer": 8},
        {"CPU": 64, "GPU": 8},  # a rollout node: no trainer slots
    ]
    assert node_capacities(bundle, nodes) == [8, 1, 0]


def test_bundle_leaves_out_zero_amounts_and_counts_one_pool_slot_per_rank():
    assert rank_bundle(0, 1) == {"GPU": 1.0}
    assert rank_bundle(0.5, 0, "agentrl_trainer") == {"CPU": 0.5, "agentrl_trainer": 1.0}
    assert rank_bundle(0, 0) == {}
    with pytest.raises(ValueError, match="empty bundle"):
        node_capacities({}, [{"CPU": 1}])


def test_ranks_map_to_bundles_of_their_node_group_in_order():
    placement = RankPlacement(world_size=5, groups=["g0", "g1"], sizes=[3, 2])
    assert [placement._locate(r) for r in range(5)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    with pytest.raises(ValueError, match="rank 5 outside"):
        placement.options(5)


def test_without_placement_groups_a_rank_only_asks_for_its_pool_slot():
    placement = RankPlacement(world_size=2, resources={"agentrl_trainer": 1.0})
    assert placement.options(1) == {"resources": {"agentrl_trainer": 1.0}}
    assert RankPlacement(world_size=2).options(0) == {}


def test_rollout_replicas_take_one_unit_of_the_rollout_pool_resource():
    assert rollout_actor_resources(RolloutPlacementConfig()) == {}
    assert rollout_actor_resources(RolloutPlacementConfig(node_resource="agentrl_rollout")) == {
        "agentrl_rollout": 1.0
    }


def test_placement_config_rejects_unknown_strategies_and_keys():
    cfg = PlacementConfig.model_validate({"trainer": {"ranks_per_node": 8}})
    assert cfg.trainer.strategy == "STRICT_PACK"
    with pytest.raises(ValidationError):
        PlacementConfig.model_validate({"trainer": {"strategy": "SPREAD_OUT"}})
    with pytest.raises(ValidationError):
        PlacementConfig.model_validate({"trainer": {"ranks_per_nodes": 8}})
