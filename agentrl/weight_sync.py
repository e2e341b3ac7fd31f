"""Weight sync strategies: push a trainer's new weights to every rollout replica.

This is the sender side of each weight transport; the replica side is the receiver of the
same transport (``receiver`` names it) in ``server/weight_receivers.py``, and the
``weight_sync`` config section (``WeightSyncConfig``) picks both (``make_weight_sync``).

A push is ``pause → load the new weights as version v → reset prefix cache → resume`` on
every replica, done by one call per replica after the weights are already fetched, so a
replica stops producing tokens only for its own load. A vLLM replica with
``engine.weight_swap=staged`` (the default) loads them into a shadow copy of the model
while still generating and pauses only to swap the copies (milliseconds).
With ``pause_mode="keep"`` in-flight requests are held, not lost, and continue under the
new weights (their tokens carry the new version); with ``"abort"`` they end early with
their partial tokens and the agent loops resubmit them (partial rollout).

- ``ObjectStoreSync`` puts each size-bounded bucket into the Ray object store once, before
  pausing, so the pause window only covers the replicas' loads. Works on CPU and GPU.
- ``CollectiveBroadcastSync`` broadcasts each bucket from the process holding the full
  weights (rank 0) to every vLLM worker of every replica through a process group of its
  own (``agentrl.server.collective``): ``backend="nccl"`` on GPU clusters
  (``NCCLBroadcastSync``), ``"gloo"`` on CPU. Weights never pass through the object store.

A new transport is a ``WeightSync`` subclass here whose ``receiver`` names a
``WeightReceiver`` registered there, and a ``kind`` for it in ``WeightSyncConfig`` and
``make_weight_sync``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import ray
import torch

from agentrl.core.config import WeightSyncConfig
from agentrl.core.types import PauseMode
from agentrl.core.weights import BucketPlan, plan_wire
from agentrl.server.client import ServerClient
from agentrl.server.collective import (
    BACKENDS,
    BroadcastGroup,
    CollectiveSyncError,
    RankLayout,
    bucket_plans,
)

logger = logging.getLogger(__name__)

NamedTensor = tuple[str, torch.Tensor]


@dataclass
class SyncTimings:
    """Where a push spent its time (seconds) and what it moved.

    ``pause_s`` is the longest time any replica produced no token.
    """

    prepare_s: float
    pause_s: float
    total_s: float
    num_tensors: int
    num_bytes: int
    num_buckets: int

    @classmethod
    def from_clock(
        cls,
        start: float,
        prepared: float,
        pauses: list[float],
        num_tensors: int,
        num_bytes: int,
        num_buckets: int,
    ) -> SyncTimings:
        """Timings of a push that started at ``start`` and had its buckets ready at
        ``prepared`` (``time.perf_counter`` values), ending now; ``pauses`` per replica."""
        return cls(
            prepare_s=prepared - start,
            pause_s=max(pauses, default=0.0),
            total_s=time.perf_counter() - start,
            num_tensors=num_tensors,
            num_bytes=num_bytes,
            num_buckets=num_buckets,
        )

    def metrics(self) -> dict[str, float]:
        return {
            "timing/weight_sync": self.total_s,
            "timing/pause": self.pause_s,
            "weight_sync/bytes": float(self.num_bytes),
            "weight_sync/buckets": float(self.num_buckets),
        }


_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def module_group(name: str) -> str:
    """The unit a bucket never splits: a whole decoder layer, else the parent module.

    Engines fuse tensors (q/k/v, gate/up) and reload a fused module from one message.
    """
    match = _LAYER.match(name)
    return match.group(1) if match else name.rsplit(".", 1)[0]


def bucketize(
    named_tensors: Iterable[NamedTensor], bucket_bytes: int
) -> Iterator[list[NamedTensor]]:
    """Lists of whole module groups, each at most ``bucket_bytes`` unless one group is larger.

    Tensors of one group must arrive next to each other (state-dict order does this).
    """
    bucket: list[NamedTensor] = []
    size = 0
    for _, members in itertools.groupby(named_tensors, key=lambda item: module_group(item[0])):
        tensors = [(name, tensor.detach().cpu()) for name, tensor in members]
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.extend(tensors)
        size += nbytes
    if bucket:
        yield bucket


DEFAULT_BUCKET_BYTES = 512 * 1024**2
"""Bucket size of a weight push, and of the chunks in which a ``WeightSource`` hands its
gathered weights over, where the caller gives none (``weight_sync.bucket_mb`` does)."""


class WeightSource(Protocol):
    """Where a trainer's full weights come from (``ActorGroup``)."""

    def named_weights(self, bucket_bytes: int) -> Iterator[NamedTensor]:
        """The full weights, gathered in buckets of about ``bucket_bytes``."""
        ...


class WeightSync(ABC):
    """Pushes weights to the rollout servers; one instance per trainer."""

    receiver: ClassVar[str]
    """The kind of ``WeightReceiver`` (``server/weight_receivers.py``) the replicas take
    this strategy's pushes with."""

    _bucket_bytes: int
    """Size bound of a bucket (``weight_sync.bucket_mb``), set by each strategy."""

    @abstractmethod
    async def push(self, named_tensors: Iterable[NamedTensor], version: int) -> SyncTimings:
        """Make every replica serve ``named_tensors`` as policy ``version``."""

    async def push_from(self, source: WeightSource, version: int) -> SyncTimings:
        """Push ``source``'s weights (a trainer's actor) as ``version``: gather them into
        this process in buckets of ``bucket_bytes`` (``weight_sync.bucket_mb``), then
        ``push`` them."""
        bucket_bytes = self._bucket_bytes
        named_tensors = await asyncio.to_thread(lambda: list(source.named_weights(bucket_bytes)))
        return await self.push(named_tensors, version)

    async def close(self) -> None:  # noqa: B027 - optional hook, most strategies hold nothing
        """Release what the strategy holds (process groups); pushing again reopens them."""


