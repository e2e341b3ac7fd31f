"""A weight-broadcast process group between a trainer and the rollout engines' workers.

Used by the broadcast weight transport (``agentrl.server.weight_transport.broadcast``):
rank 0 is the trainer process that holds the full weights, ranks ``1..`` are the vLLM
workers of every rollout replica (a replica with tensor/pipeline parallelism contributes
one rank per worker). The group is
independent of any default ``torch.distributed`` group the processes already have (FSDP on
the trainer, tensor parallelism inside vLLM): it is built from its own ``TCPStore`` (hosted
by rank 0) and a directly constructed ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL``
(GPU), so the same code serves both backends and the CPU tests exercise the protocol.

A push sends size-bounded buckets. Each bucket travels as one flat ``uint8`` buffer whose
layout (tensor names, dtypes, shapes, byte offsets) every rank knows beforehand from a
``BucketPlan`` (``agentrl.core.weights``, the wire format every transport shares);
receivers allocate the buffer, take part in the broadcast, and view the tensors out of it.
"""

from __future__ import annotations

import datetime
import logging
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.distributed import TCPStore

from agentrl.core.weights import BucketPlan

logger = logging.getLogger(__name__)

Backend = Literal["gloo", "nccl"]
BACKENDS: tuple[str, ...] = ("gloo", "nccl")
_JOIN_KEY = "agentrl/joined"
_READY_KEY = "agentrl/ready"


class CollectiveSyncError(RuntimeError):
    """The weight-broadcast group could not be formed or a broadcast failed."""


@dataclass(frozen=True)
class RankLayout:
    """Ranks of the group: 0 is the sender, then each replica's workers in a block."""

    offsets: dict[str, int]  # replica id -> rank of its worker 0
    world_size: int

    @classmethod
    def of(cls, workers_per_replica: dict[str, int]) -> RankLayout:
        """Blocks in replica-id order, so every process computes the same layout."""
        offsets, rank = {}, 1
        for replica_id in sorted(workers_per_replica):
            count = workers_per_replica[replica_id]
            if count < 1:
                raise ValueError(f"replica {replica_id!r} reports {count} workers")
            offsets[replica_id] = rank
            rank += count
        if not offsets:
            raise ValueError("no rollout replica to broadcast weights to")
        return cls(offsets, rank)


