"""The ``broadcast`` weight transport (``weight_sync.kind`` ``gloo`` or ``nccl``).

The process holding the full weights (rank 0: the actor's FSDP rank 0, or the trainer's
process) broadcasts each bucket to every vLLM worker of every replica through a process
group of its own (``agentrl.server.collective``): NCCL on GPU clusters, gloo on CPU.
Weights never pass through the object store. Its three halves:

- sender (trainer): ``CollectiveBroadcastSync`` forms the group and drives the push;
  ``BroadcastRoot`` is rank 0 itself, in the trainer's process (``LocalSender``) or in the
  actor's rank 0 (``RankZeroSender`` calls ``ActorWorker.broadcast_*`` there);
- receiver (replica): ``BroadcastReceiver`` has the engine's workers join the group and
  receive each push (``RolloutEngine.weight_workers``);
- worker half (inside each vLLM worker): ``BroadcastReceiver.on_worker`` joins and leaves
  the group, ``BroadcastReceiver.worker_tensors`` receives the buckets, which the worker
  loads with vLLM's layerwise reload (tensor-parallel workers shard the full tensors).

Nothing here loads Ray or Ray Serve at import: the FSDP ranks import ``BroadcastRoot``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from agentrl.core.config import WeightSyncConfig
from agentrl.core.types import PauseMode, RolloutError
from agentrl.core.weights import BucketPlan, plan_wire, plans_from_wire
from agentrl.server.collective import (
    BACKENDS,
    BroadcastGroup,
    CollectiveSyncError,
    GroupSpec,
    RankLayout,
    bucket_plans,
    node_ip,
)
from agentrl.server.engine import RolloutEngine, WeightWorkers, WorkerWeights
from agentrl.server.weight_transport.base import (
    DEFAULT_BUCKET_BYTES,
    NamedTensor,
    RankZeroSource,
    SyncTimings,
    WeightReceiver,
    WeightSource,
    WeightSync,
    bucketize,
    register_receiver,
)

if TYPE_CHECKING:
    from agentrl.server.client import ControlClient

logger = logging.getLogger(__name__)

TRANSPORT = "broadcast"
"""This transport's name: its receivers' kind and its root's key on a source's rank 0."""
RETRY_DELAY_S = 5.0
"""Seconds before a failed push's second attempt (doubled before the third, and so on):
time for Serve to notice a replica that died during it."""

# -- sender --------------------------------------------------------------------------------


def cast_floats(named_tensors: Iterable[NamedTensor], dtype: str | None) -> Iterator[NamedTensor]:
    """Floating-point tensors cast to ``dtype`` (the engines' dtype: fewer bytes to send)."""
    target = getattr(torch, dtype) if dtype else None
    for name, tensor in named_tensors:
        if target is not None and tensor.is_floating_point() and tensor.dtype != target:
            tensor = tensor.to(target)
        yield name, tensor


class BroadcastRoot:
    """Rank 0 of a weight-broadcast group, in the process that holds the full weights.

    Synchronous; ``LocalSender`` runs one in the trainer's process, the FSDP actor's
    rank 0 runs one in its Ray actor (``RANK_ROOT``, driven by ``RankZeroSender``
    through ``ActorWorker.call_root``). Order of calls:
    ``host`` → ``connect`` (blocks until every rank joined) → per push ``stage`` →
    ``send``; ``close`` at the end or after a failure.
    """

    def __init__(self) -> None:
        self._group: BroadcastGroup | None = None
        self._store: Any = None
        self._staged: list[list[NamedTensor]] = []
        self._plans: list[BucketPlan] = []

    def host(
        self,
        backend: str,
        world_size: int,
        group_id: str,
        join_timeout_s: float,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Start the group's store on this node and a free port; returns the ``GroupSpec``."""
        self.close()
        spec, self._store = BroadcastGroup.host(
            backend, world_size, group_id, join_timeout_s=join_timeout_s, timeout_s=timeout_s
        )
        self._group = BroadcastGroup(spec, 0)
        return spec.to_wire()

    def connect(self) -> None:
        if self._group is None:
            raise CollectiveSyncError("host() the weight-broadcast group before connect()")
        self._group.connect(self._store)

    def stage(
        self, buckets: Iterable[list[NamedTensor]], dtype: str | None = None
    ) -> list[list[list[Any]]]:
        """Keep ``buckets`` (floats cast to ``dtype``) for ``send``; returns their plans."""
        self._staged = [list(cast_floats(bucket, dtype)) for bucket in buckets]
        self._plans = bucket_plans(self._staged)
        return plan_wire(self._plans)

    def send(self) -> None:
        """Broadcast every staged bucket (the replicas receive them in the same order)."""
        if self._group is None:
            raise CollectiveSyncError("the weight-broadcast group is not connected")
        try:
            for bucket, plan in zip(self._staged, self._plans, strict=True):
                self._group.send_bucket(bucket, plan)
        finally:
            self._staged, self._plans = [], []

    def close(self) -> None:
        group, self._group, self._store = self._group, None, None
        self._staged, self._plans = [], []
        if group is not None:
            group.close()


RANK_ROOT = BroadcastRoot
"""What a ``RankZeroSource`` runs on its rank 0 for this transport (``call_root``)."""


class BroadcastSender(ABC):
    """Async handle on a ``BroadcastRoot``, wherever it lives."""

    key: str
    """Identifies the root: a push from a different sender forms a new group."""

    @abstractmethod
    async def host(
        self, backend: str, world_size: int, group_id: str, join_timeout_s: float, timeout_s: float
    ) -> dict[str, Any]: ...

    @abstractmethod
    async def connect(self) -> None: ...

    @abstractmethod
    async def send(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...


class LocalSender(BroadcastSender):
    """Rank 0 in this process (``CollectiveBroadcastSync.push``)."""

    key = "local"

    def __init__(self) -> None:
        self.root = BroadcastRoot()

    async def host(
        self, backend: str, world_size: int, group_id: str, join_timeout_s: float, timeout_s: float
    ) -> dict[str, Any]:
        return await asyncio.to_thread(
            self.root.host, backend, world_size, group_id, join_timeout_s, timeout_s
        )

    async def connect(self) -> None:
        await asyncio.to_thread(self.root.connect)

    async def send(self) -> None:
        await asyncio.to_thread(self.root.send)

    async def close(self) -> None:
        self.root.close()


class RankZeroSender(BroadcastSender):
    """``BroadcastSender`` driving the ``BroadcastRoot`` on a source's rank 0
    (``RankZeroSource.call_root``)."""

    def __init__(self, source: RankZeroSource) -> None:
        self._source = source
        self.key = source.root_key

    async def host(
        self, backend: str, world_size: int, group_id: str, join_timeout_s: float, timeout_s: float
    ) -> dict[str, Any]:
        return await self._source.call_root(
            TRANSPORT, "host", backend, world_size, group_id, join_timeout_s, timeout_s
        )

    async def connect(self) -> None:
        await self._source.call_root(TRANSPORT, "connect")

    async def send(self) -> None:
        await self._source.call_root(TRANSPORT, "send")

    async def close(self) -> None:
        from ray.exceptions import RayActorError

        with contextlib.suppress(RayActorError):  # gone, and its group with it
            await self._source.call_root(TRANSPORT, "close")


@dataclass
class _Group:
    group_id: str
    sender_key: str
    workers: dict[str, int]  # replica id -> ranks
    dtype: str | None


class CollectiveBroadcastSync(WeightSync):
    """Broadcasts buckets from rank 0 to every vLLM worker of every replica.

    The group (rank 0 plus one rank per vLLM worker, replicas in id order) is formed at
    the first push, and again whenever the set of replicas changed (a replica restarted
    or was added); forming it fails with ``CollectiveSyncError`` after
    ``join_timeout_s`` if a replica cannot join. A push:

    1. asks every replica who it is (``ControlClient.prepare_weights``), forming the
       group if needed, and lays the weights out in buckets (a decoder layer is never
       split); the first push also has every replica check the names and shapes;
    2. every replica's workers receive the buckets while rank 0 broadcasts them
       (``timeout_s`` bounds each broadcast) and load them with vLLM's layerwise reload
       (tensor-parallel workers shard the full tensors themselves): staged vLLM engines
       into a shadow model while still generating, in-place ones after pausing
       (``pause_mode``);
    3. the replica pauses (staged: only now), swaps the shadow in, labels the weights
       ``version``, resets its prefix cache and resumes.

    ``push(named_tensors)`` is rank 0 in this process; ``push_from(actor_group)`` makes
    the actor's FSDP rank 0 the sender, so the weights go straight from the trainer's
    GPU to the engines'. With ``backend="nccl"`` rank 0 needs a CUDA device.
    """

    receiver = TRANSPORT

    def __init__(
        self,
        control: ControlClient,
        backend: str = "gloo",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        pause_mode: PauseMode | str = PauseMode.KEEP,
        join_timeout_s: float = 60.0,
        timeout_s: float = 600.0,
        push_attempts: int = 3,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown collective backend {backend!r}; use one of {BACKENDS}")
        self._control = control
        self.backend = backend
        self._bucket_bytes = bucket_bytes
        self._pause_mode = PauseMode(pause_mode)
        self._join_timeout_s = join_timeout_s
        self._timeout_s = timeout_s
        self._push_attempts = push_attempts
        self._local = LocalSender()
        self._sender: BroadcastSender | None = None
        self._group: _Group | None = None
        self._checked_plans: list[Any] | None = None

    async def push(self, named_tensors: Iterable[NamedTensor], version: int) -> SyncTimings:
        tensors = list(named_tensors)  # a failed attempt sends them again

        async def attempt() -> SyncTimings:
            start = time.perf_counter()
            group = await self._ensure_group(self._local)
            buckets = bucketize(cast_floats(tensors, group.dtype), self._bucket_bytes)
            plans = await asyncio.to_thread(self._local.root.stage, buckets)
            return await self._transfer(group, plans, version, start)

        return await self._retrying(attempt, version)

    async def push_from(self, source: WeightSource, version: int) -> SyncTimings:
        """Push from ``source``'s own rank 0 when it can be one, else gather here first."""
        if not hasattr(source, "call_root"):
            return await super().push_from(source, version)
        rank_zero: RankZeroSource = source  # type: ignore[assignment]

        async def attempt() -> SyncTimings:
            start = time.perf_counter()
            group = await self._ensure_group(RankZeroSender(rank_zero))
            plans = await rank_zero.stage_on_root(TRANSPORT, group.dtype, self._bucket_bytes)
            return await self._transfer(group, plans, version, start)

        return await self._retrying(attempt, version)

    async def _retrying(
        self, attempt: Callable[[], Awaitable[SyncTimings]], version: int
    ) -> SyncTimings:
        """Run ``attempt`` up to ``push_attempts`` times. A replica that dies during a push
        fails it for every member of the group; the next attempt forms a new group with
        the replicas that answer then (Serve restarts the dead one, and the trainer
        catches it up once it runs: ``Trainer.keep_replicas_current``)."""
        for number in range(1, self._push_attempts + 1):
            try:
                return await attempt()
            except Exception as error:
                if number == self._push_attempts:
                    raise
                delay = RETRY_DELAY_S * number
                logger.warning(
                    "weight push of version %d failed (attempt %d of %d): %s; trying again "
                    "in %.0f s with the replicas that answer then",
                    version,
                    number,
                    self._push_attempts,
                    error,
                    delay,
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def close(self) -> None:
        """Leave the group on every replica and close rank 0's side."""
        if self._group is not None:
            try:
                await asyncio.wait_for(self._prepare("leave"), self._join_timeout_s)
            except Exception as exc:
                logger.warning("replicas could not leave the weight-broadcast group: %s", exc)
        await self._drop_group()

    async def _transfer(
        self, group: _Group, plans: list[Any], version: int, start: float
    ) -> SyncTimings:
        assert self._sender is not None
        if plans != self._checked_plans:
            await self._prepare("check", plans)
            self._checked_plans = plans
        prepared = time.perf_counter()
        swap = self._control.swap_weights(
            self.receiver,
            {"group_id": group.group_id, "plans": plans},
            version,
            self._pause_mode,
            skip_dead=False,  # the group cannot send with a dead member: re-formed next push
        )
        results = await self._all_or_drop_group(
            [swap, self._sender.send()],
            f"broadcasting weights version {version} to {len(group.workers)} replica(s) "
            f"failed ({self.backend}); the group is dropped and formed again at the next "
            "push: ",
        )
        pauses: list[float] = results[0]  # type: ignore[assignment]
        slots = [slot for p in plans for slot in BucketPlan.from_wire(p).slots]
        num_tensors, num_bytes = len(slots), sum(slot.nbytes for slot in slots)
        timings = SyncTimings.from_clock(
            start, prepared, pauses, num_tensors, num_bytes, len(plans)
        )
        logger.info(
            "broadcast (%s) %d tensors (%.1f MB, %d buckets) as version %d to %d replica(s): "
            "pause %.0f ms, total %.0f ms",
            self.backend,
            num_tensors,
            num_bytes / 1e6,
            len(plans),
            version,
            len(group.workers),
            timings.pause_s * 1e3,
            timings.total_s * 1e3,
        )
        return timings

    async def _ensure_group(self, sender: BroadcastSender) -> _Group:
        """The current group if every replica is in it with ``sender`` as rank 0, else a new one."""
        infos = await self._prepare("info")
        workers = {info["replica_id"]: int(info["num_workers"]) for info in infos}
        dtypes = {info["dtype"] for info in infos}
        if len(dtypes) > 1:
            raise CollectiveSyncError(f"rollout replicas disagree on the model dtype: {dtypes}")
        group = self._group
        if (
            group is not None
            and group.sender_key == sender.key
            and group.workers == workers
            and all(info["group_id"] == group.group_id for info in infos)
        ):
            return group
        if group is not None:
            logger.info("rollout replicas changed; forming a new weight-broadcast group")
        await self._drop_group()
        layout = RankLayout.of(workers)
        group = _Group(uuid.uuid4().hex[:12], sender.key, workers, dtypes.pop() if dtypes else None)
        start = time.perf_counter()
        self._sender = sender
        spec = await sender.host(
            self.backend, layout.world_size, group.group_id, self._join_timeout_s, self._timeout_s
        )
        await self._all_or_drop_group(
            [sender.connect(), self._prepare("join", spec, layout.offsets)],
            f"weight-broadcast group ({self.backend}, {layout.world_size} ranks: rank 0 and "
            f"{len(workers)} replica(s) at {spec['master_addr']}:{spec['master_port']}) "
            f"was not formed within {self._join_timeout_s:.0f}s: ",
        )
        self._group = group
        self._checked_plans = None
        logger.info(
            "weight-broadcast group %s formed (%s): %d replica(s), %d ranks in %.2fs",
            group.group_id,
            self.backend,
            len(workers),
            layout.world_size,
            time.perf_counter() - start,
        )
        return group

    async def _prepare(self, step: str, *args: Any) -> list[Any]:
        """Setup ``step`` of the broadcast receiver on every replica."""
        return await self._control.prepare_weights(self.receiver, step, *args)

    async def _all_or_drop_group(self, awaitables: list, failure: str) -> list:
        """Await all of ``awaitables``. At the first failure the group is dropped at once:
        closing rank 0's side ends the waits of the members still in a collective, which
        would otherwise last until ``timeout_s``. Then (the rest given ``join_timeout_s``
        to end) raise ``CollectiveSyncError`` with ``failure`` followed by every error."""
        tasks = [asyncio.ensure_future(a) for a in awaitables]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        if not any(t.done() and not t.cancelled() and t.exception() for t in tasks):
            return [t.result() for t in tasks]
        await self._drop_group()
        pending = [t for t in tasks if not t.done()]
        if pending:
            _, unfinished = await asyncio.wait(pending, timeout=self._join_timeout_s)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        errors: list[BaseException] = []
        for task in tasks:
            if task.cancelled():
                errors.append(TimeoutError("still running long after the group was dropped"))
            elif task.exception() is not None:
                errors.append(task.exception())  # type: ignore[arg-type]
        raise CollectiveSyncError(
            failure + "; ".join(f"{type(e).__name__}: {e}" for e in errors)
        ) from errors[0]

    async def _drop_group(self) -> None:
        self._group = None
        sender, self._sender = self._sender, None
        if sender is None:
            return
        try:  # rank 0 may itself be stuck in a broadcast to a dead member
            await asyncio.wait_for(sender.close(), self._join_timeout_s)
        except Exception as exc:
            logger.warning("closing rank 0 of the weight-broadcast group: %r", exc)


class NCCLBroadcastSync(CollectiveBroadcastSync):
    """``CollectiveBroadcastSync`` over NCCL (GPU clusters)."""

    def __init__(self, control: ControlClient, **kwargs: Any) -> None:
        super().__init__(control, backend="nccl", **kwargs)


def make_sender(config: WeightSyncConfig, control: ControlClient) -> CollectiveBroadcastSync:
    """The sender of ``weight_sync.kind=gloo`` or ``nccl`` (the group's backend)."""
    return CollectiveBroadcastSync(
        control,
        backend=config.kind,
        bucket_bytes=int(config.bucket_mb * 1024**2),
        pause_mode=config.pause_mode,
        join_timeout_s=config.join_timeout_s,
        timeout_s=config.timeout_s,
        push_attempts=config.push_attempts,
    )


# -- receiver and worker half --------------------------------------------------------------


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

    kind = TRANSPORT

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
    def worker_tensors(cls, worker: Any, source: dict[str, Any]) -> Iterator[NamedTensor]:
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