class ObjectStoreSync(WeightSync):
    """Buckets through the Ray object store, fetched by each replica."""

    receiver = "object_store"

    def __init__(
        self,
        client: ServerClient,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        pause_mode: PauseMode | str = PauseMode.KEEP,
    ) -> None:
        self._client = client
        self._bucket_bytes = bucket_bytes
        self._pause_mode = PauseMode(pause_mode)

    async def push(self, named_tensors: Iterable[NamedTensor], version: int) -> SyncTimings:
        start = time.perf_counter()
        refs, num_tensors, num_bytes = [], 0, 0
        for bucket in bucketize(named_tensors, self._bucket_bytes):
            refs.append(ray.put(bucket))
            num_tensors += len(bucket)
            num_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
        prepared = time.perf_counter()
        pauses = await self._client.swap_weights(self.receiver, refs, version, self._pause_mode)
        timings = SyncTimings.from_clock(start, prepared, pauses, num_tensors, num_bytes, len(refs))
        logger.info(
            "pushed %d tensors (%.1f MB, %d buckets) as version %d: pause %.0f ms, total %.0f ms",
            num_tensors,
            num_bytes / 1e6,
            len(refs),
            version,
            timings.pause_s * 1e3,
            timings.total_s * 1e3,
        )
        return timings


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
    rank 0 runs one in its Ray actor (``ActorWorker.broadcast_*``). Order of calls:
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


class BroadcastSource(WeightSource, Protocol):
    """A weight source that can be rank 0 itself (``ActorGroup``: its FSDP rank 0)."""

    def weight_sender(self) -> BroadcastSender: ...

    async def stage_weight_broadcast(
        self, dtype: str | None, bucket_bytes: int
    ) -> list[list[list[Any]]]: ...


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

    1. asks every replica who it is (``ServerClient.prepare_weights``), forming the
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

    receiver = "broadcast"

    def __init__(
        self,
        client: ServerClient,
        backend: str = "gloo",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        pause_mode: PauseMode | str = PauseMode.KEEP,
        join_timeout_s: float = 60.0,
        timeout_s: float = 600.0,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown collective backend {backend!r}; use one of {BACKENDS}")
        self._client = client
        self.backend = backend
        self._bucket_bytes = bucket_bytes
        self._pause_mode = PauseMode(pause_mode)
        self._join_timeout_s = join_timeout_s
        self._timeout_s = timeout_s
        self._local = LocalSender()
        self._sender: BroadcastSender | None = None
        self._group: _Group | None = None
        self._checked_plans: list[Any] | None = None

    async def push(self, named_tensors: Iterable[NamedTensor], version: int) -> SyncTimings:
        start = time.perf_counter()
        group = await self._ensure_group(self._local)
        buckets = bucketize(cast_floats(named_tensors, group.dtype), self._bucket_bytes)
        plans = await asyncio.to_thread(self._local.root.stage, buckets)
        return await self._transfer(group, plans, version, start)

    async def push_from(self, source: WeightSource, version: int) -> SyncTimings:
        """Push from ``source``'s own rank 0 when it can be one, else gather here first."""
        if not hasattr(source, "weight_sender"):
            return await super().push_from(source, version)
        broadcast_source: BroadcastSource = source  # type: ignore[assignment]
        start = time.perf_counter()
        group = await self._ensure_group(broadcast_source.weight_sender())
        plans = await broadcast_source.stage_weight_broadcast(group.dtype, self._bucket_bytes)
        return await self._transfer(group, plans, version, start)

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
        swap = self._client.swap_weights(
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
        return await self._client.prepare_weights(self.receiver, step, *args)

    async def _all_or_drop_group(self, awaitables: list, failure: str) -> list:
        """Await all of ``awaitables``; if any failed, drop the group and raise
        ``CollectiveSyncError`` with ``failure`` followed by every error."""
        results = await asyncio.gather(*awaitables, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self._drop_group()
            raise CollectiveSyncError(
                failure + "; ".join(f"{type(e).__name__}: {e}" for e in errors)
            ) from errors[0]
        return results

    async def _drop_group(self) -> None:
        self._group = None
        sender, self._sender = self._sender, None
        if sender is not None:
            await sender.close()


class NCCLBroadcastSync(CollectiveBroadcastSync):
    """``CollectiveBroadcastSync`` over NCCL (GPU clusters)."""

    def __init__(self, client: ServerClient, **kwargs: Any) -> None:
        super().__init__(client, backend="nccl", **kwargs)


def make_weight_sync(config: WeightSyncConfig, client: ServerClient) -> WeightSync:
    """The strategy ``weight_sync.kind`` names: ``object_store``, ``nccl`` or ``gloo``."""
    bucket_bytes = int(config.bucket_mb * 1024**2)
    if config.kind == "object_store":
        return ObjectStoreSync(client, bucket_bytes=bucket_bytes, pause_mode=config.pause_mode)
    if config.kind in BACKENDS:
        return CollectiveBroadcastSync(
            client,
            backend=config.kind,
            bucket_bytes=bucket_bytes,
            pause_mode=config.pause_mode,
            join_timeout_s=config.join_timeout_s,
            timeout_s=config.timeout_s,
        )
    raise ValueError(
        f"unknown weight sync {config.kind!r}; use object_store, {', '.join(BACKENDS)}"
    )
