"""Where training ranks and rollout replicas run on a Ray cluster.

Two resource pools share a cluster: the **trainer pool** (FSDP ranks, one Ray actor
each) and the **rollout pool** (Ray Serve replicas, one engine each). A pool is pinned
to its nodes by a custom Ray resource that only those nodes advertise, e.g.

    ray start --address=HEAD:6379 --resources='{"agentrl_trainer": 8}'   # 8 rank slots
    ray start --address=HEAD:6379 --resources='{"agentrl_rollout": 8}'   # 8 replica slots

with ``placement.trainer.node_resource=agentrl_trainer`` and
``placement.rollout.node_resource=agentrl_rollout``; each rank or replica takes one unit.

Trainer ranks are placed with Ray placement groups: one ``STRICT_PACK`` group per node,
``ranks_per_node`` bundles each (``{CPU, GPU, node_resource}`` of one rank), so the ranks
of a node share it and NCCL uses the fast intra-node links. Rank ``r`` takes bundle
``r % ranks_per_node`` of group ``r // ranks_per_node`` (rank 0, the rendezvous, is on
the first node). :func:`place_ranks` creates the groups and waits for them, failing with
the missing resources instead of hanging; :meth:`RankPlacement.options` is what each rank
passes to ``.options(...)``. Rollout replicas are placed by Ray Serve;
:func:`rollout_actor_resources` is the custom-resource part of their ``ray_actor_options``.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from agentrl.core.config import Section

logger = logging.getLogger(__name__)


class TrainerPlacementConfig(Section):
    """The trainer pool: how FSDP ranks are grouped onto nodes."""

    strategy: Literal["STRICT_PACK", "PACK", "none"] = Field(
        "STRICT_PACK",
        description="`STRICT_PACK`: one placement group per node holding `ranks_per_node` "
        "ranks (a group never straddles nodes); `PACK`: the same groups, packed best-effort "
        "(a group may straddle nodes when none fits it); `none`: no placement groups "
        "(Ray's default scheduler places each rank).",
    )
    ranks_per_node: int | None = Field(
        None,
        ge=1,
        description="Ranks per placement group, i.e. per node (usually GPUs per trainer "
        "node). None = as many as each node's free resources hold, largest node first; "
        "set it on autoscaling clusters, whose nodes are not there yet.",
    )
    node_resource: str | None = Field(
        None,
        description="Custom Ray resource that marks trainer nodes (e.g. `agentrl_trainer`); "
        "each rank takes one unit. None = any node with the CPUs/GPUs.",
    )
    ready_timeout_s: float = Field(
        600.0,
        gt=0,
        description="How long to wait for the placement groups (or an autoscaler to add "
        "nodes) before failing with the resources that are missing.",
    )


class RolloutPlacementConfig(Section):
    """The rollout pool: which nodes take Ray Serve rollout replicas."""

    node_resource: str | None = Field(
        None,
        description="Custom Ray resource that marks rollout nodes (e.g. `agentrl_rollout`); "
        "each replica takes one unit. None = any node with the CPUs/GPUs.",
    )


class PlacementConfig(Section):
    """Resource pools of a (multi-node) Ray cluster: trainer ranks vs rollout replicas."""

    trainer: TrainerPlacementConfig = Field(default_factory=TrainerPlacementConfig)
    rollout: RolloutPlacementConfig = Field(default_factory=RolloutPlacementConfig)


class PlacementError(RuntimeError):
    """The cluster cannot hold the requested ranks (within the timeout)."""


def rank_bundle(
    num_cpus: float, num_gpus: float, node_resource: str | None = None
) -> dict[str, float]:
    """The resources of one rank as a placement-group bundle (zero amounts left out)."""
    bundle = {"CPU": float(num_cpus), "GPU": float(num_gpus)}
    if node_resource:
        bundle[node_resource] = 1.0
    return {k: v for k, v in bundle.items() if v > 0}


def group_sizes(
    world_size: int, ranks_per_node: int | None, node_capacities: list[int] | None = None
) -> list[int]:
    """How many ranks each placement group (node) holds, in rank order.

    With ``ranks_per_node`` the ranks are cut into groups of that size (the last may be
    smaller). Without it, ``node_capacities`` (ranks each node can hold now) are filled
    largest first; ranks that fit nowhere yet form groups of the largest capacity (at
    least one rank), which wait for resources to free up or nodes to join.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if ranks_per_node is not None:
        return [min(ranks_per_node, world_size - s) for s in range(0, world_size, ranks_per_node)]
    sizes = []
    left = world_size
    for capacity in sorted((c for c in node_capacities or [] if c > 0), reverse=True):
        if left == 0:
            break
        sizes.append(min(capacity, left))
        left -= sizes[-1]
    chunk = max([1, *(node_capacities or [])])
    while left > 0:
        sizes.append(min(chunk, left))
        left -= sizes[-1]
    return sizes


