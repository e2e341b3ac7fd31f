"""Weight loading of a ``VLLMEngine``: weight pushes into the vLLM workers, in place or staged.

``VLLMWeightLoader`` takes every weight push a ``VLLMEngine`` receives (``update_weights``,
``swap_weights`` and the worker calls of transports that deliver into the workers) and
drives the workers' half in ``vllm_worker_ext.WeightSyncExtension`` through
``AsyncLLM.collective_rpc``:

- in place (``engine.weight_swap=inplace``): generation pauses, the workers run one vLLM
  layerwise reload of the live model (``vllm_worker_ext.InPlaceReload``), generation
  resumes;
- staged (the default): the workers load the push into a shadow copy of the model while
  generation goes on (the tensors reach the engine-core process through a shared-memory
  file, or a transport's worker half), and the pause only swaps the processed tensors and
  kernel handles (``vllm_worker_ext.StagedWeights``).

Which of the two an engine uses is decided when it starts (``weight_swap_for``): the
swaps reach into vLLM internals, so only the releases they are tested with stage.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from vllm.v1.engine.async_llm import AsyncLLM

from agentrl.core.config import ModelConfig
from agentrl.core.types import INITIAL_WEIGHT_VERSION, PauseMode, RolloutError
from agentrl.core.weights import BucketPlan
from agentrl.server.collective import unpack
from agentrl.server.engine import NamedTensors, Weights, WeightWorkers, WorkerWeights
from agentrl.server.vllm_worker_ext import encode_tensor, missing_inplace_internals

logger = logging.getLogger(__name__)

# Upper bound of one weight-update message; a fused module is never split across messages.
_UPDATE_CHUNK_BYTES = 512 * 1024**2
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


def hf_parameter_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
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


class ServingEngine(Protocol):
    """What ``VLLMWeightLoader`` needs of the engine whose weights it loads (``VLLMEngine``)."""

    llm: AsyncLLM
    control: asyncio.Lock
    """Serializes pause, resume and every weight load."""

    @property
    def paused(self) -> bool:
        """Whether generation was paused by ``pause`` (not by a weight load)."""
        ...

    def check_open(self) -> None:
        """Raise unless the engine still runs."""

    async def pause_scheduler(self, mode: PauseMode) -> None:
        """Pause vLLM's scheduler (the caller holds ``control``)."""

    async def pause(self, mode: PauseMode | str = PauseMode.KEEP) -> None: ...

    async def resume(self) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    async def clear_prefix_cache(self) -> None:
        """``reset_prefix_cache`` without the open check (the caller holds ``control``)."""