@dataclass(frozen=True)
class GroupSpec:
    """What a rank needs to join: where rank 0's store listens and how big the group is."""

    backend: str
    master_addr: str
    master_port: int
    world_size: int
    group_id: str
    join_timeout_s: float  # every rank must arrive within this
    timeout_s: float  # limit of one broadcast (a push waits for the slowest pause)

    def to_wire(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> GroupSpec:
        return cls(**wire)


class BroadcastGroup:
    """One rank's membership of the weight-broadcast group.

    Rank 0 calls ``host`` (starts the store; returns at once) and then ``connect``; other
    ranks call ``connect`` only. ``connect`` returns once all ``world_size`` ranks arrived
    and raises ``CollectiveSyncError`` after ``timeout_s`` otherwise, before any backend
    communicator is created, so a missing rank never leaves NCCL blocked in its init.
    """

    def __init__(self, spec: GroupSpec, rank: int, device: torch.device | None = None) -> None:
        if spec.backend not in BACKENDS:
            raise ValueError(f"unknown backend {spec.backend!r}; use one of {BACKENDS}")
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} outside a group of {spec.world_size}")
        self.spec = spec
        self.rank = rank
        if device is None:
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if spec.backend == "nccl"
                else torch.device("cpu")
            )
        self.device = device
        self._store: TCPStore | None = None
        self._pg: Any = None

    @staticmethod
    def host(
        backend: str,
        world_size: int,
        group_id: str,
        *,
        join_timeout_s: float,
        timeout_s: float,
        addr: str | None = None,
    ) -> tuple[GroupSpec, TCPStore]:
        """Start rank 0's store on ``addr`` (default: this node's IP) and a free port."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; use one of {BACKENDS}")
        addr = addr or node_ip()
        store = TCPStore(
            addr,
            0,
            world_size,
            is_master=True,
            timeout=datetime.timedelta(seconds=join_timeout_s),
            wait_for_workers=False,
        )
        spec = GroupSpec(backend, addr, store.port, world_size, group_id, join_timeout_s, timeout_s)
        return spec, store

    def connect(self, store: TCPStore | None = None, local_addr: str | None = None) -> None:
        """Rendezvous with every rank, then create the backend communicator.

        ``local_addr``: the address gloo binds on this node (default: this node's IP).
        """
        spec = self.spec
        timeout = datetime.timedelta(seconds=spec.join_timeout_s)
        start = time.perf_counter()
        try:
            if store is None:
                store = TCPStore(
                    spec.master_addr,
                    spec.master_port,
                    spec.world_size,
                    is_master=False,
                    timeout=timeout,
                    wait_for_workers=False,
                )
            self._store = store
            # A barrier on the store first: it times out cleanly where a backend init may not.
            if store.add(_JOIN_KEY, 1) == spec.world_size:
                store.set(_READY_KEY, "1")
            store.wait([_READY_KEY], timeout)
        except Exception as exc:  # DistStoreError / RuntimeError / TimeoutError
            joined = _safe_count(store)
            raise CollectiveSyncError(
                f"weight-broadcast group {spec.group_id}: rank {self.rank} waited "
                f"{time.perf_counter() - start:.1f}s for {spec.world_size} ranks at "
                f"{spec.master_addr}:{spec.master_port} ({joined} joined): {exc}"
            ) from exc
        op_timeout = datetime.timedelta(seconds=spec.timeout_s)
        self._pg = _make_backend(spec, store, self.rank, op_timeout, local_addr)
        if spec.backend == "nccl":
            # NCCL creates its communicator lazily; do it now, while every rank is here.
            self.broadcast(torch.zeros(1, dtype=torch.uint8, device=self.device))
        logger.info(
            "joined weight-broadcast group %s (%s) as rank %d/%d in %.2fs",
            spec.group_id,
            spec.backend,
            self.rank,
            spec.world_size,
            time.perf_counter() - start,
        )

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` from rank 0 to every rank (in place on receivers)."""
        if self._pg is None:
            raise CollectiveSyncError("the weight-broadcast group is not connected")
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        work = self._pg.broadcast([tensor], opts)
        try:
            work.wait()
        finally:
            # A failed wait's traceback would keep the work, and through it the group's
            # connections, alive after close().
            del work
        if self.spec.backend == "nccl":
            torch.cuda.current_stream(self.device).synchronize()

    def send_bucket(self, tensors: Sequence[tuple[str, torch.Tensor]], plan: BucketPlan) -> None:
        """Rank 0: pack ``tensors`` (in plan order) into one buffer and broadcast it."""
        buffer = torch.empty(plan.nbytes, dtype=torch.uint8, device=self.device)
        for (name, tensor), slot in zip(tensors, plan.slots, strict=True):
            if name != slot.name:
                raise ValueError(f"bucket order differs from its plan: {name!r} vs {slot.name!r}")
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            buffer[slot.offset : slot.offset + slot.nbytes].copy_(flat, non_blocking=True)
        self.broadcast(buffer)

    def receive_bucket(self, plan: BucketPlan) -> list[tuple[str, torch.Tensor]]:
        """Ranks > 0: receive one bucket; the tensors are views of a fresh buffer."""
        buffer = torch.empty(plan.nbytes, dtype=torch.uint8, device=self.device)
        self.broadcast(buffer)
        return unpack(buffer, plan)

    def close(self) -> None:
        """Leave the group. A gloo group's connections close when its last reference goes
        (``broadcast`` keeps none past a failure), so a member still waiting in a
        broadcast from this rank gets an error at once instead of waiting ``timeout_s``."""
        pg, self._pg, self._store = self._pg, None, None
        if pg is not None and self.spec.backend == "nccl":
            try:
                (getattr(pg, "shutdown", None) or pg._shutdown)()
            except Exception as exc:
                logger.warning("closing the NCCL weight-broadcast group: %s", exc)


def unpack(buffer: torch.Tensor, plan: BucketPlan) -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``plan`` as views into the flat ``uint8`` ``buffer``."""
    return [
        (
            slot.name,
            buffer[slot.offset : slot.offset + slot.nbytes]
            .view(getattr(torch, slot.dtype))
            .view(slot.shape),
        )
        for slot in plan.slots
    ]


def bucket_plans(buckets: Iterable[Sequence[tuple[str, torch.Tensor]]]) -> list[BucketPlan]:
    return [
        BucketPlan.of([(name, str(t.dtype), tuple(t.shape)) for name, t in bucket])
        for bucket in buckets
    ]


def node_ip() -> str:
    """This node's IP address as Ray sees it (loopback when Ray cannot tell)."""
    try:
        import ray.util

        return ray.util.get_node_ip_address()
    except Exception:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"


def _make_backend(
    spec: GroupSpec, store: TCPStore, rank: int, timeout: datetime.timedelta, local_addr: str | None
) -> Any:
    # Each group gets its own key prefix, so a store could be shared by later groups.
    prefixed = torch.distributed.PrefixStore(f"{spec.group_id}/", store)
    if spec.backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        opts = ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [ProcessGroupGloo.create_device(hostname=local_addr or node_ip())]
        return ProcessGroupGloo(prefixed, rank, spec.world_size, opts)
    from torch.distributed import ProcessGroupNCCL  # only in CUDA builds of torch

    # NCCL finds the interface itself (NCCL_SOCKET_IFNAME to choose); the device is the
    # tensors'. Rank 0 and the vLLM workers must sit on different GPUs (NCCL refuses two
    # ranks of one communicator on one device).
    return ProcessGroupNCCL(prefixed, rank, spec.world_size, timeout)


def _safe_count(store: TCPStore | None) -> str:
    if store is None:
        return "?"
    try:
        return str(store.add(_JOIN_KEY, 0))
    except Exception:
        return "?"
