"""A whole Ray node lost mid-run: its raylet and every process on it, as a preempted
machine, in an async training run (η = 1) on a 2-node cluster on this machine
(``local_cluster.py``).

- The worker node (a rollout replica and an agent-loop worker on it, the other of each
  and the training rank on the head): the run goes on with the head. Serve starts a
  replacement replica there, Ray restarts the lost agent-loop worker there, and the
  episodes the lost processes had in flight run again.
- The node holding one of the 2 FSDP ranks: the run stops with an error that names the
  lost node; when the node is back, the same config resumes from the last checkpoint.

Either way nothing is lost and nothing is trained twice, counted by the trainer's ledger
and by an independent one (``fault_ledger.OptimizerLedger``: the rows the feed handed out
against the rows whose episodes reached the optimizer). Each test records its ledger for
``bench/fault_tolerance.py``; both are ``long_fault`` (minutes each): the bench runs them.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
from fault_ledger import (
    QUICK_ENGINE,
    Ledger,
    OptimizerLedger,
    fault_injected,
    run_shape,
    when_step,
)
from local_cluster import cluster_fixture
from toy_task import toy_config

from agentrl.testing.local_cluster import free_port
from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.group import WorkerGroupError

pytestmark = [
    pytest.mark.integration,
    pytest.mark.long_fault,
    pytest.mark.asyncio(loop_scope="module"),
]

# head: the driver, Serve's controller, one replica slot beyond the first (for the
# replacement), the training rank(s); node2: a replica slot and an FSDP-rank slot.
NODES = {
    "head": {"agentrl_rollout": 2, "agentrl_trainer": 1},
    "node2": {"agentrl_rollout": 1, "agentrl_trainer": 1},
}
ASYNC = ["trainer.max_staleness=1", "rollout.max_response_length=16"]


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_fixture(nodes=NODES, cpus={"head": 2, "node2": 1})


@pytest.fixture
def both_nodes(cluster):
    """node2 alive (back again if an earlier test lost it)."""
    if "node2" not in cluster.processes:
        cluster.add_node("node2")
        cluster.wait_for_nodes(2, timeout_s=120)
    return cluster


def _node_of(actor: ray.actor.ActorHandle) -> str | None:
    """The actor's node; None when it is dead (a replica Serve has not removed yet)."""
    node_id = actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
    try:
        return ray.get(node_id, timeout=60)
    except ray.exceptions.RayActorError:
        return None


def _replica_nodes() -> list[str]:
    """The node of each live rollout replica (Serve names its replica actors)."""
    names = ray.util.list_named_actors(all_namespaces=True)
    replicas = [
        ray.get_actor(a["name"], namespace=a["namespace"])
        for a in names
        if a["name"].startswith("SERVE_REPLICA::") and "RolloutServer" in a["name"]
    ]
    return [node for node in map(_node_of, replicas) if node is not None]


def _worker_nodes(trainer: AsyncTrainer) -> list[str]:
    return [_node_of(worker) for worker in trainer.processes.manager._pool.actors]


async def test_a_lost_worker_node_s_replica_and_episodes_move_to_the_head(
    both_nodes, tiny_checkpoint, tmp_path_factory, record_property
):
    cluster = both_nodes
    ledger, optimizer = Ledger("node_lost: rollout worker node"), OptimizerLedger()
    tmp = tmp_path_factory.mktemp("worker_node")
    steps = 4
    extra = [
        "server.num_replicas=2",
        "rollout.num_workers=2",
        "workers.actor.world_size=1",
        "placement.trainer.node_resource=head",
    ]
    cfg = toy_config(tiny_checkpoint, tmp, steps, [*ASYNC, *QUICK_ENGINE, *_shape(extra, tmp)])
    node2 = cluster.node_id("node2")
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    optimizer.attach(trainer)
    try:
        assert node2 in _replica_nodes()
        # One agent-loop worker per node, however loaded the nodes were when they started.
        assert sorted(_worker_nodes(trainer)) == sorted([cluster.node_id("head"), node2])
        fit = asyncio.create_task(trainer.fit())
        await when_step(trainer, fit, 1)
        lost_at = fault_injected(record_property)
        cluster.kill_node("node2")
        history = await asyncio.wait_for(fit, 900)
        ledger.seconds_to_recover_or_stop = time.monotonic() - lost_at
        replicas_after = _replica_nodes()
    finally:
        trainer.shutdown()
    ledger.keep(optimizer, trainer, lost_at)
    ledger.record_completed_run(history, steps, trainer, record_property)
    assert ledger.completed
    # The replacement replica runs on the head, next to the one that was there.
    assert len(replicas_after) == 2 and node2 not in replicas_after
    # The lost worker's episodes ran again (or, past their retry, count as failed).
    assert ledger.episodes_retried + ledger.episodes_failed >= 1, ledger


async def test_a_lost_fsdp_rank_node_stops_the_run_naming_it_and_it_resumes(
    both_nodes, tiny_checkpoint, tmp_path_factory, record_property
):
    cluster = both_nodes
    ledger, optimizer = Ledger("node_lost: FSDP rank node"), OptimizerLedger()
    tmp = tmp_path_factory.mktemp("rank_node")
    steps = 4
    extra = [
        "workers.actor.world_size=2",
        "placement.trainer.node_resource=agentrl_trainer",
        "placement.trainer.ranks_per_node=1",
        "trainer.save_every=1",
    ]
    overrides = [*ASYNC, *QUICK_ENGINE, *_shape(extra, tmp)]
    node2 = cluster.node_id("node2")
    trainer = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps, overrides))
    trainer.setup()
    optimizer.attach(trainer)
    try:
        fit = asyncio.create_task(trainer.fit())
        await when_step(trainer, fit, 2)
        lost_at = fault_injected(record_property)
        cluster.kill_node("node2")
        names_the_node = rf"rank \d on node {node2[:8]}.*unreachable"
        with pytest.raises(WorkerGroupError, match=names_the_node) as stopped:
            await asyncio.wait_for(fit, 300)
        ledger.seconds_to_recover_or_stop = time.monotonic() - lost_at
        ledger.error = str(stopped.value).splitlines()[0]
    finally:
        trainer.shutdown()
    ledger.steps += trainer.step
    ledger.count_rows(trainer)

    cluster.add_node("node2")
    cluster.wait_for_nodes(2, timeout_s=120)
    resumed = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps, overrides))
    resumed.setup()
    resumed_from = resumed.ledger.feed.state_dict()
    optimizer.attach(resumed)
    try:
        first_step = resumed.step
        history = await asyncio.wait_for(resumed.fit(), 900)
    finally:
        resumed.shutdown()
    ledger.add_run(history)
    ledger.completed, ledger.resumed = len(history) == steps - first_step, True
    ledger.count_rows(resumed, resumed_from)
    ledger.keep(optimizer, resumed, lost_at)
    ledger.record(record_property)
    assert first_step >= 2 and ledger.completed
    assert ledger.seconds_to_recover_or_stop < 120


def _shape(extra: list[str], tmp) -> list[str]:
    """A node-loss run's overrides: its own, then the bench's shape (``run_shape``)."""
    return [
        f"server.http_port={free_port()}",
        "placement.rollout.node_resource=agentrl_rollout",
        *extra,
        *run_shape(tmp),
    ]
