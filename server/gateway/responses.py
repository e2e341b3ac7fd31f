"""OpenAI-schema response bodies and server-sent-event streams."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agentrl.core.types import TokenOutput
from agentrl.server.gateway.decoding import token_strings
from agentrl.server.gateway.errors import GatewayError, error_body
from agentrl.server.gateway.service import CallResult, Choice, PreparedCall

logger = logging.getLogger(__name__)


def _chat_logprobs(tokenizer: Any, choice: Choice) -> dict[str, Any]:
    """``logprobs.content``: the sampled token's logprob per token (no alternatives)."""
    tokens = token_strings(tokenizer, choice.completion_ids)
    return {
        "content": [
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [],
            }
            for token, logprob in zip(tokens, choice.output.logprobs, strict=False)
        ]
    }


def _message(choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.content}
    if choice.reasoning is not None:
        message.update(_reasoning_fields(choice.reasoning))
    if choice.tool_calls:
        message["tool_calls"] = choice.tool_calls
    return message


def _reasoning_fields(reasoning: str) -> dict[str, str]:
    # `reasoning_content` as DeepSeek's API and most OpenAI clients read it; `reasoning`
    # as vLLM's own server names it since 0.11.
    return {"reasoning_content": reasoning, "reasoning": reasoning}


def chat_completion(result: CallResult, tokenizer: Any, logprobs: bool) -> dict[str, Any]:
    """The ``chat.completion`` object."""
    prepared = result.prepared
    return {
        "id": prepared.call_id,
        "object": "chat.completion",
        "created": prepared.created,
        "model": prepared.model,
        "choices": [
            {
                "index": c.index,
                "message": _message(c),
                "logprobs": _chat_logprobs(tokenizer, c) if logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in result.choices
        ],
        "usage": result.usage,
        "system_fingerprint": _fingerprint(result),
    }


def _fingerprint(result: CallResult) -> str:
    """The policy version that served the call, as the OpenAI ``system_fingerprint``."""
    versions = sorted({c.output.weight_version for c in result.choices})
    return "agentrl-policy-v" + "-".join(str(v) for v in versions)


def completion(result: CallResult, tokenizer: Any, logprobs: int | None) -> dict[str, Any]:
    """The legacy ``text_completion`` object."""
    prepared = result.prepared
    choices = []
    for c in result.choices:
        entry: dict[str, Any] = {
            "index": c.index,
            "text": c.text,
            "finish_reason": c.finish_reason,
            "logprobs": None,
        }
        if logprobs is not None:
            tokens = token_strings(tokenizer, c.completion_ids)
            offsets, position = [], 0
            for token in tokens:
                offsets.append(position)
                position += len(token)
            entry["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": c.output.logprobs[: len(tokens)],
                "top_logprobs": None,
                "text_offset": offsets,
            }
        choices.append(entry)
    return {
        "id": prepared.call_id,
        "object": "text_completion",
        "created": prepared.created,
        "model": prepared.model,
        "choices": choices,
        "usage": result.usage,
        "system_fingerprint": _fingerprint(result),
    }


def generation(call_id: str, out: TokenOutput) -> dict[str, Any]:
    """The ``/v1/generate`` body: ids, logprobs and the policy version of every token."""
    return {
        "id": call_id,
        "token_ids": out.token_ids,
        "logprobs": out.logprobs,
        "token_versions": out.token_versions,
        "weight_version": out.weight_version,
        "finish_reason": out.finish_reason,
        "num_prompt_tokens": out.num_prompt_tokens,
        "num_cached_tokens": out.num_cached_tokens,
    }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def stream_events(
    prepared: PreparedCall,
    run: Callable[[], Awaitable[CallResult]],
    chunks: Any,
    include_usage: bool,
) -> AsyncIterator[str]:
    """SSE lines: an opening chunk per choice, the reply chunks, usage, ``[DONE]``.

    The rollout servers return a whole completion at once, so the reply arrives as one
    content chunk (and one chunk per tool call) after generation; the opening chunks go
    out immediately. An error after the stream started is sent as an ``error`` event.
    """
    head = {"id": prepared.call_id, "created": prepared.created, "model": prepared.model}
    try:
        for chunk in chunks.opening(prepared):
            yield _sse(head | chunk)
        result = await run()
        for chunk in chunks.body(result):
            yield _sse(head | chunk)
        if include_usage:
            yield _sse(head | chunks.usage_chunk(result))
    except GatewayError as exc:
        yield _sse(error_body(exc.status, exc.message, exc.param, exc.code))
    except Exception as exc:
        logger.exception("gateway: stream of %s failed", prepared.call_id)
        yield _sse(error_body(500, f"internal error ({type(exc).__name__}); see the gateway log"))
    yield "data: [DONE]\n\n"


class ChatChunks:
    """``chat.completion.chunk`` objects of one streamed chat call."""

    def __init__(self, tokenizer: Any, logprobs: bool) -> None:
        self._tokenizer = tokenizer
        self._logprobs = logprobs

    @staticmethod
    def _chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {"object": "chat.completion.chunk", "choices": [choice | extra]}

    def opening(self, prepared: PreparedCall) -> list[dict[str, Any]]:
        return [self._chunk(i, {"role": "assistant", "content": ""}) for i in range(prepared.n)]

    def body(self, result: CallResult) -> list[dict[str, Any]]:
        chunks = []
        for c in result.choices:
            logprobs = _chat_logprobs(self._tokenizer, c) if self._logprobs else None
            if c.reasoning:
                chunks.append(self._chunk(c.index, _reasoning_fields(c.reasoning)))
            if c.content:
                chunks.append(self._chunk(c.index, {"content": c.content}, logprobs=logprobs))
            for position, call in enumerate(c.tool_calls):
                delta = {"tool_calls": [{"index": position, **call}]}
                chunks.append(self._chunk(c.index, delta))
            chunks.append(self._chunk(c.index, {}, finish_reason=c.finish_reason))
        return chunks

    @staticmethod
    def usage_chunk(result: CallResult) -> dict[str, Any]:
        return {"object": "chat.completion.chunk", "choices": [], "usage": result.usage}


class CompletionChunks:
    """``text_completion`` chunks of one streamed text-completion call."""

    @staticmethod
    def opening(prepared: PreparedCall) -> list[dict[str, Any]]:
        return []

    @staticmethod
    def _chunk(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {"object": "text_completion", "choices": [choice]}

    def body(self, result: CallResult) -> list[dict[str, Any]]:
        chunks = []
        for c in result.choices:
            if c.text:
                chunks.append(self._chunk(c.index, c.text, None))
            chunks.append(self._chunk(c.index, "", c.finish_reason))
        return chunks

    @staticmethod
    def usage_chunk(result: CallResult) -> dict[str, Any]:
        return {"object": "text_completion", "choices": [], "usage": result.usage}
