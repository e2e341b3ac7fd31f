"""The ``object_store`` weight transport: buckets through the Ray object store.

The sender (``ObjectStoreSync``, in the trainer) puts each size-bounded bucket into the
object store once, before any replica pauses, so the pause window only covers the
replicas' loads; every replica's receiver (``ObjectStoreReceiver``) fetches the buckets and
its engine swaps them in (a staged vLLM engine loads them before pausing). Works on CPU and
GPU, with every engine; it has no worker half (the replica hands the tensors to its engine).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import ray

from agentrl.core.config import WeightSyncConfig
from agentrl.core.types import PauseMode
from agentrl.server.weight_transport.base import (
    DEFAULT_BUCKET_BYTES,
    NamedTensor,
    SyncTimings,
    WeightReceiver,
    WeightSync,
    bucketize,
    register_receiver,
)

if TYPE_CHECKING:
    from agentrl.server.client import ControlClient

logger = logging.getLogger(__name__)


class ObjectStoreSync(WeightSync):
    """Buckets through the Ray object store, fetched by each replica."""

    receiver = "object_store"

    def __init__(
        self,
        control: ControlClient,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        pause_mode: PauseMode | str = PauseMode.KEEP,
    ) -> None:
        self._control = control
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
        pauses = await self._control.swap_weights(self.receiver, refs, version, self._pause_mode)
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


def make_sender(config: WeightSyncConfig, control: ControlClient) -> ObjectStoreSync:
    """The sender of ``weight_sync.kind=object_store``."""
    return ObjectStoreSync(
        control, bucket_bytes=int(config.bucket_mb * 1024**2), pause_mode=config.pause_mode
    )


@register_receiver
class ObjectStoreReceiver(WeightReceiver):
    """Buckets that ``ObjectStoreSync`` put into the Ray object store once: the replica
    fetches them, then the engine swaps them in (staged engines load them first)."""

    kind = "object_store"

    async def swap(self, payload: list[ray.ObjectRef], version: int, mode: PauseMode) -> float:
        buckets = [await ref for ref in payload]
        return await self.engine.swap_weights(buckets, version, mode)
