"""``RolloutEngine`` backed by an in-process vLLM v1 ``AsyncLLM``.

Token ids in, token ids out: no detokenization, one sampled-token logprob per generated
token, and the policy version that sampled each token. Weight versions are vLLM's own
labels (``AsyncLLM.update_weight_version``); the engine core stamps every step's output with
the label in force and ``CompletionOutput.weight_versions`` reports them as spans.
Weights are only swapped while the scheduler is paused, so the labels are exact.

With ``engine.weight_swap=staged`` (the default) a weight push is loaded into a shadow copy
of the model inside the workers while generation goes on (the tensors reach the engine-core
process through a shared-memory file, or the weight-broadcast group), and the pause only
swaps the processed tensors and kernel handles (``vllm_worker_ext.StagedWeights``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import vllm
from transformers import AutoConfig, AutoModelForCausalLM
from vllm import SamplingParams as VLLMSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.inputs import tokens_input
from vllm.outputs import RequestOutput
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from agentrl.core.config import ModelConfig
from agentrl.core.types import (
    INITIAL_WEIGHT_VERSION,
    PauseMode,
    RolloutError,
    SamplingParams,
    TokenOutput,
)
from agentrl.core.weights import BucketPlan
from agentrl.server.checks import check_prompt, clamp_max_tokens
from agentrl.server.collective import unpack
from agentrl.server.config import EngineConfig
from agentrl.server.engine import (
    NamedTensors,
    RolloutEngine,
    Weights,
    WeightWorkers,
    WorkerWeights,
)
from agentrl.server.vllm_worker_ext import encode_tensor, missing_inplace_internals

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "agentrl.server.vllm_worker_ext.WeightSyncExtension"
# Upper bound of one weight-update message; a fused module is never split across messages.
_UPDATE_CHUNK_BYTES = 512 * 1024**2
_FINISH_REASONS = ("stop", "length", "abort")
# How often a staged load is polled (each poll is one short engine-core call).
_STAGE_POLL_S = 0.01
# Executors whose workers share this node (and /dev/shm) with the engine.
_LOCAL_EXECUTORS = (None, "uni", "mp")
TESTED_VLLM_VERSIONS = ("0.32.0",)
"""vLLM releases the weight swaps are tested with. Both reach into vLLM internals, which
change between releases: the staged swap builds its shadow model through them, and the
in-place reload runs vLLM's layerwise reload one message at a time
(``vllm_worker_ext.InPlaceReload``). Keep in step with the pins of the ``cpu`` and ``gpu``
extras in pyproject.toml."""

UNTESTED_VLLM_ENV = "AGENTRL_ALLOW_UNTESTED_VLLM"
"""Set to ``1`` to start engines on an untested vLLM release anyway (in-place reload)."""


class UntestedVLLMError(RuntimeError):
    """The installed vLLM is not a release the weight swaps are tested with."""


def weight_swap_for(requested: str, vllm_version: str) -> str:
    """The weight swap to use, decided when the engine starts (never at a push).

    ``requested`` on a tested vLLM release. On another release ``UntestedVLLMError``,
    unless ``AGENTRL_ALLOW_UNTESTED_VLLM=1``: then ``inplace``, once the vLLM internals the
    in-place reload calls are found (logged once per release).
    """
    release = vllm_version.partition("+")[0]  # "0.32.0+cpu" is release 0.32.0
    if release in TESTED_VLLM_VERSIONS:
        return requested
    tested = ", ".join(TESTED_VLLM_VERSIONS)
    if os.environ.get(UNTESTED_VLLM_ENV, "") != "1":
        raise UntestedVLLMError(
            f"vLLM {vllm_version} is not a release agentrl's weight swaps are tested with "
            f"({tested}): both the staged swap and the in-place reload use vLLM internals "
            "that change between releases, so a weight push could fail mid-run. Install a "
            f"tested release (pip install 'agentrl[gpu]' or 'agentrl[cpu]'), or set "
            f"{UNTESTED_VLLM_ENV}=1 to load weight pushes in place on it at your own risk."
        )
    missing = missing_inplace_internals()
    if missing:
        raise UntestedVLLMError(
            f"vLLM {vllm_version} lacks what the in-place weight reload calls "
            f"({', '.join(missing)}), so a weight push would fail; install a tested "
            f"release ({tested})."
        )
    _warn_untested_vllm(vllm_version)
    return "inplace"


@functools.cache
def _warn_untested_vllm(vllm_version: str) -> None:
    logger.warning(
        "vLLM %s is not a release the weight swaps are tested with (%s); %s=1: weight pushes "
        "load in place while generation is paused (engine.weight_swap=inplace)",
        vllm_version,
        ", ".join(TESTED_VLLM_VERSIONS),
        UNTESTED_VLLM_ENV,
    )


@dataclass
class _Counters:
    requests: int = 0
    aborted: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    weight_updates: int = 0


def _set_cpu_env_defaults(engine: EngineConfig) -> None:
    """Environment the CPU build of vLLM needs; values already set are kept."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if engine.kv_cache_memory_bytes is None:
        # Without an explicit size the CPU backend sizes the KV cache from
        # gpu_memory_utilization × node memory, far too much on a shared machine.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    elif os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        logger.warning(
            "VLLM_CPU_KVCACHE_SPACE=%s GiB overrides kv_cache_memory_bytes=%d on the CPU "
            "backend; unset it to use the configured size",
            os.environ["VLLM_CPU_KVCACHE_SPACE"],
            engine.kv_cache_memory_bytes,
        )


