"""Engine-agnostic request/response types shared by engines, the Serve deployment and clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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


def check_prompt(prompt_ids: list[int], max_model_len: int, vocab_size: int | None) -> None:
    """Raise ``RolloutError`` if ``prompt_ids`` cannot be served by an engine."""
    if not isinstance(prompt_ids, list | tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids
    ):
        raise RolloutError(
            f"prompt_ids must be a list of int token ids, got {type(prompt_ids).__name__} "
            "(with transformers 5, call apply_chat_template(..., return_dict=False))"
        )
    if not prompt_ids:
        raise RolloutError("prompt_ids is empty: a request needs at least one prompt token")
    if len(prompt_ids) >= max_model_len:
        raise RolloutError(
            f"prompt has {len(prompt_ids)} tokens but the context window (max_model_len) is "
            f"{max_model_len}: shorten the prompt or raise server.engine.max_model_len"
        )
    if vocab_size is not None:
        bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise RolloutError(
                f"prompt contains token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
            )


def clamp_max_tokens(sampling: SamplingParams, prompt_len: int, max_model_len: int) -> int:
    """``max_tokens`` reduced so prompt + response fits the context window."""
    return min(sampling.max_tokens, max_model_len - prompt_len)
