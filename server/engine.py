"""The ``RolloutEngine`` interface every generation backend implements."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.core.types import PauseMode, RolloutError, SamplingParams, TokenOutput

if TYPE_CHECKING:
    import torch

# A string inside the alias keeps torch out of engines that never see a tensor (sim, null).
NamedTensors = Iterable[tuple[str, "torch.Tensor"]]


@dataclass(frozen=True)
class WorkerWeights:
    """Weights an engine's worker processes receive themselves, through the worker half of
    the transport ``source["kind"]`` names (``WeightReceiver.worker_tensors``); ``source``
    is handed to every worker as it is (plain, msgpack-friendly values)."""

    source: dict[str, Any]


Weights = Sequence[NamedTensors] | WorkerWeights
"""What ``RolloutEngine.swap_weights`` loads: buckets of tensors here, or ``WorkerWeights``."""


@dataclass(frozen=True)
class WeightWorkers:
    """An engine's worker processes, as a transport's receiver sees them."""

    num_workers: int
    """Ranks the workers add to a weight-broadcast group (tensor × pipeline parallel)."""
    dtype: str
    """The dtype the workers' weights are in (what a sender casts floats to)."""
    call: Callable[..., Awaitable[list[Any]]]
    """``call(kind, step, *args, timeout=None)``: run ``step`` of receiver ``kind``'s worker
    half (``WeightReceiver.on_worker``) on every worker; one result per worker."""
    check: Callable[[list[list[tuple[str, tuple[int, ...]]]]], Awaitable[None]]
    """``check(buckets)``: raise ``RolloutError`` unless buckets of ``(name, shape)`` would
    load (known names, right shapes, whole fused modules per bucket); nothing is loaded."""


class RolloutEngine(ABC):
    """Token-in, token-out generation with weight updates and interruptible pauses.

    Implementations: ``VLLMEngine`` (vLLM ``AsyncLLM``), ``HFEngine`` (transformers) and
    ``NullEngine``. All methods are coroutines so one asyncio loop can serve many agent
    loops. Weight transports reach an engine through ``swap_weights`` (and, for ones that
    deliver into worker processes, ``weight_workers``); ``update_weights`` is the load an
    engine implements.
    """

    @abstractmethod
    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids``; raises ``RolloutError`` on bad input."""

    @abstractmethod
    async def abort(self, request_id: str) -> TokenOutput | None:
        """Stop ``request_id``; returns its partial output (``finish_reason="abort"``)."""

    @abstractmethod
    async def pause(self, mode: PauseMode | str = PauseMode.KEEP) -> None:
        """Stop scheduling tokens; see ``PauseMode`` for what happens to in-flight work."""

    @abstractmethod
    async def resume(self) -> None:
        """Continue after ``pause``."""

    @abstractmethod
    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load new weights and tag every token generated from now on with ``version``.

        Raises ``RolloutError`` (and keeps the old weights) for an unknown name or a
        wrong shape.
        """

    async def swap_weights(
        self, weights: Weights, version: int, mode: PauseMode | str = PauseMode.KEEP
    ) -> float:
        """Pause (``mode``) → load ``weights`` as ``version`` → reset prefix cache → resume.

        The one entry of every weight transport's receiver (``server/weight_transport/``):
        ``weights`` are buckets of tensors in this process, or ``WorkerWeights`` for an
        engine with ``weight_workers``. Returns the seconds generation was paused.
        Engines that can load the weights before pausing (``VLLMEngine`` with
        ``weight_swap=staged``) override this.
        """
        if isinstance(weights, WorkerWeights):
            raise RolloutError(
                f"{type(self).__name__} has no worker processes to receive "
                f"{weights.source['kind']!r} weights; use weight_sync.kind=object_store"
            )
        start = time.perf_counter()
        await self.pause(mode)
        try:
            for named_tensors in weights:
                await self.update_weights(named_tensors, version)
            await self.reset_prefix_cache()
        finally:
            await self.resume()
        return time.perf_counter() - start

    def weight_workers(self) -> WeightWorkers | None:
        """The worker processes that hold this engine's weights, for transports that
        deliver straight into them (a broadcast group); None: the weights live here."""
        return None

    @abstractmethod
    async def reset_prefix_cache(self) -> None:
        """Drop every cached KV block (stale after a weight update)."""

    @abstractmethod
    async def stats(self) -> dict[str, Any]:
        """Counters for monitoring. Every engine gives ``backend``, ``weight_version``,
        ``paused``, ``num_running`` and the running totals ``requests``, ``aborted``,
        ``prompt_tokens`` and ``generated_tokens``; an engine may add its own (cache hits,
        queue sizes, ...)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Release the engine's processes and memory."""

    @property
    @abstractmethod
    def weight_version(self) -> int:
        """The policy version of the weights currently loaded."""
