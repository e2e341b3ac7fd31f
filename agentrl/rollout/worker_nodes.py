"""Which node each agent-loop worker starts on.

Workers that ask Ray for no CPUs (``rollout.worker_num_cpus=0``, the default) are dealt
round-robin over the alive nodes that offer CPUs, the driver's node first, so that with
as many workers as nodes every node has one, whatever the load when they start: a lost
node then takes only its share of the episodes in flight. Ray's ``"SPREAD"`` is best
effort and can put every worker on one node. Each worker is pinned softly
(``NodeAffinitySchedulingStrategy(soft=True)``): when its node is gone, Ray restarts it
on another.

Workers that ask for CPUs keep ``"SPREAD"``: pinned to a node whose CPUs are taken (by
trainer ranks, say), a worker would wait for them however long that takes, where
``"SPREAD"`` places it on a node with room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

SchedulingStrategy = NodeAffinitySchedulingStrategy | str


def worker_scheduling(count: int, num_cpus: float) -> list[SchedulingStrategy]:
    """The scheduling strategy of each of ``count`` workers on the connected cluster."""
    if num_cpus > 0:
        return ["SPREAD"] * count
    order = node_order(ray.nodes(), ray.get_runtime_context().get_node_id())
    return [NodeAffinitySchedulingStrategy(node_id, soft=True) for node_id in deal(order, count)]


def node_order(nodes: Sequence[Mapping[str, Any]], driver_node: str) -> list[str]:
    """The alive nodes' ids in the order workers are dealt to them: the driver's node
    first, then the others by id. Nodes that offer no CPUs (a head started with
    ``--num-cpus=0`` to keep work off it) come only when no node offers any."""
    alive = [node for node in nodes if node["Alive"]]
    with_cpus = [node for node in alive if node["Resources"].get("CPU", 0) > 0]
    ids = sorted(node["NodeID"] for node in with_cpus or alive)
    if driver_node in ids:
        ids.remove(driver_node)
        ids.insert(0, driver_node)
    return ids


def deal(node_ids: Sequence[str], count: int) -> list[str]:
    """Round-robin: worker ``i`` goes to ``node_ids[i % len(node_ids)]``."""
    if not node_ids:
        raise ValueError("no alive Ray node to start agent-loop workers on")
    return [node_ids[i % len(node_ids)] for i in range(count)]