def node_capacities(bundle: Mapping[str, float], nodes: list[Mapping[str, float]]) -> list[int]:
    """How many copies of ``bundle`` (non-empty) fit in each node's free resources."""
    if not bundle:
        raise ValueError("an empty bundle fits anywhere; placement groups need resources")
    return [
        min(math.floor(free.get(k, 0.0) / v + 1e-9) for k, v in bundle.items()) for free in nodes
    ]


def rollout_actor_resources(config: RolloutPlacementConfig) -> dict[str, float]:
    """Custom resources of one rollout replica (``ray_actor_options["resources"]``)."""
    return {config.node_resource: 1.0} if config.node_resource else {}


@dataclass
class RankPlacement:
    """Ray actor options for each rank of one worker group, and the groups behind them."""

    world_size: int
    resources: dict[str, float] = field(default_factory=dict)
    groups: list[Any] = field(default_factory=list)  # ray PlacementGroup, rank order
    sizes: list[int] = field(default_factory=list)

    def options(self, rank: int) -> dict[str, Any]:
        """Keyword arguments for ``RemoteClass.options(...)`` of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        options: dict[str, Any] = {}
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.groups:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group, bundle = self._locate(rank)
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.groups[group], placement_group_bundle_index=bundle
            )
        return options

    def node_ids(self) -> list[str]:
        """The node id of each rank's bundle (after the groups are ready)."""
        from ray.util import placement_group_table

        ids = []
        for rank in range(self.world_size):
            group, bundle = self._locate(rank)
            ids.append(placement_group_table(self.groups[group])["bundles_to_node_id"][bundle])
        return ids

    def remove(self) -> None:
        """Release the placement groups (their actors must be gone or are killed)."""
        from ray.util import remove_placement_group

        for group in self.groups:
            remove_placement_group(group)
        self.groups = []

    def describe(self) -> str:
        if not self.groups:
            return f"{self.world_size} ranks, Ray default scheduling"
        return f"{self.world_size} ranks in {len(self.groups)} placement group(s) of {self.sizes}"

    def _locate(self, rank: int) -> tuple[int, int]:
        for group, size in enumerate(self.sizes):
            if rank < size:
                return group, rank
            rank -= size
        raise AssertionError("sizes do not add up to world_size")


def place_ranks(
    world_size: int,
    num_cpus: float,
    num_gpus: float,
    config: TrainerPlacementConfig | None = None,
    *,
    name: str = "agentrl",
) -> RankPlacement:
    """Create (and wait for) the placement groups of ``world_size`` ranks.

    A rank that reserves nothing (no CPU, GPU or node resource) cannot be placed by a
    placement group; such ranks use Ray's default scheduling. Raises
    :class:`PlacementError` naming the missing resources when the groups are not ready
    within ``config.ready_timeout_s``.
    """
    import ray
    from ray.util import placement_group, remove_placement_group

    from agentrl.server.ray_compat import free_resources_per_node

    config = config or TrainerPlacementConfig()
    bundle = rank_bundle(num_cpus, num_gpus, config.node_resource)
    resources = {config.node_resource: 1.0} if config.node_resource else {}
    if config.strategy == "none" or not bundle:
        if config.strategy != "none":
            logger.info("%s: ranks reserve no resources; no placement groups", name)
        return RankPlacement(world_size, resources)
    capacities = None
    if config.ranks_per_node is None and (free := free_resources_per_node()) is not None:
        capacities = node_capacities(bundle, free)
    sizes = group_sizes(world_size, config.ranks_per_node, capacities)
    tag = f"{name}-{uuid.uuid4().hex[:8]}"  # group names are unique cluster-wide
    groups = [
        placement_group([bundle] * size, strategy=config.strategy, name=f"{tag}-node{i}")
        for i, size in enumerate(sizes)
    ]
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=0)
    if len(ready) < len(groups):
        logger.info(
            "%s: waiting up to %.0fs for %d placement group(s) of %s × %s",
            name,
            config.ready_timeout_s,
            len(groups),
            sizes,
            bundle,
        )
        ready, _ = ray.wait(
            [g.ready() for g in groups], num_returns=len(groups), timeout=config.ready_timeout_s
        )
    if len(ready) < len(groups):
        for group in groups:
            remove_placement_group(group)
        raise PlacementError(
            f"{name}: {len(groups) - len(ready)} of {len(groups)} placement groups "
            f"({config.strategy}, ranks per group {sizes}, each rank {bundle}) not ready "
            f"after {config.ready_timeout_s:.0f}s; free resources per node: "
            f"{_free_resources_text()}. Add nodes with these resources, lower "
            "placement.trainer.ranks_per_node or the per-worker CPUs/GPUs, or check "
            "placement.trainer.node_resource against the nodes' `ray start --resources`."
        )
    placement = RankPlacement(world_size, resources, groups, sizes)
    logger.info("%s: %s", name, placement.describe())
    return placement


def _free_resources_text() -> str:
    """What is free: per node, or on Ray's public API path the cluster's total."""
    import ray

    from agentrl.server.ray_compat import free_resources_per_node

    free = free_resources_per_node()
    if free is None:
        return f"unknown (Ray public API path); cluster-wide {ray.available_resources()}"
    return str(free)
