"""vLLM worker extension: the workers' half of ``VLLMWeightLoader`` (``vllm_weights.py``).

vLLM mixes ``WeightSyncExtension`` into its worker class (``worker_extension_cls``), so
these methods run inside every worker process and are reached with
``AsyncLLM.collective_rpc(method_name, args=...)``.

Tensors travel as ``(name, dtype, shape, raw bytes)``: ``collective_rpc`` serializes its
arguments with msgpack/pickle, and tensors nested in containers do not survive that trip
as tensors. The weights are loaded with vLLM's layerwise in-place reload (what the worker's
``reload_weights`` runs: ``initialize_layerwise_reload`` → ``model.load_weights`` →
``finalize_layerwise_reload``), which maps checkpoint-style names onto fused/sharded vLLM
parameters and re-runs the per-layer post-processing that CPU kernels need; calling the
model's ``load_weights`` alone skips that processing. One push is one reload
(``InPlaceReload``), however many messages or buckets carry it: vLLM's reload treats every
layer that received nothing as a failure (``<Layer>: Failed to load weights``, then puts its
current tensors back), so a reload per bucket logged one warning per layer of every other
bucket on every push.

Weight transports that deliver into the workers themselves (a broadcast group, where each
worker is one rank and receives full, unsharded tensors from the trainer) run their worker
half (``WeightReceiver.on_worker`` and ``worker_tensors``, in the transport's module of
``server/weight_transport/``) here, through ``agentrl_receiver_call`` and the sources
``agentrl_reload_from`` and ``agentrl_stage_begin`` read; only that transport's module is
loaded. The reload shards the tensors for tensor parallelism.

The ``agentrl_stage_*`` methods are the staged swap (``VLLMEngine`` with
``engine.weight_swap=staged``): a second instance of the model (the shadow, built once)
receives the new weights in a background thread of the worker while the live model keeps
generating, through the same layerwise reload and per-layer post-processing as the
in-place path; ``agentrl_stage_commit`` then swaps the processed state of every reloaded
module between the shadow and the live model (tensor pointers and the kernel handles the
post-processing built, e.g. the CPU GEMM's pre-packed weights), which takes microseconds
per module. See ``StagedWeights``.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import importlib
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from agentrl.core.weights import BucketPlan
from agentrl.server.collective import unpack
from agentrl.server.weight_transport import receiver_class

logger = logging.getLogger(__name__)

# (name, dtype without the "torch." prefix, shape, raw little-endian bytes)
EncodedTensor = tuple[str, str, list[int], bytes]


def encode_tensor(name: str, tensor: torch.Tensor) -> EncodedTensor:
    """Serialize one CPU tensor into the form ``WeightSyncExtension`` receives."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes()
    return name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), data


def decode_tensor(item: EncodedTensor) -> tuple[str, torch.Tensor]:
    """Rebuild the ``(name, tensor)`` pair written by ``encode_tensor``."""
    name, dtype, shape, data = item
    with warnings.catch_warnings():
        # The bytes are read-only; the tensor is only read (copied into the parameter).
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        raw = torch.frombuffer(data, dtype=torch.uint8)
    return name, raw.view(getattr(torch, dtype)).reshape(shape)


