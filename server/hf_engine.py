"""``HFEngine``: the ``RolloutEngine`` interface over plain transformers.

For machines where vLLM cannot be installed, and for fast tests. The model and its KV cache
live on ``engine.hf_device`` (the GPU when torch sees one, else the CPU); sampling draws
from each request's seeded CPU generator on either. One asyncio scheduler task
runs cycles: it admits queued requests (up to ``hf_max_batch_size`` in flight, collecting for
``hf_batch_wait_ms`` when idle), prefills each one alone (reusing the longest cached prefix of
a past sequence), then decodes every in-flight request one token per step over a shared
left-padded KV cache. Model work runs on one worker thread so the event loop stays free;
weight updates, prefix-cache resets and pauses take effect between steps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from agentrl.core.config import ModelConfig
from agentrl.core.types import (
    INITIAL_WEIGHT_VERSION,
    PauseMode,
    RolloutError,
    SamplingParams,
    TokenOutput,
)
from agentrl.models.attention import varying_shape_attention
from agentrl.server.checks import check_prompt, clamp_max_tokens
from agentrl.server.config import EngineConfig
from agentrl.server.engine import NamedTensors, RolloutEngine
from agentrl.server.hf_kv import KV, DecodeBatch, PrefixCache, prefill
from agentrl.server.hf_sampling import HFRequest, make_generator

logger = logging.getLogger(__name__)

_COUNTERS = (
    "requests",
    "prompt_tokens",
    "cached_prompt_tokens",
    "generated_tokens",
    "decode_steps",
    "decode_rows",
    "failed_requests",
    "aborted",
)


class HFEngine(RolloutEngine):
    """Continuous-batching transformers engine with prefix caching and live weight updates."""

    def __init__(self, model: ModelConfig, engine: EngineConfig) -> None:
        _limit_torch_threads()
        self._cfg = engine
        self.device = _resolve_device(engine.hf_device)
        self._model: PreTrainedModel = (
            AutoModelForCausalLM.from_pretrained(
                model.path,
                dtype=getattr(torch, model.dtype),
                trust_remote_code=model.trust_remote_code,
            )
            .to(self.device)
            .eval()
        )
        self._params = self._model.state_dict()
        self._vocab_size: int = self._model.config.get_text_config().vocab_size
        self._eos_ids = _eos_token_ids(self._model)
        entries = engine.hf_prefix_cache_entries if engine.enable_prefix_caching else 0
        self._prefix = PrefixCache(entries)
        self._batch: DecodeBatch[HFRequest] = DecodeBatch()
        self._pending: deque[HFRequest] = deque()  # submitted, not yet admitted
        self._held: list[HFRequest] = []  # submitted while paused
        self._prefilling: list[HFRequest] = []  # admitted in the running cycle
        self._finished: list[HFRequest] = []  # finished in the worker, output not yet delivered
        self._requests: dict[str, HFRequest] = {}
        self._mode: PauseMode | None = None
        self._version = INITIAL_WEIGHT_VERSION
        self._epoch = 0  # bumped by every weight update: KV of an older epoch is stale
        self._seeds = random.Random(engine.seed)
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._step_lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._progress = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._closed = False
        logger.info(
            "HFEngine loaded %s (%s on %s, %d torch threads, batch %d, prefix cache %d entries)",
            model.path,
            model.dtype,
            self.device,
            torch.get_num_threads(),
            engine.hf_max_batch_size,
            entries,
        )

    @property
    def weight_version(self) -> int:
        """The policy version of the weights currently loaded."""
        return self._version

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids``; raises ``RolloutError`` on bad input."""
        seq = self._new_seq(request_id, prompt_ids, sampling)
        self._requests[request_id] = seq
        (self._held if self._mode is not None else self._pending).append(seq)
        self._kick()
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            seq.aborted = True
            self._kick()
            raise
        finally:
            if self._requests.get(request_id) is seq:
                del self._requests[request_id]
            self._signal()

    async def abort(self, request_id: str) -> TokenOutput | None:
        """Stop ``request_id`` (within one step); returns its partial output, or None if unknown."""
        seq = self._requests.get(request_id)
        if seq is None:
            return None
        seq.aborted = True
        self._kick()
        try:
            return await asyncio.shield(seq.future)
        except Exception:  # the request failed before it could be aborted
            return None

    async def pause(self, mode: PauseMode | str = PauseMode.KEEP) -> None:
        """Stop scheduling tokens; see ``PauseMode``. New requests are held until ``resume``."""
        mode = PauseMode(mode)
        self._mode = mode
        logger.info("HFEngine pause(%s): %d in flight", mode.value, len(self._requests))
        if mode is PauseMode.ABORT:
            for seq in self._requests.values():
                seq.aborted = True
        self._kick()
        if mode is PauseMode.KEEP:
            async with self._step_lock:  # the step running now, if any, completes first
                return
        await self._wait_until(lambda: all(s in self._held for s in self._requests.values()))

    async def resume(self) -> None:
        """Continue after ``pause``; held requests are admitted."""
        self._mode = None
        self._pending.extend(self._held)
        self._held.clear()
        logger.info("HFEngine resumed")
        self._kick()

    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Validate every tensor, then copy them in between decode steps and tag ``version``."""
        tensors = list(named_tensors)
        self._check_weights(tensors)
        async with self._step_lock:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self._load_weights, tensors
            )
            self._version = version
            self._epoch += 1
            self._prefix.clear()
        logger.info("HFEngine loaded %d tensors as weight version %d", len(tensors), version)

    async def reset_prefix_cache(self) -> None:
        """Drop every cached past sequence."""
        async with self._step_lock:
            self._prefix.clear()

    async def stats(self) -> dict[str, Any]:
        """Weight version, pause mode, queue sizes and token / cache counters."""
        return {
            "backend": "hf",
            "weight_version": self._version,
            "paused": self._mode.value if self._mode else None,
            "num_running": len(self._batch),
            "num_waiting": len(self._pending) + len(self._held),
            "prefix_cache_entries": len(self._prefix),
            **self._counters,
        }

    async def shutdown(self) -> None:
        """Abort every request, stop the scheduler and release the worker thread."""
        if self._closed:
            return
        self._closed = True
        await self.pause(PauseMode.ABORT)
        async with self._step_lock:
            if self._scheduler is not None:
                self._scheduler.cancel()
        self._executor.shutdown(wait=False)
        self._prefix.clear()
        self._batch.clear()
        logger.info("HFEngine shut down")

    # -- request intake (event loop) ---------------------------------------------------------

    def _new_seq(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> HFRequest:
        if self._closed:
            raise RuntimeError("HFEngine is shut down")
        if request_id in self._requests:
            raise RolloutError(f"request_id {request_id!r} is already in flight")
        sampling.validate()
        check_prompt(prompt_ids, self._cfg.max_model_len, self._vocab_size)
        seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(63)
        return HFRequest(
            request_id=request_id,
            prompt=list(prompt_ids),
            sampling=sampling,
            max_tokens=clamp_max_tokens(sampling, len(prompt_ids), self._cfg.max_model_len),
            generator=make_generator(seed),
            future=asyncio.get_running_loop().create_future(),
        )

    def _check_weights(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in tensors:
            if name not in self._params:
                raise RolloutError(f"unknown weight {name!r}: the model has no such tensor")
            expected = tuple(self._params[name].shape)
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != expected:
                got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)
                raise RolloutError(f"weight {name!r} has shape {got}, the model expects {expected}")

    def _kick(self) -> None:
        """Wake the scheduler task (starting it on the running loop if needed)."""
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.get_running_loop().create_task(
                self._schedule(), name="hf-engine-scheduler"
            )
        self._wakeup.set()

    def _signal(self) -> None:
        """Wake every ``_wait_until``."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._progress.wait()

    # -- scheduler (event loop) --------------------------------------------------------------

    @property
    def _frozen(self) -> bool:
        return self._mode in (PauseMode.KEEP, PauseMode.ABORT)

    def _has_work(self) -> bool:
        if any(s.aborted for s in [*self._pending, *self._held, *self._batch.items]):
            return True
        return not self._frozen and bool(self._pending or self._batch)

    async def _schedule(self) -> None:
        """The scheduler task: run cycles while there is work, sleep otherwise."""
        while True:
            self._wakeup.clear()
            if not self._has_work():
                await self._wakeup.wait()
                continue
            if not self._batch and self._cfg.hf_batch_wait_ms > 0:  # collect a batch
                await asyncio.sleep(self._cfg.hf_batch_wait_ms / 1000)
            async with self._step_lock:
                await self._cycle()

    async def _cycle(self) -> None:
        """Drop aborted queued requests, admit new ones, run one worker step, deliver outputs."""
        for queue in (self._pending, self._held):
            for seq in [s for s in queue if s.aborted]:
                queue.remove(seq)
                self._finished.append(seq)
        room = self._cfg.hf_max_batch_size - len(self._batch)
        while self._pending and not self._frozen and len(self._prefilling) < room:
            self._prefilling.append(self._pending.popleft())
        decode = not self._frozen
        if self._prefilling or (decode and self._batch) or any(s.done for s in self._batch.items):
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._work, self._prefilling, decode, self._version
                )
            except Exception as exc:
                logger.exception("HFEngine step failed: failing every in-flight request")
                for seq in [*self._prefilling, *self._batch.items]:
                    seq.error = exc
                    self._finished.append(seq)
                self._batch.clear()
        self._prefilling = []
        self._deliver()

    def _deliver(self) -> None:
        """Resolve the futures of finished requests."""
        finished, self._finished = self._finished, []
        for seq in finished:
            if seq.future.done():
                continue
            if seq.error is not None:
                self._counters["failed_requests"] += 1
                seq.future.set_exception(seq.error)
            else:
                output = seq.output(self._version)
                self._counters["aborted"] += output.finish_reason == "abort"
                seq.future.set_result(output)
        self._signal()

    # -- model work (worker thread) ----------------------------------------------------------

    def _work(self, admitted: list[HFRequest], decode: bool, version: int) -> None:
        """One step: retire aborted rows, prefill ``admitted``, decode one token per row."""
        with torch.inference_mode(), varying_shape_attention():
            self._retire_done()
            self._batch.add([(s, kv) for s in admitted if (kv := self._prefill(s, version))])
            if decode and len(self._batch):
                self._decode(version)
            self._retire_done()

    def _prefill(self, seq: HFRequest, version: int) -> KV | None:
        """Compute ``seq``'s prompt KV and first token; the KV if it goes on decoding."""
        try:
            cached, prefix = self._prefix.lookup(seq.prompt, limit=len(seq.prompt) - 1)
            logits, kv = prefill(self._model, prefix, seq.prompt[cached:])
        except Exception as exc:
            logger.exception("prefill of request %r failed", seq.request_id)
            seq.error = exc
            self._finished.append(seq)
            return None
        seq.num_cached, seq.epoch = cached, self._epoch
        self._counters["requests"] += 1
        self._counters["prompt_tokens"] += len(seq.prompt)
        self._counters["cached_prompt_tokens"] += cached
        self._sample(seq, logits, version)
        if seq.done:
            self._finish(seq, kv)
            return None
        return kv

    def _decode(self, version: int) -> None:
        rows = list(self._batch.items)
        try:
            logits = self._batch.step(self._model, [seq.tokens[-1] for seq in rows])
        except Exception as exc:
            logger.exception("decode step of %d requests failed", len(rows))
            for seq in rows:
                seq.error = exc
            return
        self._counters["decode_steps"] += 1
        self._counters["decode_rows"] += len(rows)
        for row, seq in enumerate(rows):
            self._sample(seq, logits[row], version)

    def _sample(self, seq: HFRequest, logits: torch.Tensor, version: int) -> None:
        try:
            seq.advance(logits, version, self._eos_ids)
        except Exception as exc:
            logger.exception("sampling for request %r failed", seq.request_id)
            seq.error = exc
            return
        self._counters["generated_tokens"] += 1

    def _retire_done(self) -> None:
        done = [s for s in self._batch.items if s.done]
        if not done:  # most steps: no row finished, the batch's cache stays as it is
            return
        for seq, kv in self._batch.remove(done):
            self._finish(seq, kv)

    def _finish(self, seq: HFRequest, kv: KV) -> None:
        """Queue ``seq``'s output; remember its KV if computed under the current weights."""
        if seq.error is None and seq.epoch == self._epoch:
            self._prefix.store(seq.prompt + seq.tokens[:-1], kv)
        self._finished.append(seq)

    def _load_weights(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            for name, tensor in tensors:
                self._params[name].copy_(tensor)


def _resolve_device(name: str) -> torch.device:
    """``engine.hf_device`` as a device: auto is the current CUDA device if torch sees one."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    elif name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("engine.hf_device=cuda, but torch sees no GPU; use cpu or auto")
    if name == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def _limit_torch_threads() -> None:
    """Leave one core to the event loop: intra-op threads = min(torch default, cores - 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, min(torch.get_num_threads(), (cores or 1) - 1)))


def _eos_token_ids(model: PreTrainedModel) -> set[int]:
    """End-of-sequence ids from the model config and its generation config."""
    ids: set[int] = set()
    for source in (model.config.get_text_config(), getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    return ids
