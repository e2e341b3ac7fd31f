"""Which node each agent-loop worker starts on.

Workers that ask Ray for no CPUs (``rollout.worker_num_cpus=0``, the default) are dealt
round-robin over the alive nodes that offer CPUs, the driver's node first, so that with
as many workers as nodes every node has one, whatever the load when they start: a lost
node then takes only its share of the episodes in flight. Ray's ``"SPREAD"`` is best
effort and can put every worker on one node.

Each worker asks for its node by Ray's node-id label (``label_selector``), with a
``fallback_strategy`` of any other node: while its node is alive it starts there, and
when its node is gone Ray restarts it on another. ``NodeAffinitySchedulingStrategy(
soft=True)`` says the same in its docstring but did not keep it on Ray 2.60: on a
2-node cluster on one machine, 20 of 40 pairs of workers dealt one per node started on
one node (either), where the label selector placed 20 of 20 pairs as dealt and, with a
node killed, restarted its worker on the other node.

Workers that ask for CPUs keep ``"SPREAD"``: pinned to a node whose CPUs are taken (by
trainer ranks, say), a worker would wait for them however long that takes, where
``"SPREAD"`` places it on a node with room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray

NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node: its node id."""


def worker_placement(count: int, num_cpus: float) -> list[dict[str, Any]]:
    """The placement options (``actor_cls.options(**placement)``) of each of ``count``
    workers on the connected cluster."""
    if num_cpus > 0:
        return [{"scheduling_strategy": "SPREAD"}] * count
    order = node_order(ray.nodes(), ray.get_runtime_context().get_node_id())
    return [on_node_while_alive(node_id) for node_id in deal(order, count)]


def on_node_while_alive(node_id: str) -> dict[str, Any]:
    """Options that start an actor on ``node_id``, and on any other node once that one
    is gone (a restart after its node was lost)."""
    return {
        "label_selector": {NODE_ID_LABEL: node_id},
        "fallback_strategy": [{"label_selector": {NODE_ID_LABEL: f"!{node_id}"}}],
    }


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