class WeightSyncExtension:
    """Methods added to each vLLM worker (``self`` is the worker)."""

    def agentrl_packed_modules(self) -> dict[str, list[str]]:
        """The model's fused-module map, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``.

        A fused vLLM layer must receive all of its checkpoint tensors in one reload call:
        vLLM rebuilds the layer from what it received and leaves missing parts
        uninitialized.
        """
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        mapping = getattr(model, "packed_modules_mapping", None) or {}
        return {fused: list(parts) for fused, parts in mapping.items()}

    def agentrl_reload_begin(self) -> bool:
        """Open an in-place reload that the next ``agentrl_load_weights`` calls fill."""
        if getattr(self, "_agentrl_open_reload", None) is not None:
            raise RuntimeError("an in-place weight reload is already open on this worker")
        self._agentrl_open_reload = InPlaceReload(self)
        return True

    def agentrl_load_weights(self, tensors: list[EncodedTensor]) -> int:
        """Load checkpoint-format tensors in place; returns how many were received.

        Into the reload ``agentrl_reload_begin`` opened, else as a reload of their own.
        """
        weights = (decode_tensor(item) for item in tensors)
        reload: InPlaceReload | None = getattr(self, "_agentrl_open_reload", None)
        if reload is None:
            InPlaceReload(self).run(weights)
        else:
            reload.load(weights)
        logger.debug("loaded %d tensors", len(tensors))
        return len(tensors)

    def agentrl_reload_end(self) -> int:
        """Finish the open reload (also after a failed load); returns modules reloaded."""
        reload: InPlaceReload | None = getattr(self, "_agentrl_open_reload", None)
        self._agentrl_open_reload = None
        if reload is None:
            raise RuntimeError("no in-place weight reload is open on this worker")
        return len(reload.finish())

    def agentrl_receiver_call(self, kind: str, step: str, *args: Any) -> Any:
        """Step ``step`` of weight receiver ``kind``'s worker half (e.g. joining a
        broadcast group): ``WeightReceiver.on_worker`` with this worker."""
        return receiver_class(kind).on_worker(self, step, *args)

    def agentrl_reload_from(self, source: dict[str, Any]) -> int:
        """Receive ``source`` (a ``WorkerWeights.source``) into the live model as one
        in-place reload; returns the tensors loaded."""
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in self._agentrl_source(source):
                count += 1
                yield item

        # One reload for all buckets: a layer's tensors are never split across buckets, so
        # vLLM processes each layer as soon as its bucket arrived and frees the bucket.
        InPlaceReload(self).run(counted())
        logger.debug("received and reloaded %d tensors", count)
        return count

    # -- staged swap ------------------------------------------------------------------------

    def agentrl_stage_init(self) -> int:
        """Build the shadow model once (blocks the engine core for a moment); returns bytes."""
        staging: StagedWeights | None = getattr(self, "_agentrl_staging", None)
        if staging is None:
            staging = StagedWeights(self)
            self._agentrl_staging = staging
        return staging.nbytes

    def agentrl_stage_begin(self, source: dict[str, Any], fresh: bool = True) -> bool:
        """Start loading ``source`` into the shadow in a background thread; returns at once.

        ``source`` is ``{"kind": "shm", "path", "plan"}`` (a file of tensors laid out by
        a ``BucketPlan``, read through a shared mapping), ``{"kind": "inline", "tensors"}``
        (``encode_tensor`` items) or a ``WorkerWeights.source`` of a weight receiver, e.g.
        ``{"kind": "broadcast", "plans"}`` (received from this worker's broadcast group).
        ``fresh`` forgets what earlier calls staged.
        """
        self._agentrl_stager().begin(lambda: self._agentrl_source(source), fresh)
        return True

    def agentrl_stage_poll(self) -> list[Any]:
        """``[done, error or None, tensors staged]`` of the current staging."""
        return self._agentrl_stager().poll()

    def agentrl_stage_commit(self) -> int:
        """Swap the staged modules into the live model; returns how many were swapped."""
        count = self._agentrl_stager().commit()
        runner = self.model_runner  # type: ignore[attr-defined]
        for reset in ("reset_encoder_cache", "reset_mm_cache"):
            if hasattr(runner, reset):
                getattr(runner, reset)()
        return count

    def agentrl_stage_discard(self) -> bool:
        """Forget what is staged (the live model is untouched)."""
        staging: StagedWeights | None = getattr(self, "_agentrl_staging", None)
        if staging is not None:
            staging.discard()
        return True

    def _agentrl_stager(self) -> StagedWeights:
        staging: StagedWeights | None = getattr(self, "_agentrl_staging", None)
        if staging is None:
            raise RuntimeError("staged weight swap is not initialized (agentrl_stage_init)")
        return staging

    def _agentrl_source(self, source: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
        kind = source["kind"]
        if kind == "shm":
            plan = BucketPlan.from_wire(source["plan"])
            # A private mapping of the file: no copy, pages are shared with the writer.
            buffer = torch.from_file(
                source["path"], shared=False, size=plan.nbytes, dtype=torch.uint8
            )
            yield from unpack(buffer, plan)
        elif kind == "inline":
            for item in source["tensors"]:
                yield decode_tensor(item)
        else:  # delivered by a transport's worker half (server/weight_transport/)
            yield from receiver_class(kind).worker_tensors(self, source)


_NOT_SET = object()
# nn.Module bookkeeping that is never swapped as a whole (tensors are swapped one by one).
_MODULE_INTERNALS = frozenset(
    {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "training"}
)


def _build_shadow(worker: Any) -> torch.nn.Module:
    """A second, unregistered instance of the worker's model, processed for inference.

    Its attention layers are kept out of the forward context (they never run), its weights
    are whatever ``torch.empty`` gave: a module's state is only swapped into the live model
    after the module was reloaded in full.
    """
    from vllm.model_executor.model_loader.utils import (
        initialize_model,
        process_weights_after_loading,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype

    vllm_config = worker.vllm_config
    model_config = vllm_config.model_config
    if vllm_config.lora_config is not None:
        raise NotImplementedError("staged weight swap does not support LoRA")
    load_device = vllm_config.load_config.device or vllm_config.device_config.device
    device = torch.device(load_device)
    compilation = vllm_config.compilation_config
    registered = compilation.static_forward_context
    compilation.static_forward_context = {}
    try:
        with set_default_torch_dtype(model_config.dtype), device:
            shadow = initialize_model(vllm_config=vllm_config, model_config=model_config)
    finally:
        compilation.static_forward_context = registered
    _unshare_modules(shadow, worker.model_runner.get_model())
    with torch.no_grad():
        process_weights_after_loading(shadow, model_config, device)
    return shadow.eval()


def _unshare_modules(shadow: torch.nn.Module, live: torch.nn.Module) -> None:
    """Give the shadow its own copy of every module it shares with the live model.

    vLLM caches some modules across model instances (rotary embeddings, ``get_rope``);
    a reload of the shadow moves every module's tensors to the meta device for a while,
    which must not happen to a module the live model is running.
    """
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    live_modules = {id(m) for m in live.modules()}
    copies: dict[int, torch.nn.Module] = {}

    def unshare(parent: torch.nn.Module) -> None:
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) not in live_modules:
                unshare(child)
                continue
            if id(child) not in copies:
                clone = copy.deepcopy(child)
                for original, cloned in zip(child.modules(), clone.modules(), strict=True):
                    info, cloned_info = get_layerwise_info(original), get_layerwise_info(cloned)
                    cloned_info.restore_metadata = info.restore_metadata
                    cloned_info.restore_device = info.restore_device
                copies[id(child)] = clone
            parent._modules[name] = copies[id(child)]

    unshare(shadow)
    live_storage = {
        t.untyped_storage().data_ptr()
        for t in itertools.chain(live.parameters(), live.buffers())
        if t.numel() and not t.is_meta
    }
    for name, t in itertools.chain(shadow.named_parameters(), shadow.named_buffers()):
        if t.numel() and not t.is_meta and t.untyped_storage().data_ptr() in live_storage:
            raise RuntimeError(f"the shadow model shares tensor {name!r} with the live model")


def _swap_tensor(live: torch.Tensor, shadow: torch.Tensor, copy: bool) -> None:
    if copy:
        # Keeps the live storage (CUDA graphs captured its address).
        live.data.copy_(shadow.data)
        return
    live.data, shadow.data = shadow.data, live.data


class StagedWeights:
    """The shadow model of one worker and the modules staged in it.

    ``begin`` reloads checkpoint-format tensors into the shadow in a background thread
    (``initialize_layerwise_reload`` → ``load_weights`` → ``finalize_layerwise_reload``,
    exactly what ``reload_weights`` does to the live model). Modules that share a
    parameter with a reloaded module without loading it themselves (a tied ``lm_head``)
    are post-processed again, since their kernels were built from the old tensor.
    ``commit`` then, for every reloaded module, swaps each parameter/buffer with the
    shadow's (``.data`` pointers on CPU; a device copy elsewhere) and every attribute the
    post-processing replaced (found by identity before/after the reload, e.g. the CPU GEMM
    closure over its pre-packed weights). The shadow then holds the old weights.
    """

    def __init__(self, worker: Any) -> None:
        from vllm.platforms import current_platform

        start = time.perf_counter()
        self._worker = worker
        self.live: torch.nn.Module = worker.model_runner.get_model()
        self.shadow = _build_shadow(worker)
        self._copy = not current_platform.is_cpu()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._staged: set[str] = set()  # modules whose new state sits in the shadow
        self._derived: dict[str, set[str]] = {}  # module -> attributes processing sets
        self._count = 0
        self.nbytes = sum(
            t.numel() * t.element_size()
            for t in itertools.chain(self.shadow.parameters(), self.shadow.buffers())
        )
        logger.info(
            "staged weight swap: shadow model built in %.2fs (%.1f MB of parameters and "
            "buffers, kernel-packed weights not counted)",
            time.perf_counter() - start,
            self.nbytes / 1e6,
        )

    def begin(self, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]], fresh: bool) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("a weight staging is still running on this worker")
            if fresh:
                self._staged = set()
                self._count = 0
            self._error = None
            self._thread = threading.Thread(
                target=self._run, args=(tensors,), name="agentrl-stage-weights", daemon=True
            )
            self._thread.start()

    def poll(self) -> list[Any]:
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            return [not running, self._error, self._count]

    def discard(self) -> None:
        with self._lock:
            self._staged = set()
            self._count = 0

    def commit(self) -> int:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("weight staging has not finished")
            if self._error is not None:
                raise RuntimeError(f"weight staging failed: {self._error}")
            if not self._staged:
                raise RuntimeError("no weights are staged")
            staged, self._staged, self._count = sorted(self._staged), set(), 0
        live = dict(self.live.named_modules())
        shadow = dict(self.shadow.named_modules())
        seen: set[int] = set()  # a tied tensor is swapped once
        for name in staged:
            live_mod, shadow_mod = live[name], shadow[name]
            for table in ("_parameters", "_buffers"):
                shadow_table = getattr(shadow_mod, table)
                for key, tensor in getattr(live_mod, table).items():
                    other = shadow_table.get(key)
                    if tensor is None or other is None or id(tensor) in seen:
                        continue
                    seen.add(id(tensor))
                    _swap_tensor(tensor, other, self._copy)
            for attr in self._derived.get(name, ()):
                live_value = live_mod.__dict__.get(attr, _NOT_SET)
                shadow_value = shadow_mod.__dict__.get(attr, _NOT_SET)
                _set_attr(live_mod, attr, shadow_value)
                _set_attr(shadow_mod, attr, live_value)
        return len(staged)

    def _run(self, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        start = time.perf_counter()
        try:
            with torch.no_grad():
                modules, count = self._load(tensors())
        except BaseException as exc:
            logger.exception("weight staging failed")
            with self._lock:
                self._error = f"{type(exc).__name__}: {exc}"
                self._staged = set()
                self._count = 0
            return
        finally:
            release_free_memory()
        with self._lock:
            self._staged |= modules
            self._count += count
        logger.debug(
            "staged %d tensors (%d modules) in %.2fs",
            count,
            len(modules),
            time.perf_counter() - start,
        )

    def _load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> tuple[set[str], int]:
        from vllm.model_executor.layers.attention import is_deferred_attention_layer
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        model_config = self._worker.vllm_config.model_config
        shadow = self.shadow
        modules = dict(shadow.named_modules())
        before = {name: dict(vars(mod)) for name, mod in modules.items()}
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in weights:
                count += 1
                yield item

        quiet_expected_reload_fallbacks(shadow)
        initialize_layerwise_reload(shadow)
        try:
            loaded = shadow.load_weights(counted())
        finally:
            finalize_layerwise_reload(shadow, model_config)
        if loaded is None:
            raise NotImplementedError(
                f"{type(shadow).__name__}.load_weights does not report what it loaded"
            )
        reloaded = {name.rpartition(".")[0] for name in loaded}
        unknown = reloaded - modules.keys()
        if unknown:
            raise RuntimeError(f"loaded weights of unknown modules: {sorted(unknown)[:4]}")
        if any(is_deferred_attention_layer(modules[name]) for name in reloaded):
            raise NotImplementedError("staged weight swap of attention-layer weights")
        reloaded |= rebuild_tied_kernels(shadow, reloaded)
        known = set().union(*self._derived.values()) if self._derived else set()
        for name in reloaded:
            after = vars(modules[name])
            changed = {
                key
                for key, value in after.items()
                if key not in _MODULE_INTERNALS and before[name].get(key, _NOT_SET) is not value
            }
            self._derived.setdefault(name, set()).update(changed)
        derived = set().union(*self._derived.values()) if self._derived else set()
        if derived != known:
            logger.info("staged swap exchanges these module attributes too: %s", sorted(derived))
        return reloaded, count


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_free_memory() -> None:
    """Give the pages the C allocator holds free back to the OS (glibc's ``malloc_trim``).

    A staged load allocates and frees about a model's worth of layer tensors in a thread
    of its own, a new thread every push. glibc keeps what a thread freed in that thread's
    arena for later mallocs, so each of the first pushes left another model's worth
    resident: SmolLM2-135M's worker grew 2.3 → 3.8 GB over three pushes, then stayed.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


INPLACE_RELOAD_INTERNALS = (
    ("vllm.model_executor.model_loader.reload.layerwise", "initialize_layerwise_reload"),
    ("vllm.model_executor.model_loader.reload.layerwise", "finalize_layerwise_reload"),
    ("vllm.config", "set_current_vllm_config"),
)
"""The vLLM internals ``InPlaceReload`` calls, as ``(module, name)``."""


def missing_inplace_internals() -> list[str]:
    """Those of ``INPLACE_RELOAD_INTERNALS`` the installed vLLM lacks (``module.name``)."""
    missing = []
    for module, name in INPLACE_RELOAD_INTERNALS:
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        if not found:
            missing.append(f"{module}.{name}")
    return missing


class InPlaceReload:
    """One layerwise in-place reload of a worker's live model, filled by one or more loads.

    ``initialize_layerwise_reload`` on creation, ``model.load_weights`` per ``load``, and on
    ``finish`` ``finalize_layerwise_reload``, the tied modules' kernels rebuilt and the
    runner's caches derived from the weights dropped (what the worker's ``reload_weights``
    does, spread over several messages). Generation must be paused from creation to finish:
    layers not loaded yet sit on the meta device in between.
    """

    def __init__(self, worker: Any) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import (
            initialize_layerwise_reload,
        )

        self._worker = worker
        self.model: torch.nn.Module = worker.model_runner.get_model()
        self.loaded: set[str] = set()  # vLLM parameter names
        quiet_expected_reload_fallbacks(self.model)
        with self._config_context():
            initialize_layerwise_reload(self.model)

    def _config_context(self) -> Any:
        from vllm.config import set_current_vllm_config

        return set_current_vllm_config(self._worker.vllm_config)

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load checkpoint-format ``(name, tensor)`` pairs (each module's all at once)."""
        with self._config_context(), torch.no_grad():
            names = self.model.load_weights(weights)
        if names is None:
            raise NotImplementedError(
                f"{type(self.model).__name__}.load_weights does not report what it loaded"
            )
        self.loaded.update(names)

    def finish(self) -> set[str]:
        """Process what was loaded; returns the names of the modules reloaded."""
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        with self._config_context(), torch.no_grad():
            finalize_layerwise_reload(self.model, self._worker.vllm_config.model_config)
            reloaded = {name.rpartition(".")[0] for name in self.loaded}
            reloaded |= rebuild_tied_kernels(self.model, reloaded)
        runner = self._worker.model_runner
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            if hasattr(runner, reset):
                getattr(runner, reset)()
        return reloaded

    def run(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """``load`` then ``finish`` (``finish`` also when the load fails)."""
        try:
            self.load(weights)
        finally:
            reloaded = self.finish()
        return reloaded


_LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_FALLBACK_MESSAGE = "%s: Failed to load weights"


class _ExpectedFallbacks(logging.Filter):
    """Drops vLLM's ``<Layer>: Failed to load weights`` for layers that have no weights.

    vLLM's reload counts a layer's buffers as weights to load and, when a reload gave a
    layer nothing, warns and puts the layer's current tensors back. Some layers never get
    anything from a checkpoint, so this is logged at every push and is harmless:
    ``RotaryEmbedding`` holds only its cos/sin cache, computed from the model config, and
    a tied LM head's weight is the embedding's (loaded as the embedding, and the head's
    kernel rebuilt by ``rebuild_tied_kernels``). The warning still shows for every other
    layer class: for those it means a push left the layer's old weights in place.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer_classes: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.msg == _FALLBACK_MESSAGE
            and isinstance(record.args, tuple)
            and record.args
            and record.args[0] in self.layer_classes
        )


_EXPECTED_FALLBACKS = _ExpectedFallbacks()


def weightless_layer_classes(model: torch.nn.Module) -> set[str]:
    """Class names of ``model``'s layers that no checkpoint tensor loads.

    A layer qualifies when it has tensors but no parameter of its own: only buffers (a
    rotary embedding's cache), or parameters that an earlier module owns (a tied head).
    A class qualifies when every one of its layers does.
    """
    seen: set[int] = set()
    weightless: set[str] = set()
    weighted: set[str] = set()
    for module in model.modules():
        params = [p for p in module._parameters.values() if p is not None]
        buffers = [b for b in module._buffers.values() if b is not None]
        own = [p for p in params if id(p) not in seen]
        seen.update(id(p) for p in params)
        name = type(module).__name__
        if own:
            weighted.add(name)
        elif params or buffers:
            weightless.add(name)
    return weightless - weighted


def quiet_expected_reload_fallbacks(model: torch.nn.Module) -> None:
    """Keep vLLM's reload from warning, at every push, about ``model``'s weightless layers."""
    _EXPECTED_FALLBACKS.layer_classes |= weightless_layer_classes(model)
    layerwise = logging.getLogger(_LAYERWISE_LOGGER)
    if _EXPECTED_FALLBACKS not in layerwise.filters:
        layerwise.addFilter(_EXPECTED_FALLBACKS)


def rebuild_tied_kernels(model: torch.nn.Module, reloaded: set[str]) -> set[str]:
    """Post-process again the modules that share a parameter with a reloaded module.

    A tied ``lm_head`` holds the embedding's tensor but is not reloaded itself (the
    checkpoint has no ``lm_head.weight``), so vLLM's reload leaves its kernel, e.g. the CPU
    GEMM's pre-packed copy of the weight, built from the old tensor. Returns their names.
    """
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    modules = dict(model.named_modules())
    shared = {
        id(t)
        for name in reloaded
        if name in modules
        for t in modules[name]._parameters.values()
        if t is not None
    }
    rebuilt = set()
    for name, module in modules.items():
        if name in reloaded or not any(
            id(t) in shared for t in module._parameters.values() if t is not None
        ):
            continue
        quant_method = getattr(module, "quant_method", None)
        if isinstance(quant_method, QuantizeMethodBase):
            quant_method.process_weights_after_loading(module)
        rebuilt.add(name)
    return rebuilt


def _set_attr(module: torch.nn.Module, attr: str, value: Any) -> None:
    if value is _NOT_SET:
        module.__dict__.pop(attr, None)
    else:
        module.__dict__[attr] = value