def _hf_parameter_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the Hugging Face state dict (what a trainer sends).

    vLLM fuses q/k/v and gate/up projections, so updates are validated against the
    checkpoint-style names of a meta-device transformers model instead of vLLM's own
    parameters. No memory is allocated.
    """
    config = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(
            config, trust_remote_code=model.trust_remote_code
        )
    return {name: tuple(t.shape) for name, t in hf_model.state_dict().items()}


def _module_groups(names: Iterable[str], packed: dict[str, list[str]]) -> dict[str, str]:
    """Map each tensor name to the vLLM module that loads it.

    ``model.layers.0.self_attn.k_proj.bias`` → ``model.layers.0.self_attn.qkv_proj`` when
    ``packed`` fuses ``k_proj`` into ``qkv_proj``; otherwise the tensor's own module.
    """
    fused_of = {part: fused for fused, parts in packed.items() for part in parts}
    groups = {}
    for name in names:
        module = name.rpartition(".")[0]
        parent, dot, leaf = module.rpartition(".")
        if leaf in fused_of:
            module = f"{parent}{dot}{fused_of[leaf]}"
        groups[name] = module
    return groups


def _to_version(label: str) -> int:
    """The integer policy version behind a vLLM weight-version label ("default" until the
    first ``update_weight_version`` call: the initial weights)."""
    try:
        return int(label)
    except ValueError:
        return INITIAL_WEIGHT_VERSION


def engine_args(model: ModelConfig, engine: EngineConfig) -> AsyncEngineArgs:
    """The ``AsyncLLM`` arguments of a replica (also used by benchmarks that drive a
    bare ``AsyncLLM`` to compare against). On CPU, sets the environment it needs."""
    if current_platform.is_cpu():
        _set_cpu_env_defaults(engine)
    return AsyncEngineArgs(
        model=model.path,
        tokenizer=model.tokenizer,
        dtype=model.dtype,
        trust_remote_code=model.trust_remote_code,
        seed=engine.seed,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        tensor_parallel_size=engine.tensor_parallel_size,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
        block_size=engine.block_size,
        enable_prefix_caching=engine.enable_prefix_caching,
        enforce_eager=engine.enforce_eager,
        worker_extension_cls=WORKER_EXTENSION,
    )


class VLLMEngine(RolloutEngine):
    """vLLM v1 ``AsyncLLM`` in this process (engine core and workers in child processes).

    Prefix caching is on (``engine.enable_prefix_caching``), the KV cache is sized by
    ``engine.kv_cache_memory_bytes`` (or ``gpu_memory_utilization`` when None on GPU), and
    weights are pushed to the workers through ``collective_rpc`` to
    ``vllm_worker_ext.WeightSyncExtension``.
    """

    def __init__(self, model: ModelConfig, engine: EngineConfig) -> None:
        """Start the engine (blocks for the model load, ~25 s for a tiny model on CPU).

        Raises ``UntestedVLLMError`` first on a vLLM release the weight swaps are not
        tested with (see ``weight_swap_for``)."""
        self._staged_swap = weight_swap_for(engine.weight_swap, vllm.__version__) == "staged"
        self._model_cfg = model
        self._dtype: torch.dtype = getattr(torch, model.dtype)
        self._param_shapes = _hf_parameter_shapes(model)
        start = time.perf_counter()
        self._llm = AsyncLLM.from_engine_args(engine_args(model, engine))
        model_config = self._llm.model_config
        self._max_model_len: int = model_config.max_model_len
        self._vocab_size: int = model_config.get_vocab_size()
        # tensor name -> vLLM module and module -> tensor names; filled on the first update
        self._module_of: dict[str, str] = {}
        self._module_members: dict[str, set[str]] = {}
        self._version = INITIAL_WEIGHT_VERSION
        self._paused = False
        self._closed = False
        self._warned_cpu_seed = False
        self._control = asyncio.Lock()  # serializes pause / resume / update_weights
        self._staging = asyncio.Lock()  # one staged load (and its commit) at a time
        self._staging_ready: asyncio.Task[None] | None = None
        if self._staged_swap:
            # Build the workers' shadow models now rather than inside the first push
            # (without a running loop: at the first push).
            with contextlib.suppress(RuntimeError):
                self._staging_ready = asyncio.get_running_loop().create_task(self._init_staging())
        self._inflight: dict[str, asyncio.Future[TokenOutput | None]] = {}
        self._counters = _Counters()
        self.last_swap_timings: dict[str, float] = {}
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
        return self._version

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenOutput:
        """Generate from ``prompt_ids``; ``max_tokens`` is clamped to the context window.

        Raises ``RolloutError`` for an empty, too long or out-of-vocabulary prompt, invalid
        sampling parameters, or a ``request_id`` that is already in flight.
        """
        self._check_open()
        check_prompt(prompt_ids, self._max_model_len, self._vocab_size)
        sampling.validate()
        if request_id in self._inflight:
            raise RolloutError(f"request_id {request_id!r} is already in flight")
        try:
            params = self._vllm_sampling(sampling, len(prompt_ids))
        except (VLLMClientError, ValueError) as exc:
            raise RolloutError(f"invalid sampling parameters: {exc}") from exc
        done: asyncio.Future[TokenOutput | None] = asyncio.get_running_loop().create_future()
        self._inflight[request_id] = done
        result: TokenOutput | None = None
        start = time.perf_counter()
        try:
            final: RequestOutput | None = None
            async for output in self._llm.generate(
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
        await self._llm.abort(request_id)
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
        self._check_open()
        async with self._control:
            await self._pause_engine(pause_mode)
            self._paused = True
        logger.info("paused generation (mode=%s)", pause_mode.value)

    async def resume(self) -> None:
        """Continue after ``pause``; held and queued requests are scheduled again."""
        self._check_open()
        async with self._control:
            await self._llm.resume_generation()
            self._paused = False
        logger.info("resumed generation")

    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load new weights (Hugging Face names) and label what is sampled next ``version``.

        Every tensor is checked before anything is loaded: an unknown name, a wrong shape
        or a fused vLLM module given only some of its tensors raises ``RolloutError`` and
        the old weights stay. If the engine is not paused it is paused (``keep``) for the
        swap, so no step mixes weights and labels; staged, only for the swap itself. The
        prefix cache is not reset here.
        """
        self._check_open()
        tensors = self._validate_update(named_tensors)
        if await self._use_staging():
            async with self._staging:
                await self._stage_tensors(tensors)
                await self._commit_staged(version, PauseMode.KEEP, reset_cache=False)
            return
        await self._load_in_place(tensors, version)

    async def _load_in_place(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Load checked ``tensors`` into the live model as one reload, label ``version``."""
        async with self._control:
            await self._check_whole_modules([name for name, _ in tensors])
            chunks = self._chunk_by_module(tensors)
            pause_here = not self._paused
            if pause_here:
                await self._pause_engine(PauseMode.KEEP)
            start = time.perf_counter()
            try:
                await self._reload(chunks)
                await self._llm.update_weight_version(str(version))
                self._version = version
                self._counters.weight_updates += 1
            finally:
                if pause_here:
                    await self._llm.resume_generation()
        logger.info(
            "loaded %d tensors in %d message(s) in %.2fs; weight version %d",
            len(tensors),
            len(chunks),
            time.perf_counter() - start,
            version,
        )

    async def _reload(self, chunks: list[list[tuple[str, torch.Tensor]]]) -> None:
        """One in-place reload in the workers, fed one message per chunk.

        One reload per push, not per message: vLLM's reload warns about (and keeps the old
        tensors of) every layer a reload did not receive.
        """
        await self._llm.collective_rpc("agentrl_reload_begin")
        try:
            for i, chunk in enumerate(chunks):
                encoded = [encode_tensor(name, t) for name, t in chunk]
                try:
                    await self._llm.collective_rpc("agentrl_load_weights", args=(encoded,))
                except Exception as exc:
                    raise RuntimeError(
                        f"loading weight message {i + 1}/{len(chunks)} failed; the "
                        f"engine may hold a mix of old and new weights: {exc}"
                    ) from exc
        finally:
            await self._llm.collective_rpc("agentrl_reload_end")

    async def swap_weights(
        self, weights: Weights, version: int, mode: PauseMode | str = PauseMode.KEEP
    ) -> float:
        """Pause (``mode``) → swap in ``weights`` as ``version`` → reset cache → resume.

        ``weights`` are buckets of tensors, or ``WorkerWeights`` the workers receive
        themselves (a broadcast). Staged: the weights are checked, delivered to the
        workers and loaded into the shadow model first, while requests keep generating; a
        failure there raises and leaves the old weights and version serving. In place,
        the pause covers the delivery too. Returns the seconds generation was paused.
        """
        self._check_open()
        pause_mode = PauseMode(mode)
        if isinstance(weights, WorkerWeights):
            if not await self._use_staging():
                return await self._swap_in_place(
                    lambda: self._reload_in_workers(weights.source, version), pause_mode
                )
            async with self._staging:
                await self._run_staging(weights.source)
                return await self._commit_staged(version, pause_mode, reset_cache=True)
        if not await self._use_staging():
            return await self._swap_in_place(
                lambda: self._update_buckets(weights, version), pause_mode
            )
        tensors = self._validate_update(itertools.chain.from_iterable(weights))
        async with self._staging:
            await self._stage_tensors(tensors)
            return await self._commit_staged(version, pause_mode, reset_cache=True)

    async def _update_buckets(self, buckets: Sequence[NamedTensors], version: int) -> None:
        """All ``buckets`` checked, then loaded as one reload (see ``_reload``)."""
        await self._load_in_place(
            self._validate_update(itertools.chain.from_iterable(buckets)), version
        )

    async def _swap_in_place(self, load: Callable[[], Awaitable[None]], mode: PauseMode) -> float:
        """Pause → ``load`` → reset prefix cache → resume, timed like a staged swap."""
        marks = [("start", time.perf_counter())]
        await self.pause(mode)
        marks.append(("pause_wait", time.perf_counter()))
        try:
            await load()
            marks.append(("load", time.perf_counter()))
            await self.reset_prefix_cache()
            marks.append(("reset_cache", time.perf_counter()))
        finally:
            await self.resume()
            marks.append(("resume", time.perf_counter()))
        self._record_swap(marks)
        return marks[-1][1] - marks[0][1]

    # -- staged swap --------------------------------------------------------------------

    async def _use_staging(self) -> bool:
        """Whether pushes are staged (builds the workers' shadow models on first use)."""
        if not self._staged_swap:
            return False
        if self._staging_ready is None:
            self._staging_ready = asyncio.get_running_loop().create_task(self._init_staging())
        await asyncio.shield(self._staging_ready)
        return self._staged_swap

    async def _init_staging(self) -> None:
        start = time.perf_counter()
        try:
            sizes = await self._llm.collective_rpc("agentrl_stage_init")
        except Exception as exc:
            self._staged_swap = False
            logger.warning(
                "staged weight swap unavailable (%s); weight pushes load in place while "
                "generation is paused",
                exc,
            )
            return
        logger.info(
            "staged weight swap ready in %.2fs (shadow model: %.1f MB of tensors per worker "
            "besides the kernels' packed weights)",
            time.perf_counter() - start,
            max(sizes) / 1e6,
        )

    async def _stage_tensors(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Load ``tensors`` into the workers' shadow models; the live model keeps serving."""
        async with self._control:
            await self._check_whole_modules([name for name, _ in tensors])
        path = None
        try:
            if self._workers_are_local():
                path, plan = await asyncio.to_thread(_write_shared_file, tensors)
                source: dict[str, Any] = {"kind": "shm", "path": path, "plan": plan.to_wire()}
            else:
                encoded = await asyncio.to_thread(
                    lambda: [encode_tensor(name, t) for name, t in tensors]
                )
                source = {"kind": "inline", "tensors": encoded}
            await self._run_staging(source)
        finally:
            if path is not None:
                _unlink(path)

    async def _run_staging(self, source: dict[str, Any]) -> None:
        """Start a staged load on every worker and wait for it without blocking generation."""
        start = time.perf_counter()
        await self._wait_staged()  # a load abandoned by a cancelled push
        await self._llm.collective_rpc("agentrl_stage_begin", args=(source, True))
        states = await self._wait_staged()
        errors = [error for _, error, _ in states if error]
        if errors:
            raise RuntimeError(
                f"staging the new weights failed; version {self._version} keeps serving: "
                f"{errors[0]}"
            )
        logger.info(
            "staged %d tensors (%s) in %.2fs",
            states[0][2],
            source["kind"],
            time.perf_counter() - start,
        )

    async def _wait_staged(self) -> list[list[Any]]:
        while True:
            states = await self._llm.collective_rpc("agentrl_stage_poll")
            if all(done for done, _, _ in states):
                return states
            await asyncio.sleep(_STAGE_POLL_S)

    async def _commit_staged(self, version: int, mode: PauseMode, reset_cache: bool) -> float:
        """Pause (unless paused) → swap the staged weights in → label ``version`` → resume.

        Returns the seconds generation was paused here.
        """
        async with self._control:
            marks = [("start", time.perf_counter())]
            pause_here = not self._paused
            if pause_here:
                await self._pause_engine(mode)
            marks.append(("pause_wait", time.perf_counter()))
            try:
                try:
                    await self._llm.collective_rpc("agentrl_stage_commit")
                except Exception as exc:
                    raise RuntimeError(
                        f"swapping in the staged weights (version {version}) failed; the "
                        f"engine may hold a mix of old and new weights: {exc}"
                    ) from exc
                marks.append(("swap", time.perf_counter()))
                await self._llm.update_weight_version(str(version))
                self._version = version
                self._counters.weight_updates += 1
                marks.append(("label", time.perf_counter()))
                if reset_cache:
                    await self._reset_prefix_cache()
                    marks.append(("reset_cache", time.perf_counter()))
            finally:
                if pause_here:
                    await self._llm.resume_generation()
                    marks.append(("resume", time.perf_counter()))
        self._record_swap(marks)
        return marks[-1][1] - marks[0][1]

    def _record_swap(self, marks: list[tuple[str, float]]) -> None:
        """Keep the phases of the last swap (``last_swap_timings``, seconds) and log them.

        ``pause_wait`` is the time until the engine core took the pause: it finishes the
        step in flight first, which still produces tokens. ``paused`` is the rest.
        """
        timings = {f"{name}_s": t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}
        timings["total_s"] = marks[-1][1] - marks[0][1]
        timings["paused_s"] = timings["total_s"] - timings.get("pause_wait_s", 0.0)
        self.last_swap_timings = timings
        logger.info(
            "weight swap to version %d: %s",
            self._version,
            ", ".join(f"{k.removesuffix('_s')} {v * 1e3:.1f} ms" for k, v in timings.items()),
        )

    def _workers_are_local(self) -> bool:
        parallel = self._llm.vllm_config.parallel_config
        backend = parallel.distributed_executor_backend
        return backend in _LOCAL_EXECUTORS and getattr(parallel, "nnodes", 1) <= 1

    async def _pause_engine(self, mode: PauseMode) -> None:
        if mode is PauseMode.KEEP:
            # Frozen requests emit nothing, so AsyncLLM's 20 ms wait for final outputs
            # (pause_generation) is not needed.
            await self._llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)
        else:
            await self._llm.pause_generation(mode=mode.value, clear_cache=False)

    # -- weight transports that deliver into the workers (server/weight_receivers.py) -----

    def weight_workers(self) -> WeightWorkers:
        """One rank per vLLM worker (tensor × pipeline parallel); tensors arrive in ``dtype``."""
        parallel = self._llm.vllm_config.parallel_config
        return WeightWorkers(
            num_workers=parallel.tensor_parallel_size * parallel.pipeline_parallel_size,
            dtype=self._model_cfg.dtype,
            call=self._call_workers,
            check=self._check_buckets,
        )

    async def _call_workers(
        self, kind: str, step: str, *args: Any, timeout: float | None = None
    ) -> list[Any]:
        """Step ``step`` of receiver ``kind`` on every worker, between engine steps (joining
        a broadcast group blocks the engine core until every rank arrived)."""
        self._check_open()
        async with self._control:
            return await self._llm.collective_rpc(
                "agentrl_receiver_call", timeout=timeout, args=(kind, step, *args)
            )

    async def _check_buckets(self, buckets: list[list[tuple[str, tuple[int, ...]]]]) -> None:
        """Every ``(name, shape)`` is a known weight of that shape; modules are whole."""
        self._check_open()
        seen: set[str] = set()
        for bucket in buckets:
            for name, shape in bucket:
                self._check_param(name, tuple(shape), seen)
            async with self._control:
                await self._check_whole_modules([name for name, _ in bucket])

    async def _reload_in_workers(self, source: dict[str, Any], version: int) -> None:
        """The workers receive ``source`` into the live model (one reload); label ``version``.

        Pauses (``keep``) for the load if the engine is not paused already. A failure part
        way leaves a mix of old and new weights; the version label stays the old one.
        """
        async with self._control:
            pause_here = not self._paused
            if pause_here:
                await self._pause_engine(PauseMode.KEEP)
            start = time.perf_counter()
            try:
                try:
                    counts = await self._llm.collective_rpc("agentrl_reload_from", args=(source,))
                except Exception as exc:
                    raise RuntimeError(
                        f"receiving {source['kind']} weights (version {version}) failed; the "
                        f"engine may hold a mix of old and new weights: {exc}"
                    ) from exc
                await self._llm.update_weight_version(str(version))
                self._version = version
                self._counters.weight_updates += 1
            finally:
                if pause_here:
                    await self._llm.resume_generation()
        logger.info(
            "received %d tensors (%s) in %.2fs; weight version %d",
            counts[0],
            source["kind"],
            time.perf_counter() - start,
            version,
        )

    async def reset_prefix_cache(self) -> None:
        """Drop every cached KV block; running requests are recomputed from their tokens."""
        self._check_open()
        await self._reset_prefix_cache()

    async def _reset_prefix_cache(self) -> None:
        if not await self._llm.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM could not reset the prefix cache")

    async def stats(self) -> dict[str, Any]:
        """Weight version, in-flight requests, token and prefix-cache counters."""
        c = self._counters
        unfinished = 0 if self._closed else self._llm.get_num_unfinished_requests()
        return {
            "backend": "vllm",
            "weight_version": self._version,
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
            "weight_updates": c.weight_updates,
        }

    async def shutdown(self) -> None:
        """Abort in-flight requests and stop the engine core and worker processes."""
        if self._closed:
            return
        if self._inflight:
            await self._llm.abort(list(self._inflight))
        if self._staging_ready is not None and not self._staging_ready.done():
            self._staging_ready.cancel()
        self._closed = True
        self._llm.shutdown()
        # Drop the client now: its __del__ shuts down again and fails at interpreter exit.
        del self._llm
        logger.info("vLLM engine shut down")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the vLLM engine has been shut down")

    def _request_seed(self, seed: int | None) -> int | None:
        """The per-request seed to give vLLM (None on CPU, where seeds kill the engine)."""
        if seed is None or not current_platform.is_cpu():
            return seed
        # vLLM-CPU 0.32 crashes the whole EngineCore ("CPU Generator does not use offset")
        # when a seeded request's prefill is chunked, so seeds are ignored on CPU.
        if not self._warned_cpu_seed:
            logger.warning("per-request seeds are ignored by vLLM on CPU (engine bug)")
            self._warned_cpu_seed = True
        return None

    def _vllm_sampling(self, sampling: SamplingParams, prompt_len: int) -> VLLMSamplingParams:
        return VLLMSamplingParams(
            max_tokens=clamp_max_tokens(sampling, prompt_len, self._max_model_len),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            seed=self._request_seed(sampling.seed),
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

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
        token_versions = [self._version] * len(token_ids)
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
            weight_version=self._version,
            token_versions=token_versions,
            num_prompt_tokens=prompt_len,
            metrics={"latency_s": latency},
        )

    def _validate_update(self, named_tensors: NamedTensors) -> list[tuple[str, torch.Tensor]]:
        """Check names and shapes against the HF state dict; cast floats to the model dtype."""
        tensors: list[tuple[str, torch.Tensor]] = []
        seen: set[str] = set()
        for name, tensor in named_tensors:
            self._check_param(name, tuple(tensor.shape), seen)
            if tensor.is_floating_point():
                tensor = tensor.to(self._dtype)
            tensors.append((name, tensor))
        if not tensors:
            raise RolloutError("update_weights got no tensors")
        return tensors

    def _check_param(self, name: str, shape: tuple[int, ...], seen: set[str]) -> None:
        expected = self._param_shapes.get(name)
        if expected is None:
            raise RolloutError(
                f"unknown parameter {name!r}: {self._model_cfg.path} has no such weight"
            )
        if shape != expected:
            raise RolloutError(f"parameter {name!r} has shape {shape}, expected {expected}")
        if name in seen:
            raise RolloutError(f"parameter {name!r} appears twice in one update")
        seen.add(name)

    async def _check_whole_modules(self, names: list[str]) -> None:
        """Reject an update that gives a vLLM module only some of its tensors."""
        if not self._module_of:
            packed = (await self._llm.collective_rpc("agentrl_packed_modules"))[0]
            self._module_of = _module_groups(self._param_shapes, packed)
            for name, module in self._module_of.items():
                self._module_members.setdefault(module, set()).add(name)
        sent = set(names)
        for module in {self._module_of[name] for name in names}:
            missing = sorted(self._module_members[module] - sent)
            if missing:
                raise RolloutError(
                    f"partial update of vLLM module {module!r}: {len(missing)} tensor(s) "
                    f"missing, e.g. {missing[:4]}; vLLM reloads a module as a whole, so "
                    "send all of its tensors together"
                )

    def _chunk_by_module(
        self, tensors: list[tuple[str, torch.Tensor]]
    ) -> list[list[tuple[str, torch.Tensor]]]:
        """Split into messages of about ``_UPDATE_CHUNK_BYTES``, keeping modules whole."""
        by_module: dict[str, list[tuple[str, torch.Tensor]]] = {}
        for name, tensor in tensors:
            by_module.setdefault(self._module_of[name], []).append((name, tensor))
        chunks: list[list[tuple[str, torch.Tensor]]] = [[]]
        size = 0
        for group in by_module.values():
            group_bytes = sum(t.numel() * t.element_size() for _, t in group)
            if chunks[-1] and size + group_bytes > _UPDATE_CHUNK_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].extend(group)
            size += group_bytes
        return chunks


def _write_shared_file(tensors: list[tuple[str, torch.Tensor]]) -> tuple[str, BucketPlan]:
    """Write ``tensors`` into one file under /dev/shm (RAM) laid out by a ``BucketPlan``.

    The workers map it (no copy through the engine's message socket).
    """
    plan = BucketPlan.of([(name, str(t.dtype), tuple(t.shape)) for name, t in tensors])
    shm = "/dev/shm"
    directory = shm if os.path.isdir(shm) and _free_bytes(shm) > 2 * plan.nbytes else None
    fd, path = tempfile.mkstemp(prefix="agentrl-weights-", dir=directory)
    try:
        os.ftruncate(fd, max(plan.nbytes, 1))
        os.close(fd)
        buffer = torch.from_file(path, shared=True, size=plan.nbytes, dtype=torch.uint8)
        for (_, tensor), (_, view) in zip(tensors, unpack(buffer, plan), strict=True):
            view.copy_(tensor)
        del buffer
    except BaseException:
        _unlink(path)
        raise
    return path, plan


def _free_bytes(path: str) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