class VLLMWeightLoader:
    """Loads weight pushes into the workers of one ``VLLMEngine``'s ``AsyncLLM``.

    Owns the policy version of the loaded weights (``version``, vLLM's label of what is
    sampled next), the count of loads (``updates``) and the phases of the last swap
    (``last_swap_timings``). ``staged``: pushes go through the workers' shadow models
    (built at ``start``, else at the first push); if they cannot be built, pushes load in
    place. Made before the engine's ``AsyncLLM`` starts (it reads the model's weight names
    and shapes from its config, and fails on a bad path at once).
    """

    def __init__(self, engine: ServingEngine, model: ModelConfig, staged: bool) -> None:
        self._engine = engine
        self._model_cfg = model
        self._dtype: torch.dtype = getattr(torch, model.dtype)
        self._param_shapes = hf_parameter_shapes(model)
        self._staged_swap = staged
        # tensor name -> vLLM module and module -> tensor names; filled on the first update
        self._module_of: dict[str, str] = {}
        self._module_members: dict[str, set[str]] = {}
        self._staging = asyncio.Lock()  # one staged load (and its commit) at a time
        self._staging_ready: asyncio.Task[None] | None = None
        self.version = INITIAL_WEIGHT_VERSION
        self.updates = 0
        self.last_swap_timings: dict[str, float] = {}

    @property
    def _llm(self) -> AsyncLLM:
        return self._engine.llm

    def start(self) -> None:
        """Build the workers' shadow models now rather than inside the first push (without
        a running event loop: at the first push)."""
        if self._staged_swap:
            with contextlib.suppress(RuntimeError):
                self._staging_ready = asyncio.get_running_loop().create_task(self._init_staging())

    def close(self) -> None:
        """Stop building the shadow models, if that is still going on."""
        if self._staging_ready is not None and not self._staging_ready.done():
            self._staging_ready.cancel()

    async def update(self, named_tensors: NamedTensors, version: int) -> None:
        """``RolloutEngine.update_weights``: load new weights (Hugging Face names) and label
        what is sampled next ``version``.

        Every tensor is checked before anything is loaded: an unknown name, a wrong shape
        or a fused vLLM module given only some of its tensors raises ``RolloutError`` and
        the old weights stay. If the engine is not paused it is paused (``keep``) for the
        swap, so no step mixes weights and labels; staged, only for the swap itself. The
        prefix cache is not reset here.
        """
        tensors = self._validate_update(named_tensors)
        if await self.use_staging():
            async with self._staging:
                await self._stage_tensors(tensors)
                await self._commit_staged(version, PauseMode.KEEP, reset_cache=False)
            return
        await self._load_in_place(tensors, version)

    async def swap(self, weights: Weights, version: int, mode: PauseMode) -> float:
        """``RolloutEngine.swap_weights``: pause (``mode``) → swap in ``weights`` as
        ``version`` → reset cache → resume.

        ``weights`` are buckets of tensors, or ``WorkerWeights`` the workers receive
        themselves (a broadcast). Staged: the weights are checked, delivered to the
        workers and loaded into the shadow model first, while requests keep generating; a
        failure there raises and leaves the old weights and version serving. In place,
        the pause covers the delivery too. Returns the seconds generation was paused.
        """
        if isinstance(weights, WorkerWeights):
            if not await self.use_staging():
                return await self._swap_in_place(
                    lambda: self._reload_in_workers(weights.source, version), mode
                )
            async with self._staging:
                await self._run_staging(weights.source)
                return await self._commit_staged(version, mode, reset_cache=True)
        if not await self.use_staging():
            return await self._swap_in_place(lambda: self._update_buckets(weights, version), mode)
        tensors = self._validate_update(itertools.chain.from_iterable(weights))
        async with self._staging:
            await self._stage_tensors(tensors)
            return await self._commit_staged(version, mode, reset_cache=True)

    def workers(self) -> WeightWorkers:
        """One rank per vLLM worker (tensor × pipeline parallel); tensors arrive in ``dtype``."""
        parallel = self._llm.vllm_config.parallel_config
        return WeightWorkers(
            num_workers=parallel.tensor_parallel_size * parallel.pipeline_parallel_size,
            dtype=self._model_cfg.dtype,
            call=self._call_workers,
            check=self._check_buckets,
        )

    async def use_staging(self) -> bool:
        """Whether pushes are staged (builds the workers' shadow models on first use)."""
        if not self._staged_swap:
            return False
        if self._staging_ready is None:
            self._staging_ready = asyncio.get_running_loop().create_task(self._init_staging())
        await asyncio.shield(self._staging_ready)
        return self._staged_swap

    # -- in place -----------------------------------------------------------------------

    async def _load_in_place(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Load checked ``tensors`` into the live model as one reload, label ``version``."""
        async with self._engine.control:
            await self._check_whole_modules([name for name, _ in tensors])
            chunks = self._chunk_by_module(tensors)
            async with self._paused_for_load(PauseMode.KEEP):
                start = time.perf_counter()
                await self._reload(chunks)
                await self._label(version)
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

    async def _update_buckets(self, buckets: Sequence[NamedTensors], version: int) -> None:
        """All ``buckets`` checked, then loaded as one reload (see ``_reload``)."""
        await self._load_in_place(
            self._validate_update(itertools.chain.from_iterable(buckets)), version
        )

    async def _swap_in_place(self, load: Callable[[], Awaitable[None]], mode: PauseMode) -> float:
        """Pause → ``load`` → reset prefix cache → resume, timed like a staged swap."""
        engine = self._engine
        marks = [("start", time.perf_counter())]
        await engine.pause(mode)
        marks.append(("pause_wait", time.perf_counter()))
        try:
            await load()
            marks.append(("load", time.perf_counter()))
            await engine.reset_prefix_cache()
            marks.append(("reset_cache", time.perf_counter()))
        finally:
            await engine.resume()
            marks.append(("resume", time.perf_counter()))
        self._record_swap(marks)
        return marks[-1][1] - marks[0][1]

    async def _reload_in_workers(self, source: dict[str, Any], version: int) -> None:
        """The workers receive ``source`` into the live model (one reload); label ``version``.

        Pauses (``keep``) for the load if the engine is not paused already. A failure part
        way leaves a mix of old and new weights; the version label stays the old one.
        """
        async with self._engine.control, self._paused_for_load(PauseMode.KEEP):
            start = time.perf_counter()
            try:
                counts = await self._llm.collective_rpc("agentrl_reload_from", args=(source,))
            except Exception as exc:
                raise RuntimeError(
                    f"receiving {source['kind']} weights (version {version}) failed; the "
                    f"engine may hold a mix of old and new weights: {exc}"
                ) from exc
            await self._label(version)
        logger.info(
            "received %d tensors (%s) in %.2fs; weight version %d",
            counts[0],
            source["kind"],
            time.perf_counter() - start,
            version,
        )

    # -- staged -------------------------------------------------------------------------

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
        async with self._engine.control:
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
                f"staging the new weights failed; version {self.version} keeps serving: {errors[0]}"
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
        engine = self._engine
        async with engine.control:
            marks = [("start", time.perf_counter())]
            async with self._paused_for_load(mode) as paused_here:
                marks.append(("pause_wait", time.perf_counter()))
                try:
                    await self._llm.collective_rpc("agentrl_stage_commit")
                except Exception as exc:
                    raise RuntimeError(
                        f"swapping in the staged weights (version {version}) failed; the "
                        f"engine may hold a mix of old and new weights: {exc}"
                    ) from exc
                marks.append(("swap", time.perf_counter()))
                await self._label(version)
                marks.append(("label", time.perf_counter()))
                if reset_cache:
                    await engine.clear_prefix_cache()
                    marks.append(("reset_cache", time.perf_counter()))
            if paused_here:
                marks.append(("resume", time.perf_counter()))
        self._record_swap(marks)
        return marks[-1][1] - marks[0][1]

    # -- shared -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _paused_for_load(self, mode: PauseMode) -> AsyncIterator[bool]:
        """Generation paused (``mode``) for a load unless ``pause`` paused it already, and
        resumed after; yields whether it paused here. The caller holds ``control``."""
        paused_here = not self._engine.paused
        if paused_here:
            await self._engine.pause_scheduler(mode)
        try:
            yield paused_here
        finally:
            if paused_here:
                await self._llm.resume_generation()

    async def _label(self, version: int) -> None:
        """What is sampled from now on carries ``version`` (vLLM's label and ours)."""
        await self._llm.update_weight_version(str(version))
        self.version = version
        self.updates += 1

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
            self.version,
            ", ".join(f"{k.removesuffix('_s')} {v * 1e3:.1f} ms" for k, v in timings.items()),
        )

    def _workers_are_local(self) -> bool:
        parallel = self._llm.vllm_config.parallel_config
        backend = parallel.distributed_executor_backend
        return backend in _LOCAL_EXECUTORS and getattr(parallel, "nnodes", 1) <= 1

    async def _call_workers(
        self, kind: str, step: str, *args: Any, timeout: float | None = None
    ) -> list[Any]:
        """Step ``step`` of transport ``kind``'s worker half on every worker, between engine
        steps (joining a broadcast group blocks the engine core until every rank arrived)."""
        self._engine.check_open()
        async with self._engine.control:
            return await self._llm.collective_rpc(
                "agentrl_receiver_call", timeout=timeout, args=(kind, step, *args)
            )

    async def _check_buckets(self, buckets: list[list[tuple[str, tuple[int, ...]]]]) -> None:
        """Every ``(name, shape)`` is a known weight of that shape; modules are whole."""
        self._engine.check_open()
        seen: set[str] = set()
        for bucket in buckets:
            for name, shape in bucket:
                self._check_param(name, tuple(shape), seen)
            async with self._engine.control:
                await self._check_whole_modules([name for name, _ in bucket])

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
