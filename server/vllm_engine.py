"""``RolloutEngine`` backed by an in-process vLLM v1 ``AsyncLLM``.

Token ids in, token ids out: no detokenization, one sampled-token logprob per generated
token, and the policy version that sampled each token. Weight versions are vLLM's own
labels (``AsyncLLM.update_weight_version``); the engine core stamps every step's output with
the label in force and ``CompletionOutput.weight_versions`` reports them as spans.
Weights are only swapped while the scheduler is paused, so the labels are exact.

Weight pushes, in place or staged (``engine.weight_swap``), are loaded by ``VLLMWeightLoader``
(``server/vllm_weights.py``); this module is about serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import vllm
from vllm.exceptions import VLLMClientError
from vllm.inputs import tokens_input
from vllm.outputs import RequestOutput
from vllm.v1.engine.async_llm import AsyncLLM

from agentrl.core.config import ModelConfig
from agentrl.core.types import (
    INITIAL_WEIGHT_VERSION,
    PauseMode,
    RolloutError,
    SamplingParams,
    TokenOutput,
)
from agentrl.server.checks import check_prompt
from agentrl.server.config import EngineConfig
from agentrl.server.engine import NamedTensors, RolloutEngine, Weights, WeightWorkers
from agentrl.server.vllm_args import engine_args, request_seed, sampling_params
from agentrl.server.vllm_weights import VLLMWeightLoader, weight_swap_for

logger = logging.getLogger(__name__)

_FINISH_REASONS = ("stop", "length", "abort")


@dataclass
class _Counters:
    requests: int = 0
    aborted: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0


def _to_version(label: str) -> int:
    """The integer policy version behind a vLLM weight-version label ("default" until the
    first ``update_weight_version`` call: the initial weights)."""
    try:
        return int(label)
    except ValueError:
        return INITIAL_WEIGHT_VERSION


class VLLMEngine(RolloutEngine):
    """vLLM v1 ``AsyncLLM`` in this process (engine core and workers in child processes).

    Prefix caching is on (``engine.enable_prefix_caching``), the KV cache is sized by
    ``engine.kv_cache_memory_bytes`` (or ``gpu_memory_utilization`` when None on GPU), and
    weight pushes are loaded by ``weight_loader`` (a ``VLLMWeightLoader``) into the workers, through
    ``collective_rpc`` to ``vllm_worker_ext.WeightSyncExtension``.
    """

    def __init__(self, model: ModelConfig, engine: EngineConfig) -> None:
        """Start the engine (blocks for the model load, ~25 s for a tiny model on CPU).

        Raises ``UntestedVLLMError`` first on a vLLM release the weight swaps are not
        tested with (see ``vllm_weights.weight_swap_for``)."""
        staged = weight_swap_for(engine.weight_swap, vllm.__version__) == "staged"
        self.weight_loader = VLLMWeightLoader(self, model, staged)
        start = time.perf_counter()
        self.llm = AsyncLLM.from_engine_args(engine_args(model, engine))
        model_config = self.llm.model_config
        self._max_model_len: int = model_config.max_model_len
        self._vocab_size: int = model_config.get_vocab_size()
        self._paused = False
        self._closed = False
        self.control = asyncio.Lock()
        """Serializes pause, resume and every weight load."""
        self.weight_loader.start()
        self._inflight: dict[str, asyncio.Future[TokenOutput | None]] = {}
        self._counters = _Counters()
        logger.info(
            "vLLM engine up in %.1fs: %s (%s, tp=%d, max_model_len=%d, block_size=%d)",
            time.perf_counter() - start,
            model.path,
            model.dtype,
            engine.tensor_parallel_size,
            self._max_model_len,
            engine.block_size,
        )

    @property
    def weight_version(self) -> int:
        """The policy version of the weights currently loaded."""
        return self.weight_loader.version

    @property
    def paused(self) -> bool:
        """Whether generation is paused (``pause`` until ``resume``)."""
        return self._paused

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenOutput:
        """Generate from ``prompt_ids``; ``max_tokens`` is clamped to the context window.

        Raises ``RolloutError`` for an empty, too long or out-of-vocabulary prompt, invalid
        sampling parameters, or a ``request_id`` that is already in flight.
        """
        self.check_open()
        check_prompt(prompt_ids, self._max_model_len, self._vocab_size)
        sampling.validate()
        if request_id in self._inflight:
            raise RolloutError(f"request_id {request_id!r} is already in flight")
        try:
            params = sampling_params(
                sampling, len(prompt_ids), self._max_model_len, request_seed(sampling.seed)
            )
        except (VLLMClientError, ValueError) as exc:
            raise RolloutError(f"invalid sampling parameters: {exc}") from exc
        done: asyncio.Future[TokenOutput | None] = asyncio.get_running_loop().create_future()
        self._inflight[request_id] = done
        result: TokenOutput | None = None
        start = time.perf_counter()
        try:
            final: RequestOutput | None = None
            async for output in self.llm.generate(
                tokens_input(list(prompt_ids)), params, request_id
            ):
                final = output
            if final is None:
                raise RuntimeError(f"vLLM returned no output for request {request_id!r}")
            result = self._token_output(final, len(prompt_ids), time.perf_counter() - start)
            return result
        except VLLMClientError as exc:
            raise RolloutError(f"vLLM rejected request {request_id!r}: {exc}") from exc
        finally:
            del self._inflight[request_id]
            done.set_result(result)

    async def abort(self, request_id: str) -> TokenOutput | None:
        """Abort ``request_id``; returns its partial output, or None if it is not in flight."""
        done = self._inflight.get(request_id)
        if done is None:
            return None
        await self.llm.abort(request_id)
        return await asyncio.shield(done)

    async def pause(self, mode: PauseMode | str = PauseMode.KEEP) -> None:
        """Stop scheduling; ``mode`` decides what happens to in-flight requests.

        ``abort`` ends them now with their partial tokens, ``wait`` returns once running
        requests finished, ``keep`` freezes them until ``resume``. Requests submitted
        while paused are queued. Caches are kept (see ``reset_prefix_cache``).
        """
        try:
            pause_mode = PauseMode(mode)
        except ValueError as exc:
            choices = ", ".join(m.value for m in PauseMode)
            raise RolloutError(f"unknown pause mode {mode!r}; use one of: {choices}") from exc
        self.check_open()
        async with self.control:
            await self.pause_scheduler(pause_mode)
            self._paused = True
        logger.info("paused generation (mode=%s)", pause_mode.value)

    async def resume(self) -> None:
        """Continue after ``pause``; held and queued requests are scheduled again."""
        self.check_open()
        async with self.control:
            await self.llm.resume_generation()
            self._paused = False
        logger.info("resumed generation")

    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load new weights (Hugging Face names) as ``version``; see ``VLLMWeightLoader.update``."""
        self.check_open()
        await self.weight_loader.update(named_tensors, version)

    async def swap_weights(
        self, weights: Weights, version: int, mode: PauseMode | str = PauseMode.KEEP
    ) -> float:
        """Pause (``mode``) → swap in ``weights`` as ``version`` → reset cache → resume;
        staged engines load them before pausing (see ``VLLMWeightLoader.swap``)."""
        self.check_open()
        return await self.weight_loader.swap(weights, version, PauseMode(mode))

    def weight_workers(self) -> WeightWorkers:
        """One rank per vLLM worker, for transports that deliver into the workers."""
        return self.weight_loader.workers()

    async def pause_scheduler(self, mode: PauseMode) -> None:
        """Pause vLLM's scheduler (the caller holds ``control``); ``pause`` also records it."""
        if mode is PauseMode.KEEP:
            # Frozen requests emit nothing, so AsyncLLM's 20 ms wait for final outputs
            # (pause_generation) is not needed.
            await self.llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)
        else:
            await self.llm.pause_generation(mode=mode.value, clear_cache=False)

    async def reset_prefix_cache(self) -> None:
        """Drop every cached KV block; running requests are recomputed from their tokens."""
        self.check_open()
        await self.clear_prefix_cache()

    async def clear_prefix_cache(self) -> None:
        """``reset_prefix_cache`` without the open check (the caller holds ``control``)."""
        if not await self.llm.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM could not reset the prefix cache")

    async def stats(self) -> dict[str, Any]:
        """Weight version, in-flight requests, token and prefix-cache counters."""
        c = self._counters
        unfinished = 0 if self._closed else self.llm.get_num_unfinished_requests()
        return {
            "backend": "vllm",
            "weight_version": self.weight_loader.version,
            "paused": self._paused,
            "closed": self._closed,
            "num_running": len(self._inflight),
            "num_unfinished_in_engine": unfinished,
            "requests": c.requests,
            "aborted": c.aborted,
            "prompt_tokens": c.prompt_tokens,
            "cached_prompt_tokens": c.cached_prompt_tokens,
            "generated_tokens": c.generated_tokens,
            "prefix_cache_hit_rate": c.cached_prompt_tokens / c.prompt_tokens
            if c.prompt_tokens
            else 0.0,
            "weight_updates": self.weight_loader.updates,
        }

    async def shutdown(self) -> None:
        """Abort in-flight requests and stop the engine core and worker processes."""
        if self._closed:
            return
        if self._inflight:
            await self.llm.abort(list(self._inflight))
        self.weight_loader.close()
        self._closed = True
        self.llm.shutdown()
        # Drop the client now: its __del__ shuts down again and fails at interpreter exit.
        del self.llm
        logger.info("vLLM engine shut down")

    def check_open(self) -> None:
        """Raise unless the engine still runs (``shutdown`` not called)."""
        if self._closed:
            raise RuntimeError("the vLLM engine has been shut down")

    def _token_output(self, final: RequestOutput, prompt_len: int, latency: float) -> TokenOutput:
        completion = final.outputs[0]
        if completion.finish_reason not in _FINISH_REASONS:
            raise RuntimeError(
                f"vLLM request {final.request_id!r} ended with {completion.finish_reason!r}"
            )
        token_ids = list(completion.token_ids)
        logprobs = [
            entry[token].logprob
            for entry, token in zip(completion.logprobs or [], token_ids, strict=True)
        ]
        token_versions = [self.weight_loader.version] * len(token_ids)
        for span in completion.weight_versions or []:
            token_versions[span.start : span.end] = [_to_version(span.version)] * (
                span.end - span.start
            )
        cached = final.num_cached_tokens or 0
        c = self._counters
        c.requests += 1
        c.aborted += completion.finish_reason == "abort"
        c.prompt_tokens += prompt_len
        c.cached_prompt_tokens += cached
        c.generated_tokens += len(token_ids)
        return TokenOutput(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=completion.finish_reason,
            num_cached_tokens=cached,
            weight_version=self.weight_loader.version,
            token_versions=token_versions,
            num_prompt_tokens=prompt_len,
            metrics={"latency_s": latency},
        )
