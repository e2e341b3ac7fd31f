"""The ``RolloutEngine`` interface every generation backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import torch

from agentrl.server.types import PauseMode, SamplingParams, TokenOutput

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
