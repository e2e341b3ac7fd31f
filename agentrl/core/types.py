"""What one generate call takes and returns, and how an engine pauses.

Engines, the Serve deployment, its clients, the agent loops, the gateway and the weight
sync all exchange these; they import nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

INITIAL_WEIGHT_VERSION = 0
"""Policy version of the weights an engine starts with, before the first weight push."""


class PauseMode(StrEnum):
    """What happens to in-flight requests when an engine pauses.

    - ``abort``: in-flight requests end now with ``finish_reason="abort"`` and their partial
      tokens (callers may resubmit them with the partial tokens as prefix).
    - ``wait``: new requests are held; ``pause`` returns once in-flight requests finished.
    - ``keep``: in-flight requests are frozen where they are and continue after ``resume``
      (under the new weights, if they were updated meanwhile).
    """

    ABORT = "abort"
    WAIT = "wait"
    KEEP = "keep"


class RolloutError(ValueError):
    """A request the engine refuses (empty prompt, too long, bad sampling, bad weights).

    The message names the offending value; the engine stays up and other requests are
    unaffected.
    """


@dataclass
class SamplingParams:
    """Sampling parameters of one generate call (a subset every engine supports)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def validate(self) -> None:
        """Raise ``RolloutError`` naming the first invalid field."""
        if self.max_tokens <= 0:
            raise RolloutError(f"max_tokens must be > 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise RolloutError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise RolloutError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise RolloutError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")


@dataclass
class TokenOutput:
    """What one generate call produced.

    ``token_versions[i]`` is the policy (weight) version that sampled ``token_ids[i]``;
    ``weight_version`` is the version in force when the request finished.
    ``num_cached_tokens`` counts prompt tokens whose KV cache was reused, not recomputed.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    num_cached_tokens: int
    weight_version: int
    token_versions: list[int]
    num_prompt_tokens: int = 0
    replica_id: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
