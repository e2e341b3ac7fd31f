"""The ``RolloutEngine`` interface every generation backend implements."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentrl.core.types import PauseMode, RolloutError, SamplingParams, TokenOutput

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class RolloutEngine(ABC):
    """Token-in, token-out generation with weight updates and interruptible pauses.

    Implementations: ``VLLMEngine`` (vLLM ``AsyncLLM``) and ``HFEngine`` (transformers).
    All methods are coroutines so one asyncio loop can serve many agent loops.
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
        self,
        buckets: Sequence[NamedTensors],
        version: int,
        mode: PauseMode | str = PauseMode.KEEP,
    ) -> float:
        """Pause (``mode``) → load ``buckets`` as ``version`` → reset prefix cache → resume.

        Returns the seconds generation was paused. Engines that can load the weights
        before pausing (``VLLMEngine`` with ``weight_swap=staged``) override this.
        """
        start = time.perf_counter()
        await self.pause(mode)
        try:
            for named_tensors in buckets:
                await self.update_weights(named_tensors, version)
            await self.reset_prefix_cache()
        finally:
            await self.resume()
        return time.perf_counter() - start

    # -- collective weight sync (agentrl.weight_sync.CollectiveBroadcastSync) --------------

    def weight_group_info(self) -> dict[str, Any]:
        """``{"num_workers", "dtype"}``: ranks this engine adds to a weight-broadcast group."""
        raise RolloutError(self._no_collective())

    async def join_weight_group(
        self, spec: dict[str, Any], first_rank: int, local_addr: str | None = None
    ) -> list[int]:
        """Join the weight-broadcast group ``spec`` (``server.collective.GroupSpec``)."""
        raise RolloutError(self._no_collective())

    async def check_weight_plans(self, plans: list[Any]) -> None:
        """Raise ``RolloutError`` if the bucket plans do not fit this model (nothing loaded)."""
        raise RolloutError(self._no_collective())

    async def receive_weights(self, plans: list[Any], version: int) -> None:
        """Receive the buckets of ``plans`` from the group's rank 0 and load them as ``version``."""
        raise RolloutError(self._no_collective())

    async def swap_received_weights(
        self, plans: list[Any], version: int, mode: PauseMode | str = PauseMode.KEEP
    ) -> float:
        """``swap_weights`` for broadcast buckets: pause → ``receive_weights`` → reset → resume.

        Returns the seconds generation was paused.
        """
        start = time.perf_counter()
        await self.pause(mode)
        try:
            await self.receive_weights(plans, version)
            await self.reset_prefix_cache()
        finally:
            await self.resume()
        return time.perf_counter() - start

    async def leave_weight_group(self) -> None:  # noqa: B027 - nothing to leave by default
        """Drop the weight-broadcast group, if any."""

    def _no_collective(self) -> str:
        return (
            f"{type(self).__name__} does not support collective weight sync; use "
            "engine.backend=vllm or trainer.weight_sync=object_store"
        )

    @abstractmethod
    async def reset_prefix_cache(self) -> None:
        """Drop every cached KV block (stale after a weight update)."""

    @abstractmethod
    async def stats(self) -> dict[str, Any]:
        """Counters for monitoring: weight version, in-flight requests, cache hits, ..."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Release the engine's processes and memory."""

    @property
    @abstractmethod
    def weight_version(self) -> int:
        """The policy version of the weights currently loaded."""
