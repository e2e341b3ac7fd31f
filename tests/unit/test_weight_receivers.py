"""Weight receivers: each transport's replica side routes a push into its engine."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentrl.config import EngineConfig, ModelConfig
from agentrl.core.config import WEIGHT_TRANSPORTS, WeightSyncConfig
from agentrl.core.types import PauseMode, RolloutError, SamplingParams
from agentrl.core.weights import BucketPlan
from agentrl.server.engine import WeightWorkers, WorkerWeights
from agentrl.server.null_engine import NullEngine
from agentrl.server.weight_transport import make_weight_sync, receiver_class, transport_module
from agentrl.server.weight_transport.broadcast import BroadcastReceiver
from agentrl.server.weight_transport.object_store import ObjectStoreReceiver


def _null_engine() -> NullEngine:
    return NullEngine(ModelConfig(path="unused"), EngineConfig(backend="null", null_token_ids=[7]))


async def _ref(value: Any) -> Any:
    """Stands in for a Ray ObjectRef: awaiting it gives the stored value."""
    return value


def test_receivers_are_found_by_kind():
    assert receiver_class("object_store") is ObjectStoreReceiver
    assert receiver_class("broadcast") is BroadcastReceiver
    with pytest.raises(RolloutError, match="unknown weight receiver 'rdma'"):
        receiver_class("rdma")


async def test_object_store_receiver_fetches_the_buckets_and_swaps_them_in():
    engine = _null_engine()
    receiver = ObjectStoreReceiver(engine, "r-0")
    buckets = [_ref([("a", torch.zeros(1))]), _ref([("b", torch.ones(1))])]

    paused_s = await receiver.swap(buckets, 4, PauseMode.KEEP)

    assert paused_s >= 0 and engine.weight_version == 4
    assert (await engine.stats())["paused"] is None  # resumed
    assert (await engine.generate("after", [1], SamplingParams())).token_versions == [4]
    with pytest.raises(RolloutError, match="no setup step 'join'"):
        await receiver.prepare("join")


async def test_a_broadcast_needs_an_engine_with_worker_processes():
    engine = _null_engine()
    with pytest.raises(RolloutError, match="NullEngine does not support broadcast"):
        await BroadcastReceiver(engine, "r-0").prepare("info")
    with pytest.raises(RolloutError, match="no worker processes"):
        await engine.swap_weights(WorkerWeights({"kind": "broadcast", "plans": []}), 1)


class _WorkerEngine:
    """An engine with two worker processes that records what reaches it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.checked: list[Any] = []
        self.swapped: list[tuple[Any, ...]] = []

    def weight_workers(self) -> WeightWorkers:
        async def call(kind: str, step: str, *args: Any, timeout: float | None = None):
            self.calls.append((kind, step, *args, timeout))
            return [None, None]

        async def check(buckets):
            self.checked.append(buckets)

        return WeightWorkers(num_workers=2, dtype="bfloat16", call=call, check=check)

    async def swap_weights(self, weights, version, mode=PauseMode.KEEP) -> float:
        self.swapped.append((weights, version, mode))
        return 0.5


async def test_broadcast_receiver_joins_checks_swaps_and_leaves(monkeypatch):
    monkeypatch.setattr("agentrl.server.weight_transport.broadcast.node_ip", lambda: "10.0.0.7")
    engine = _WorkerEngine()
    receiver = BroadcastReceiver(engine, "r-1")  # type: ignore[arg-type]
    spec = {"group_id": "g1", "join_timeout_s": 5.0}
    plans = [BucketPlan.of([("w", "float32", (2, 3))]).to_wire()]

    info = await receiver.prepare("info")
    assert info == {
        "replica_id": "r-1",
        "node_ip": "10.0.0.7",
        "group_id": None,
        "num_workers": 2,
        "dtype": "bfloat16",
    }
    with pytest.raises(RuntimeError, match="has no rank in weight-broadcast group g1"):
        await receiver.prepare("join", spec, {"r-0": 1})
    assert await receiver.prepare("join", spec, {"r-0": 1, "r-1": 3}) == "r-1"
    assert engine.calls == [("broadcast", "join", spec, 3, "10.0.0.7", 35.0)]
    assert (await receiver.prepare("info"))["group_id"] == "g1"

    await receiver.prepare("check", plans)
    assert engine.checked == [[[("w", (2, 3))]]]

    with pytest.raises(RuntimeError, match="is in weight-broadcast group g1, not g0"):
        await receiver.swap({"group_id": "g0", "plans": plans}, 3, PauseMode.KEEP)
    assert await receiver.swap({"group_id": "g1", "plans": plans}, 3, PauseMode.ABORT) == 0.5
    weights, version, mode = engine.swapped[0]
    assert weights == WorkerWeights({"kind": "broadcast", "plans": plans})
    assert (version, mode) == (3, PauseMode.ABORT)

    await receiver.prepare("leave")
    assert engine.calls[-1] == ("broadcast", "leave", None)
    assert receiver.group_id is None


def test_the_worker_half_of_a_broadcast_needs_the_workers_group():
    class Worker:
        pass

    with pytest.raises(RuntimeError, match="not in a weight-broadcast group"):
        list(BroadcastReceiver.worker_tensors(Worker(), {"kind": "broadcast", "plans": []}))
    with pytest.raises(RuntimeError, match="no worker step 'join'"):
        ObjectStoreReceiver.on_worker(Worker(), "join")
    with pytest.raises(RuntimeError, match="delivers nothing to engine workers"):
        list(ObjectStoreReceiver.worker_tensors(Worker(), {"kind": "object_store"}))


@pytest.mark.parametrize("kind", sorted(WEIGHT_TRANSPORTS))
def test_every_weight_sync_kind_is_one_module_with_its_sender_and_receiver(kind):
    sync = make_weight_sync(WeightSyncConfig(kind=kind), object())  # type: ignore[arg-type]
    module = transport_module(WEIGHT_TRANSPORTS[kind])
    assert type(sync).__module__ == module.__name__
    assert sync.receiver == WEIGHT_TRANSPORTS[kind]
    assert receiver_class(sync.receiver).__module__ == module.__name__
