"""vLLM worker extension that receives new weights from ``VLLMEngine.update_weights``.

vLLM mixes ``WeightSyncExtension`` into its worker class (``worker_extension_cls``), so
these methods run inside every worker process and are reached with
``AsyncLLM.collective_rpc(method_name, args=...)``.

Tensors travel as ``(name, dtype, shape, raw bytes)``: ``collective_rpc`` serializes its
arguments with msgpack/pickle, and tensors nested in containers do not survive that trip
as tensors. The weights are loaded with the worker's ``reload_weights`` (vLLM's layerwise
in-place reload), which maps checkpoint-style names onto fused/sharded vLLM parameters and
re-runs the per-layer post-processing that CPU kernels need; calling the model's
``load_weights`` directly skips that processing.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import torch

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

    def agentrl_load_weights(self, tensors: list[EncodedTensor]) -> int:
        """Load checkpoint-format tensors in place; returns how many were received."""

        def weights() -> Iterator[tuple[str, torch.Tensor]]:
            for item in tensors:
                yield decode_tensor(item)

        self.reload_weights(weights_iterator=weights())  # type: ignore[attr-defined]
        logger.debug("reloaded %d tensors", len(tensors))
        return len(tensors)
