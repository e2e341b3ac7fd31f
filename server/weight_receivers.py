"""Weight receivers: the replica side of each weight transport.

The sender side is a ``WeightSync`` strategy in the trainer (``agentrl/weight_sync.py``);
it names the ``kind`` of its receiver, and every rollout replica (``RolloutServer``) keeps
one receiver of that kind, bound to its engine, for two calls:

- ``prepare(step, *args)``: the transport's setup, asked of every replica before a push
  (a broadcast group's ``info``, ``join``, ``check`` and ``leave``);
- ``swap(payload, version, mode)``: make the engine serve the pushed weights as
  ``version`` (pause → load → reset prefix cache → resume, loaded before the pause where
  the engine can stage), returning the seconds generation was paused.

An engine loads weights either as tensors in the replica's process or as
``WorkerWeights`` that its worker processes receive themselves (vLLM's workers are the
ranks of a broadcast group); see ``RolloutEngine.swap_weights``. For the latter, the
receiver's worker half (``on_worker``, ``worker_tensors``) runs inside every worker,
called by ``vllm_worker_ext.WeightSyncExtension``.

A new transport is a sender in ``agentrl/weight_sync.py`` and a receiver here,
registered with ``@register_receiver``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from agentrl.core.types import PauseMode, RolloutError
from agentrl.core.weights import plans_from_wire
from agentrl.server.collective import BroadcastGroup, GroupSpec, node_ip
from agentrl.server.engine import RolloutEngine, WeightWorkers, WorkerWeights

if TYPE_CHECKING:
    import ray

logger = logging.getLogger(__name__)

RECEIVERS: dict[str, type[WeightReceiver]] = {}
"""Receiver classes by ``kind`` (what a sender's ``receiver`` names)."""


def register_receiver(cls: type[WeightReceiver]) -> type[WeightReceiver]:
    """Class decorator: make ``cls`` the receiver of weight pushes of ``cls.kind``."""
    RECEIVERS[cls.kind] = cls
    return cls


def receiver_class(kind: str) -> type[WeightReceiver]:
    """The receiver registered for ``kind``; ``RolloutError`` for an unknown one."""
    try:
        return RECEIVERS[kind]
    except KeyError:
        raise RolloutError(
            f"unknown weight receiver {kind!r}; known: {', '.join(sorted(RECEIVERS))}"
        ) from None


class WeightReceiver(ABC):
    """One replica's side of a weight transport, bound to the replica's engine."""

    kind: ClassVar[str]

    def __init__(self, engine: RolloutEngine, replica_id: str) -> None:
        self.engine = engine
        self.replica_id = replica_id

    async def prepare(self, step: str, *args: Any) -> Any:
        """Run setup ``step`` of the transport; by default there is none."""
        raise RolloutError(f"the {self.kind} weight receiver has no setup step {step!r}")

    @abstractmethod
    async def swap(self, payload: Any, version: int, mode: PauseMode) -> float:
        """Serve the weights ``payload`` carries as ``version``: pause (``mode``) → load →
        reset prefix cache → resume. Returns the seconds generation was paused."""

    # -- worker half: runs inside each worker process of an engine (vLLM) ---------------

    @classmethod
    def on_worker(cls, worker: Any, step: str, *args: Any) -> Any:
        """Run ``step`` of this transport on one engine worker (``worker`` is vLLM's)."""
        raise RuntimeError(f"the {cls.kind} weight receiver has no worker step {step!r}")

    @classmethod
    def worker_tensors(
        cls, worker: Any, source: dict[str, Any]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The ``(name, tensor)`` pairs ``source`` (a ``WorkerWeights.source`` of this
        kind) delivers to one engine worker."""
        raise RuntimeError(f"the {cls.kind} weight receiver delivers nothing to engine workers")


@register_receiver
class ObjectStoreReceiver(WeightReceiver):
    """Buckets that ``ObjectStoreSync`` put into the Ray object store once: the replica
    fetches them, then the engine swaps them in (staged engines load them first)."""

    kind = "object_store"

    async def swap(self, payload: list[ray.ObjectRef], version: int, mode: PauseMode) -> float:
        buckets = [await ref for ref in payload]
        return await self.engine.swap_weights(buckets, version, mode)


@register_receiver
class BroadcastReceiver(WeightReceiver):
    """Buckets that ``CollectiveBroadcastSync`` broadcasts from the trainer's rank 0 over
    a process group of its own (``agentrl.server.collective``), gloo or NCCL.

    Every worker of the engine is a rank of the group and receives the full tensors
    itself, so the engine must have worker processes (``RolloutEngine.weight_workers``).
    Setup steps: ``info`` (this replica's id, node, ranks, dtype and current group),
    ``join`` (the group a push formed), ``check`` (the push's bucket plans fit the model;
    nothing is loaded) and ``leave``. ``swap`` takes ``{"group_id", "plans"}``.
    """

    kind = "broadcast"

    def __init__(self, engine: RolloutEngine, replica_id: str) -> None:
        super().__init__(engine, replica_id)
        self.group_id: str | None = None  # the group this replica's workers are in

    async def prepare(self, step: str, *args: Any) -> Any:
        steps = {"info": self._info, "join": self._join, "check": self._check, "leave": self._leave}
        if step not in steps:
            return await super().prepare(step, *args)
        return await steps[step](*args)

    async def swap(self, payload: dict[str, Any], version: int, mode: PauseMode) -> float:
        """A staged engine receives and loads the broadcast while generating and pauses
        only for the swap; otherwise the pause covers the broadcast, which starts once
        every replica paused."""
        if payload["group_id"] != self.group_id:
            raise RuntimeError(
                f"rollout replica {self.replica_id} is in weight-broadcast group "
                f"{self.group_id}, not {payload['group_id']}"
            )
        weights = WorkerWeights({"kind": self.kind, "plans": payload["plans"]})
        return await self.engine.swap_weights(weights, version, mode)

    def _workers(self) -> WeightWorkers:
        workers = self.engine.weight_workers()
        if workers is None:
            raise RolloutError(
                f"{type(self.engine).__name__} does not support broadcast weight sync; use "
                "server.engine.backend=vllm or weight_sync.kind=object_store"
            )
        return workers

    async def _info(self) -> dict[str, Any]:
        workers = self._workers()
        return {
            "replica_id": self.replica_id,
            "node_ip": node_ip(),
            "group_id": self.group_id,
            "num_workers": workers.num_workers,
            "dtype": workers.dtype,
        }

    async def _join(self, spec: dict[str, Any], first_ranks: dict[str, int]) -> str:
        """Every worker joins the group ``spec`` from the rank ``first_ranks`` gives this
        replica; blocks until all ranks arrived (``spec["join_timeout_s"]``)."""
        first_rank = first_ranks.get(self.replica_id)
        if first_rank is None:
            raise RuntimeError(
                f"rollout replica {self.replica_id} has no rank in weight-broadcast group "
                f"{spec['group_id']} (it started after the group was planned); retry the push"
            )
        self.group_id = None
        await self._workers().call(
            self.kind, "join", spec, first_rank, node_ip(), timeout=spec["join_timeout_s"] + 30
        )
        self.group_id = spec["group_id"]
        return self.replica_id

    async def _check(self, plans: list[Any]) -> str:
        buckets = [[(s.name, s.shape) for s in plan.slots] for plan in plans_from_wire(plans)]
        await self._workers().check(buckets)
        return self.replica_id

    async def _leave(self) -> str:
        self.group_id = None
        await self._workers().call(self.kind, "leave")
        return self.replica_id

    @classmethod
    def on_worker(cls, worker: Any, step: str, *args: Any) -> Any:
        if step == "join":
            return _join_on_worker(worker, *args)
        if step == "leave":
            return _leave_on_worker(worker)
        return super().on_worker(worker, step, *args)

    @classmethod
    def worker_tensors(
        cls, worker: Any, source: dict[str, Any]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        group: BroadcastGroup | None = getattr(worker, "_agentrl_group", None)
        if group is None:
            raise RuntimeError("this worker is not in a weight-broadcast group")
        for plan in plans_from_wire(source["plans"]):
            yield from group.receive_bucket(plan)


def _join_on_worker(
    worker: Any, spec: dict[str, Any], first_rank: int, local_addr: str | None = None
) -> int:
    """Join the group as rank ``first_rank`` + the worker's index; returns the rank."""
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    _leave_on_worker(worker)
    tp, pp = get_tp_group(), get_pp_group()
    rank = first_rank + pp.rank_in_group * tp.world_size + tp.rank_in_group
    group_spec = GroupSpec.from_wire(spec)
    device = worker.device if group_spec.backend == "nccl" else torch.device("cpu")
    group = BroadcastGroup(group_spec, rank, device)
    group.connect(local_addr=local_addr)
    worker._agentrl_group = group
    return rank


def _leave_on_worker(worker: Any) -> bool:
    """Drop the worker's weight-broadcast group; False when it had none."""
    group: BroadcastGroup | None = getattr(worker, "_agentrl_group", None)
    worker._agentrl_group = None
    if group is None:
        return False
    group.close()
    return True
