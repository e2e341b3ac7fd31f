"""A training job across a 2-node Ray cluster started on this machine.

Two ``ray start`` processes (a head and a worker with a ``node2`` resource, 1 CPU each,
their own temp dirs and ports; ``local_cluster.py``) form the cluster on loopback; the
test joins it with ``ray.address`` and trains the toy task for 2 steps (HF rollout engine,
1 replica, 2 FSDP ranks of 1 CPU each). Placement must put one rank on each node, in
per-node STRICT_PACK placement groups.
"""

from __future__ import annotations

import pytest
import ray
from local_cluster import cluster_fixture
from toy_task import toy_config

from agentrl.placement import PlacementError, TrainerPlacementConfig, place_ranks
from agentrl.testing.local_cluster import free_port, wait_for
from agentrl.trainer.trainer import Trainer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_fixture(nodes={"head": {}, "node2": {}}, cpus={})


def _node_of(actor: ray.actor.ActorHandle) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


@pytest.mark.asyncio(loop_scope="module")
async def test_training_job_spreads_fsdp_ranks_over_both_nodes(
    cluster, tiny_checkpoint, tmp_path_factory
):
    tmp = tmp_path_factory.mktemp("multinode")
    cfg = toy_config(
        tiny_checkpoint,
        tmp,
        steps=2,
        extra=[
            f"ray.address={cluster.address}",
            "server.engine.backend=hf",
            f"server.http_port={free_port()}",
            "workers.actor.num_cpus_per_worker=1",
            # Small: 2 rows x 2 samples of <= 16 tokens per step, one mini-batch.
            "data.train_batch_size=2",
            "rollout.n=2",
            "rollout.max_response_length=16",
            "workers.actor.mini_batch_size=4",
        ],
    )
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    trainer = Trainer(cfg)
    trainer.setup()
    try:
        placement = trainer.processes.actor.placement
        bundle_nodes = placement.node_ids()
        rank_nodes = [_node_of(actor) for actor in trainer.processes.actor.actors]
        history = await trainer.fit()
    finally:
        trainer.shutdown()
    # One 1-rank STRICT_PACK group per node (each node has 1 CPU); each rank ran on the
    # node its bundle reserved.
    assert placement.sizes == [1, 1]
    assert set(rank_nodes) == nodes
    assert rank_nodes == bundle_nodes
    assert [h["trainer/version"] for h in history] == [1, 2]
    assert (tmp / "run" / "metrics.jsonl").read_text().count("\n") == 2


def test_node_resource_pins_a_rank_to_the_nodes_that_have_it(cluster):
    config = TrainerPlacementConfig(node_resource="node2", ranks_per_node=1)
    placement = place_ranks(1, 0, 0, config, name="pinned")
    try:
        (node,) = placement.node_ids()
    finally:
        placement.remove()
    (node2,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "node2" in n["Resources"]]
    assert node == node2


def test_ranks_the_cluster_cannot_hold_fail_with_the_missing_resources(cluster):
    config = TrainerPlacementConfig(ready_timeout_s=2, ranks_per_node=2)
    with pytest.raises(PlacementError, match=r"not ready after 2s.*'CPU': 1\.0"):
        place_ranks(2, 1, 0, config, name="too-big")
    # The failed groups were removed: both CPUs are free again.
    wait_for(lambda: ray.available_resources().get("CPU", 0) == 2, 10, "free CPUs")
