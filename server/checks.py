"""The request checks every engine applies before generating."""

from __future__ import annotations

from agentrl.core.types import RolloutError, SamplingParams


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
