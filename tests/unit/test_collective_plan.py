"""Weight-broadcast group: bucket layout, rank layout, and the protocol over real gloo.

The replicas here are a fake ``ControlClient`` whose "workers" are threads holding real
``BroadcastGroup`` ranks, so the sync's rank layout (several workers per replica, as with
tensor parallelism), group reuse and re-forming run without vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import torch

from agentrl.config import WeightSyncConfig, _warn_moved, load_config
from agentrl.core.weights import ALIGN_BYTES, BucketPlan, plans_from_wire
from agentrl.server.collective import (
    BroadcastGroup,
    CollectiveSyncError,
    GroupSpec,
    RankLayout,
    bucket_plans,
    unpack,
)
from agentrl.server.weight_transport import make_weight_sync, receiver_class
from agentrl.server.weight_transport.broadcast import (
    CollectiveBroadcastSync,
    NCCLBroadcastSync,
    cast_floats,
)
from agentrl.server.weight_transport.object_store import ObjectStoreSync


def test_bucket_plan_aligns_every_tensor_and_round_trips_through_the_wire():
    plan = BucketPlan.of(
        [("a", "float32", (3, 5)), ("b", "int64", (7,)), ("c", torch.bfloat16, [2])]
    )
    assert [s.offset for s in plan.slots] == [0, 64, 128]
    assert [s.nbytes for s in plan.slots] == [60, 56, 4]
    assert plan.nbytes == 192 and plan.nbytes % ALIGN_BYTES == 0
    assert plan.slots[2].dtype == "bfloat16"
    assert BucketPlan.from_wire(plan.to_wire()) == plan


def test_bucket_plan_rejects_an_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        BucketPlan.of([("a", "float99", (1,))])


def test_unpack_views_each_tensor_out_of_the_flat_buffer():
    tensors = [("w", torch.randn(4, 3)), ("i", torch.arange(5)), ("h", torch.ones(2).half())]
    (plan,) = bucket_plans([tensors])
    buffer = torch.zeros(plan.nbytes, dtype=torch.uint8)
    for (_, t), slot in zip(tensors, plan.slots, strict=True):
        buffer[slot.offset : slot.offset + slot.nbytes] = t.reshape(-1).view(torch.uint8)
    for (name, want), (got_name, got) in zip(tensors, unpack(buffer, plan), strict=True):
        assert got_name == name and got.dtype == want.dtype and torch.equal(got, want)


def test_rank_layout_gives_each_replica_a_block_in_id_order():
    layout = RankLayout.of({"r-b": 2, "r-a": 1, "r-c": 4})
    assert layout.offsets == {"r-a": 1, "r-b": 2, "r-c": 4}
    assert layout.world_size == 8  # rank 0 + 1 + 2 + 4 workers


@pytest.mark.parametrize(("workers", "message"), [({}, "no rollout replica"), ({"r": 0}, "0")])
def test_rank_layout_rejects_no_replica_or_no_worker(workers, message):
    with pytest.raises(ValueError, match=message):
        RankLayout.of(workers)


def test_cast_floats_changes_only_floating_tensors():
    out = dict(cast_floats([("w", torch.ones(2)), ("i", torch.arange(2))], "bfloat16"))
    assert out["w"].dtype == torch.bfloat16 and out["i"].dtype == torch.int64
    assert dict(cast_floats([("w", torch.ones(2))], None))["w"].dtype == torch.float32


def test_unknown_backends_are_rejected():
    with pytest.raises(ValueError, match="unknown collective backend"):
        CollectiveBroadcastSync(object(), backend="mpi")  # type: ignore[arg-type]
    assert NCCLBroadcastSync(object()).backend == "nccl"  # type: ignore[arg-type]


def test_the_weight_sync_section_picks_the_strategy_and_its_receiver():
    cfg = load_config(None, [])
    sync = make_weight_sync(cfg.weight_sync, object())  # type: ignore[arg-type]
    assert isinstance(sync, ObjectStoreSync) and sync.receiver == "object_store"
    cfg = load_config(None, ["weight_sync.kind=nccl", "weight_sync.timeout_s=30"])
    sync = make_weight_sync(cfg.weight_sync, object())  # type: ignore[arg-type]
    assert isinstance(sync, CollectiveBroadcastSync) and sync.backend == "nccl"
    assert sync._timeout_s == 30 and sync.receiver == "broadcast"
    for kind in ("object_store", "gloo", "nccl"):
        sync = make_weight_sync(WeightSyncConfig(kind=kind), object())  # type: ignore[arg-type]
        assert receiver_class(sync.receiver).kind == sync.receiver
    with pytest.raises(ValueError, match="weight_sync"):
        load_config(None, ["weight_sync.kind=rdma"])


def test_the_old_trainer_weight_sync_keys_still_work_with_one_warning(caplog):
    old = ["trainer.weight_sync=gloo", "trainer.weight_sync_bucket_mb=8"]
    _warn_moved.cache_clear()  # once per process: an earlier test may have warned
    with caplog.at_level(logging.WARNING, logger="agentrl.config"):
        cfg = load_config(None, old)
        load_config(None, old)
    assert cfg.weight_sync.kind == "gloo" and cfg.weight_sync.bucket_mb == 8
    assert cfg.weight_sync.timeout_s == WeightSyncConfig().timeout_s
    warnings = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(warnings) == 1 and "trainer.weight_sync → weight_sync.kind" in warnings[0]
    with pytest.raises(ValueError, match=r"keep weight_sync\.kind"):
        load_config(None, ["trainer.weight_sync=gloo", "weight_sync.kind=nccl"])
    with pytest.raises(ValueError, match="weight_sync"):
        load_config(None, ["trainer.weight_sync=rdma"])


def test_a_missing_rank_times_out_at_the_join_with_a_clear_error():
    spec, store = BroadcastGroup.host(
        "gloo", 3, "g-missing", join_timeout_s=1.0, timeout_s=5.0, addr="127.0.0.1"
    )
    start = time.perf_counter()
    with pytest.raises(CollectiveSyncError, match=r"waited .* for 3 ranks .*\(1 joined\)"):
        BroadcastGroup(spec, 0).connect(store, local_addr="127.0.0.1")
    assert time.perf_counter() - start < 10


class _FakeReplicas:
    """``ControlClient``'s weight calls to broadcast receivers, answered by worker threads
    of fake replicas."""

    def __init__(self, workers: dict[str, int]) -> None:
        self.workers = workers
        self.groups: dict[tuple[str, int], BroadcastGroup] = {}
        self.group_id: dict[str, str | None] = dict.fromkeys(workers)
        self.received: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.versions: dict[str, int] = {}
        self.joins = 0
        self.checks = 0
        self.dies_after_bucket: dict[str, int] = {}  # replica -> buckets it receives, then dies
        self.survivor_errors: list[str] = []

    async def prepare_weights(self, kind, step, *args):
        assert kind == "broadcast"
        return await getattr(self, step)(*args)

    async def swap_weights(self, kind, payload, version, mode, skip_dead=True):
        assert kind == "broadcast" and not skip_dead
        return await self.swap(payload["group_id"], payload["plans"], version, mode)

    async def info(self):
        return [
            {"replica_id": r, "num_workers": n, "dtype": "float32", "group_id": self.group_id[r]}
            for r, n in self.workers.items()
        ]

    async def join(self, spec, first_ranks):
        self.joins += 1
        group_spec = GroupSpec.from_wire(spec)

        def join(replica: str, index: int) -> None:
            group = BroadcastGroup(group_spec, first_ranks[replica] + index)
            group.connect(local_addr="127.0.0.1")
            self.groups[replica, index] = group

        await asyncio.gather(
            *(
                asyncio.to_thread(join, replica, index)
                for replica, count in self.workers.items()
                for index in range(count)
            )
        )
        for replica in self.workers:
            self.group_id[replica] = group_spec.group_id

    async def check(self, plans):
        self.checks += 1

    async def swap(self, group_id, plans, version, mode):
        def receive(key: tuple[str, int]) -> None:
            got = {}
            for number, plan in enumerate(plans_from_wire(plans)):
                if number == self.dies_after_bucket.get(key[0]):
                    self.die(key[0])
                    raise RuntimeError(f"replica {key[0]} died")
                try:
                    bucket = self.groups[key].receive_bucket(plan)
                except Exception as error:
                    self.survivor_errors.append(f"{key[0]}: {error}")
                    raise
                got.update((n, t.clone()) for n, t in bucket)
            self.received[key] = got

        assert all(self.group_id[r] == group_id for r in self.workers)
        await asyncio.gather(*(asyncio.to_thread(receive, key) for key in list(self.groups)))
        self.versions = dict.fromkeys(self.workers, version)
        return [0.01] * len(self.workers)

    def die(self, replica: str) -> None:
        """The replica's process ends: its ranks' sockets close, and it answers no more."""
        del self.workers[replica], self.group_id[replica]
        for key in [k for k in self.groups if k[0] == replica]:
            self.groups.pop(key).close()

    async def leave(self):
        for group in self.groups.values():
            group.close()
        self.groups.clear()


@pytest.fixture
def loopback(monkeypatch):
    monkeypatch.setattr("agentrl.server.collective.node_ip", lambda: "127.0.0.1")


def _weights():
    gen = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(10, 4, generator=gen)),
        *[
            (f"model.layers.{i}.mlp.{p}_proj.weight", torch.randn(4, 4, generator=gen))
            for i in range(3)
            for p in ("gate", "up")
        ],
        ("lm_head.weight", torch.randn(10, 4, generator=gen)),
    ]


async def test_every_worker_of_every_replica_receives_every_tensor(loopback):
    replicas = _FakeReplicas({"r-1": 2, "r-0": 1})  # r-1 has two tensor-parallel workers
    sync = CollectiveBroadcastSync(replicas, bucket_bytes=200, join_timeout_s=10)  # type: ignore[arg-type]
    weights = _weights()

    timings = await sync.push(weights, version=7)

    assert replicas.joins == 1 and replicas.checks == 1
    assert sorted(g.rank for g in replicas.groups.values()) == [1, 2, 3]
    assert replicas.groups["r-0", 0].rank == 1  # replicas in id order
    assert replicas.versions == {"r-0": 7, "r-1": 7}
    assert len(replicas.received) == 3
    for got in replicas.received.values():
        assert list(got) == [n for n, _ in weights]
        for name, tensor in weights:
            assert torch.equal(got[name], tensor)
    assert timings.num_tensors == len(weights) and timings.num_buckets == 5
    assert timings.num_bytes == sum(t.numel() * 4 for _, t in weights)
    assert timings.pause_s == pytest.approx(0.01)

    await sync.push(weights, version=8)  # the group and the checked plans are reused
    assert replicas.joins == 1 and replicas.checks == 1 and replicas.versions["r-0"] == 8

    replicas.workers["r-2"] = 1  # a replica joined the deployment: a new group is formed
    replicas.group_id["r-2"] = None
    await replicas.leave()
    await sync.push(weights, version=9)
    assert replicas.joins == 2 and replicas.versions == {"r-0": 9, "r-1": 9, "r-2": 9}
    await sync.close()
    assert not replicas.groups


class _GatheringSource:
    """A weight source that can only hand its weights over (no ``call_root``)."""

    def __init__(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.weights = weights
        self.bucket_bytes: list[int] = []

    def named_weights(self, bucket_bytes: int):
        self.bucket_bytes.append(bucket_bytes)
        yield from self.weights


async def test_a_source_that_cannot_be_rank_0_is_gathered_here_and_broadcast(loopback):
    replicas = _FakeReplicas({"r-0": 1})
    sync = CollectiveBroadcastSync(replicas, bucket_bytes=200, join_timeout_s=10)  # type: ignore[arg-type]
    source = _GatheringSource(_weights())

    timings = await sync.push_from(source, version=3)

    assert source.bucket_bytes == [200]
    assert replicas.versions == {"r-0": 3}
    got = replicas.received["r-0", 0]
    assert list(got) == [n for n, _ in source.weights]
    assert all(torch.equal(got[name], tensor) for name, tensor in source.weights)
    assert timings.num_tensors == len(source.weights)
    await sync.close()


async def test_a_failed_broadcast_drops_the_group_with_a_clear_error(loopback):
    replicas = _FakeReplicas({"r-0": 1})
    sync = CollectiveBroadcastSync(replicas, join_timeout_s=10, timeout_s=2, push_attempts=1)  # type: ignore[arg-type]
    await sync.push(_weights(), version=1)

    async def dead_replica(*args):
        raise RuntimeError("replica died")

    replicas.swap = dead_replica
    start = time.perf_counter()
    with pytest.raises(CollectiveSyncError, match=r"version 2 .* replica died"):
        await sync.push(_weights(), version=2)
    assert time.perf_counter() - start < 15  # rank 0's broadcast times out (timeout_s)
    assert sync._group is None


async def test_a_replica_dying_mid_broadcast_fails_fast_and_the_push_goes_to_the_rest(
    loopback, monkeypatch, caplog
):
    monkeypatch.setattr("agentrl.server.weight_transport.broadcast.RETRY_DELAY_S", 0.1)
    replicas = _FakeReplicas({"r-0": 1, "r-1": 1})
    timeout_s = 30.0  # how long a member could wait in a broadcast that will never come
    sync = CollectiveBroadcastSync(
        replicas, bucket_bytes=200, join_timeout_s=10, timeout_s=timeout_s
    )  # type: ignore[arg-type]
    weights = _weights()
    await sync.push(weights, version=1)
    replicas.dies_after_bucket = {"r-1": 2}  # receives 2 of 5 buckets, then its process ends

    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="agentrl.server.weight_transport.broadcast"):
        timings = await sync.push(weights, version=2)
    elapsed = time.perf_counter() - start

    # The first attempt failed for every member: r-1 died, r-0 was cut off mid-push when
    # rank 0 dropped the group (not after timeout_s); the second formed a group of r-0.
    assert elapsed < timeout_s / 3, elapsed
    assert replicas.survivor_errors and replicas.survivor_errors[0].startswith("r-0")
    assert "version 2 failed (attempt 1 of 3)" in caplog.text
    assert replicas.joins == 2 and replicas.versions == {"r-0": 2}
    got = replicas.received["r-0", 0]
    assert all(torch.equal(got[name], tensor) for name, tensor in weights)
    assert timings.num_tensors == len(weights)
    await sync.close()


async def test_a_push_that_keeps_failing_raises_after_its_attempts(loopback, monkeypatch):
    monkeypatch.setattr("agentrl.server.weight_transport.broadcast.RETRY_DELAY_S", 0.01)
    replicas = _FakeReplicas({"r-0": 1})
    sync = CollectiveBroadcastSync(replicas, join_timeout_s=10, timeout_s=2, push_attempts=2)  # type: ignore[arg-type]
    attempts = 0

    async def failing_info():
        nonlocal attempts
        attempts += 1
        raise RuntimeError(f"no answer {attempts}")

    replicas.info = failing_info
    with pytest.raises(RuntimeError, match="no answer 2"):
        await sync.push(_weights(), version=1)
    assert attempts == 2


def test_the_removed_actor_gather_bucket_knob_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="agentrl.config"):
        cfg = load_config(None, ["workers.actor.weight_sync_bucket_mb=64"])
    assert "weight_sync_bucket_mb" not in cfg.workers.actor.model_dump()
    assert cfg.weight_sync.bucket_mb == WeightSyncConfig().bucket_mb
    assert any("weight_sync_bucket_mb is ignored" in r.getMessage() for r in caplog.records)
