"""What every weight transport shares: the sender and receiver interfaces and bucketing.

A transport is a module of this package (``object_store.py``, ``broadcast.py``) with three
halves, each running in a different process:

- its sender, a ``WeightSync`` in the trainer's process (and, for a broadcast, the root
  of the group in the actor's FSDP rank 0): pushes a trainer's new weights to every
  replica through the weight calls of a ``ControlClient`` (``prepare_weights``,
  ``swap_weights``);
- its receiver, a ``WeightReceiver`` in every rollout replica (``RolloutServer``), bound to
  the replica's engine: ``prepare`` (the transport's setup steps) and ``swap`` (make the
  engine serve the pushed weights, through ``RolloutEngine.swap_weights``);
- where it delivers into an engine's worker processes (vLLM's), its worker half: the
  receiver's classmethods ``on_worker`` and ``worker_tensors``, which
  ``vllm_worker_ext.WeightSyncExtension`` calls inside every worker.

The module's ``make_sender(config, control)`` builds its sender for the
``weight_sync.kind`` values ``WEIGHT_TRANSPORTS`` maps to it (``make_weight_sync``). The
sender names its receiver by the module's name (``WeightSync.receiver``), and the receiver
is registered under that name (``register_receiver``). Nothing here loads Ray
Serve: FSDP ranks import the broadcast root from this package.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from agentrl.core.types import PauseMode, RolloutError
from agentrl.server.engine import RolloutEngine

if TYPE_CHECKING:
    import torch

# A string inside the alias: replicas of modeled engines (sim, null) never load torch.
NamedTensor = tuple[str, "torch.Tensor"]

DEFAULT_BUCKET_BYTES = 512 * 1024**2
"""Bucket size of a weight push, and of the chunks in which a ``WeightSource`` hands its
gathered weights over, where the caller gives none (``weight_sync.bucket_mb`` does)."""


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


class WeightSource(Protocol):
    """Where a trainer's full weights come from (``ActorGroup``)."""

    def named_weights(self, bucket_bytes: int) -> Iterator[NamedTensor]:
        """The full weights, gathered in buckets of about ``bucket_bytes``."""
        ...


class RankZeroSource(WeightSource, Protocol):
    """A weight source whose rank 0 can be a transport's sender itself (``ActorGroup``:
    the FSDP actor's rank 0), so the weights leave from where they are gathered.

    Rank 0 holds one root per transport: an instance of the ``RANK_ROOT`` class of the
    transport's module (``broadcast.BroadcastRoot``), created on first use; a transport
    drives it with ``call_root`` and hands it the gathered weights with ``stage_on_root``.
    """

    root_key: str
    """Identifies rank 0 (a different one means a new group, for instance)."""

    async def call_root(self, transport: str, method: str, *args: Any) -> Any:
        """``method(*args)`` of ``transport``'s root on rank 0; its result."""
        ...

    async def stage_on_root(self, transport: str, dtype: str | None, bucket_bytes: int) -> Any:
        """Gather the full weights (every rank) and give them to ``transport``'s root on
        rank 0 as buckets of about ``bucket_bytes`` (``root.stage(buckets, dtype)``);
        what ``stage`` returns."""
        ...


class WeightSync(ABC):
    """A transport's sender: pushes weights to the rollout replicas; one per trainer."""

    receiver: ClassVar[str]
    """The kind of ``WeightReceiver`` the replicas take this sender's pushes with (the name
    of the transport's module)."""

    _bucket_bytes: int
    """Size bound of a bucket (``weight_sync.bucket_mb``), set by each sender."""

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

    async def close(self) -> None:  # noqa: B027 - optional hook, most senders hold nothing
        """Release what the sender holds (process groups); pushing again reopens them."""


RECEIVERS: dict[str, type[WeightReceiver]] = {}
"""Receiver classes by ``kind`` (what a sender's ``receiver`` names)."""


def register_receiver(cls: type[WeightReceiver]) -> type[WeightReceiver]:
    """Class decorator: make ``cls`` the receiver of weight pushes of ``cls.kind``."""
    RECEIVERS[cls.kind] = cls
    return cls


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
    def worker_tensors(cls, worker: Any, source: dict[str, Any]) -> Iterator[NamedTensor]:
        """The ``(name, tensor)`` pairs ``source`` (a ``WorkerWeights.source`` of this
        kind) delivers to one engine worker."""
        raise RuntimeError(f"the {cls.kind} weight receiver delivers nothing to engine workers")
