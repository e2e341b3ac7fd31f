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

The ``agentrl_*_group`` / ``agentrl_receive_weights`` methods are the worker side of
``CollectiveBroadcastSync``: each worker is one rank of a weight-broadcast group
(``agentrl.server.collective``) and receives full (unsharded) tensors from the trainer;
``reload_weights`` shards them for tensor parallelism.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from agentrl.server.collective import BroadcastGroup, GroupSpec, plans_from_wire

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

    def agentrl_join_group(
        self, spec: dict[str, Any], first_rank: int, local_addr: str | None = None
    ) -> int:
        """Join the weight-broadcast group as rank ``first_rank`` + this worker's index.

        Blocks until every rank joined (or ``spec["join_timeout_s"]`` passed); returns
        the rank.
        """
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        self.agentrl_leave_group()
        tp, pp = get_tp_group(), get_pp_group()
        rank = first_rank + pp.rank_in_group * tp.world_size + tp.rank_in_group
        group_spec = GroupSpec.from_wire(spec)
        device = self.device if group_spec.backend == "nccl" else torch.device("cpu")  # type: ignore[attr-defined]
        group = BroadcastGroup(group_spec, rank, device)
        group.connect(local_addr=local_addr)
        self._agentrl_group = group
        return rank

    def agentrl_receive_weights(self, plans: list[Any]) -> int:
        """Receive every bucket of ``plans`` from rank 0 and load it; returns tensors loaded."""
        group: BroadcastGroup | None = getattr(self, "_agentrl_group", None)
        if group is None:
            raise RuntimeError("this worker is not in a weight-broadcast group")
        count = 0
        for plan in plans_from_wire(plans):
            tensors = group.receive_bucket(plan)
            self.reload_weights(weights_iterator=iter(tensors))  # type: ignore[attr-defined]
            count += len(tensors)
        logger.debug("received and reloaded %d tensors", count)
        return count

    def agentrl_leave_group(self) -> bool:
        """Drop this worker's weight-broadcast group; False when it had none."""
        group: BroadcastGroup | None = getattr(self, "_agentrl_group", None)
        self._agentrl_group = None
        if group is None:
            return False
        group.close()
        return True
