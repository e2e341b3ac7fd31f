"""Loading Hugging Face models and sharding them with FSDP2.

Every rank loads the checkpoint in float32 (the master weights), optionally wraps it
with LoRA adapters, then ``fully_shard``s each decoder layer and the root, so a
layer's parameters are gathered just before it runs and freed after.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel

from agentrl.trainer.config import FSDPConfig, LoRAConfig
from agentrl.trainer.packed_attention import register_packed_sdpa

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_LORA_PREFIX = "base_model.model."


class ValueModel(nn.Module):
    """A causal LM backbone (no LM head) with a scalar value head."""

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.model = backbone
        self.value_head = nn.Linear(backbone.config.hidden_size, 1)
        # Zero init: every rank starts from the same head, and initial values are 0.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: Tensor, position_ids: Tensor, output_index: Tensor, **attention: Any
    ) -> Tensor:
        """Values ``[M]`` at the packed positions ``output_index`` of ``input_ids [1, N]``
        (``attention``: the packing's keywords, :meth:`PackedRows.attention_kwargs`)."""
        hidden = self.model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **attention
        ).last_hidden_state
        return self.value_head(hidden[0, output_index]).squeeze(-1).float()


def _from_pretrained(
    auto_class: type, path: str, fsdp: FSDPConfig, trust_remote_code: bool
) -> PreTrainedModel:
    register_packed_sdpa()
    return auto_class.from_pretrained(
        path,
        dtype=torch.float32,
        attn_implementation=fsdp.attn_implementation,
        trust_remote_code=trust_remote_code,
    )


def load_causal_lm(path: str, fsdp: FSDPConfig, trust_remote_code: bool = False) -> nn.Module:
    """The policy model of ``path`` in float32 (unsharded)."""
    return _from_pretrained(AutoModelForCausalLM, path, fsdp, trust_remote_code)


def load_value_model(path: str, fsdp: FSDPConfig, trust_remote_code: bool = False) -> ValueModel:
    """The backbone of the causal LM at ``path`` with a fresh value head (unsharded)."""
    return ValueModel(_from_pretrained(AutoModel, path, fsdp, trust_remote_code))


def add_lora(model: nn.Module, lora: LoRAConfig) -> nn.Module:
    """Wrap ``model`` with trainable LoRA adapters (base weights frozen); needs `peft`."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError(
            f"trainer.actor.lora.rank={lora.rank} needs the `peft` package: pip install "
            "'peft>=0.13' (or set lora.rank=0 for full fine-tuning)"
        ) from exc
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def shard_model(
    model: nn.Module, mesh: DeviceMesh, fsdp: FSDPConfig, *, trainable: bool = True
) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root; returns the (same) model."""
    if fsdp.gradient_checkpointing and trainable:
        hf_model = hf_model_of(model)
        hf_model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    policy = MixedPrecisionPolicy(
        param_dtype=_DTYPES[fsdp.param_dtype], reduce_dtype=_DTYPES[fsdp.reduce_dtype]
    )
    layer_classes = set(getattr(hf_model_of(model), "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(
            f"found no decoder layers to shard in {type(model).__name__} "
            f"(looked for {sorted(layer_classes) or 'HF _no_split_modules'})"
        )
    for layer in layers:
        fully_shard(
            layer, mesh=mesh, mp_policy=policy, reshard_after_forward=fsdp.reshard_after_forward
        )
    fully_shard(
        model, mesh=mesh, mp_policy=policy, reshard_after_forward=fsdp.reshard_after_forward
    )
    if not trainable:
        model.requires_grad_(False)
    logger.info(
        "sharded %s: %d layers over %d ranks", type(model).__name__, len(layers), mesh.size()
    )
    return model


def hf_model_of(model: nn.Module) -> PreTrainedModel:
    """The transformers model inside a peft wrapper or a :class:`ValueModel`."""
    if isinstance(model, ValueModel):
        return model.model
    get_base = getattr(model, "get_base_model", None)
    return get_base() if get_base is not None else model


def to_hf_state_dict(state: dict[str, Tensor], lora: LoRAConfig) -> dict[str, Tensor]:
    """A full state dict with Hugging Face names; LoRA adapters merged into their weights.

    For a LoRA-adapted linear, ``W = W_base + (alpha / rank) · B @ A``.
    """
    if lora.rank == 0:
        return state
    scale = lora.alpha / lora.rank
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        hf_name = name.removeprefix(_LORA_PREFIX).replace(".base_layer.", ".")
        match = re.fullmatch(r"(.*)\.base_layer\.weight", name)
        if match is not None:
            module = match.group(1)
            a = _adapter(state, f"{module}.lora_A.")
            b = _adapter(state, f"{module}.lora_B.")
            tensor = tensor + scale * (b.float() @ a.float()).to(tensor.dtype)
        out[hf_name] = tensor
    return out


def _adapter(state: dict[str, Tensor], prefix: str) -> Tensor:
    matches = [t for n, t in state.items() if n.startswith(prefix) and n.endswith(".weight")]
    if len(matches) != 1:
        raise ValueError(f"expected one LoRA adapter weight under {prefix!r}, found {len(matches)}")
    return matches[0]
