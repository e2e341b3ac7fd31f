"""Weight sync strategies: push a trainer's new weights to every rollout replica.

A push is ``pause → load the new weights as version v → reset prefix cache → resume`` on
every replica, done by one call per replica after the weights are already fetched, so a
replica stops producing tokens only for its own load.
With ``pause_mode="keep"`` in-flight requests are held, not lost, and continue under the
new weights (their tokens carry the new version); with ``"abort"`` they end early with
their partial tokens and the agent loops resubmit them (partial rollout).

- ``ObjectStoreSync`` puts each size-bounded bucket into the Ray object store once, before
  pausing, so the pause window only covers the replicas' loads. Works on CPU and GPU.
- ``NCCLBroadcastSync`` (GPU clusters) is documented in README as not yet available.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import ray
import torch

from agentrl.server.client import ServerClient
from agentrl.server.types import PauseMode

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


class WeightSync(ABC):
    """Pushes weights to the rollout servers; one instance per trainer."""

    @abstractmethod
    async def push(self, named_tensors: Iterable[NamedTensor], version: int) -> SyncTimings:
        """Make every replica serve ``named_tensors`` as policy ``version``."""


class ObjectStoreSync(WeightSync):
    """Buckets through the Ray object store, fetched by each replica."""

    def __init__(
        self,
        client: ServerClient,
        bucket_bytes: int = 512 * 1024**2,
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
        pauses = await self._client.swap_weights(refs, version, self._pause_mode)
        end = time.perf_counter()
        timings = SyncTimings(
            prepare_s=prepared - start,
            pause_s=max(pauses, default=0.0),
            total_s=end - start,
            num_tensors=num_tensors,
            num_bytes=num_bytes,
            num_buckets=len(refs),
        )
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
