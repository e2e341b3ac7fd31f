"""The training roles: reference (frozen policy), actor (trained policy) and critic.

Each is one FSDP2 rank (see :mod:`agentrl.trainer.base_worker` for the shared
machinery); a role adds the model it loads and its forward over one packed
micro-batch. The actor is a reference that can also train, export and gather weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from transformers import AutoTokenizer

from agentrl.algos.kl import entropy_from_logits
from agentrl.server.weight_transport import transport_module
from agentrl.server.weight_transport.base import bucketize
from agentrl.trainer.base_worker import FSDPWorkerBase
from agentrl.trainer.checkpoint import full_state_dict
from agentrl.trainer.config import ActorConfig, CriticConfig, ReferenceConfig
from agentrl.trainer.dispatch import Batch
from agentrl.trainer.micro_batch import MicroBatch, PolicyLossFn, ValueLossFn, pack_rows
from agentrl.trainer.model import (
    add_lora,
    hf_model_of,
    load_causal_lm,
    load_value_model,
    to_hf_state_dict,
)

logger = logging.getLogger(__name__)


class ReferenceWorker(FSDPWorkerBase):
    """A frozen policy: log-probs (and entropy) of response tokens."""

    config: ReferenceConfig | ActorConfig

    def _load_model(self) -> nn.Module:
        return load_causal_lm(self.model_path, self.config.fsdp, self.trust_remote_code)

    def _forward(
        self,
        data: Batch,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> dict[str, Tensor]:
        packed = pack_rows(
            data["input_ids"], data["attention_mask"], data["response_mask"].shape[1]
        ).to(self.device)
        logits = self.model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            logits_to_keep=packed.output_index,
            **packed.attention_kwargs(),
        ).logits[0]
        logits = logits.float() / temperature
        log_z = logits.logsumexp(dim=-1)
        log_probs = logits.gather(-1, packed.target_ids.unsqueeze(-1)).squeeze(-1) - log_z
        outputs = {"log_probs": packed.scatter(log_probs)}
        if with_entropy:
            # A metric-only entropy skips the autograd graph of a [tokens, vocab] softmax.
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy = entropy_from_logits(logits, log_z)
            outputs["entropy"] = packed.scatter(entropy)
        return outputs

    def _log_prob_budget(self) -> int:
        return self.config.max_tokens_per_micro_batch

    def compute_log_prob(
        self, shard: Batch, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, Tensor]:
        """``{"log_probs": [b, R]}`` (+ ``"entropy"``) of this rank's rows; 0 off-response."""
        return self._infer(
            shard, self._log_prob_budget(), temperature=temperature, with_entropy=with_entropy
        )


class ActorWorker(ReferenceWorker):
    """The policy being trained: log-probs, PPO-style updates, export and weight sync."""

    config: ActorConfig

    def _load_model(self) -> nn.Module:
        model = super()._load_model()
        if self.config.lora.rank > 0:
            model = add_lora(model, self.config.lora)
        return model

    def _log_prob_budget(self) -> int:
        return (
            self.config.log_prob_max_tokens_per_micro_batch
            or self.config.max_tokens_per_micro_batch
        )

    def update_actor(
        self,
        shard: Batch,
        loss_fn: PolicyLossFn,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> dict[str, float]:
        """One training step on this rank's shard (tagged with mini-batch indices).

        ``entropy_grad=False`` computes the entropy as a metric only (no gradient through
        it), for losses without an entropy bonus.

        Metrics: ``actor/loss`` (mean mini-batch loss), ``actor/grad_norm`` (mean
        pre-clip norm), ``actor/lr``, ``actor/num_optimizer_steps``, and the loss
        function's metrics as ``actor/<name>`` (token-weighted means).
        """

        def loss_call(outputs: dict[str, Tensor], micro: MicroBatch) -> tuple[Tensor, Any]:
            return loss_fn(outputs["log_probs"], outputs.get("entropy"), micro)

        return self._train(
            shard,
            loss_call,
            self.config.max_tokens_per_micro_batch,
            "actor",
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )

    def export_hf(self, path: str) -> None:
        """Write the policy (LoRA merged) and its tokenizer in Hugging Face format (rank 0)."""
        state = full_state_dict(self.model)
        if self.rank == 0:
            state = to_hf_state_dict(state, self.config.lora)
            hf_model_of(self.model).save_pretrained(path, state_dict=state)
            _copy_tokenizer(self.model_path, path, self.trust_remote_code)
            logger.info("exported policy at step %d to %s", self.step, path)
        dist.barrier()

    def weight_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
        """Rank 0 yields the full weights as ``(HF name, CPU tensor)`` buckets of about
        ``bucket_bytes`` (whole decoder layers); other ranks none.

        Collective: every rank must run it (as a Ray streaming generator).
        """
        state = full_state_dict(self.model)
        if self.rank != 0:
            return
        yield from bucketize(to_hf_state_dict(state, self.config.lora).items(), bucket_bytes)

    # -- weight transports whose sender is rank 0 (``RankZeroSource``) -------------------

    def call_root(self, transport: str, method: str, *args: Any) -> Any:
        """Rank 0: ``method(*args)`` of ``transport``'s root here (an instance of its
        module's ``RANK_ROOT``, e.g. the weight-broadcast group's rank 0)."""
        return getattr(self._weight_root(transport), method)(*args)

    def stage_on_root(self, transport: str, dtype: str | None, bucket_bytes: int) -> Any:
        """Gather the full weights (collective: every rank); rank 0 gives them to
        ``transport``'s root as buckets (a decoder layer never split) and returns what its
        ``stage(buckets, dtype)`` returns, other ranks None."""
        state = full_state_dict(self.model)
        if self.rank != 0:
            return None
        hf_state = to_hf_state_dict(state, self.config.lora)
        return self._weight_root(transport).stage(bucketize(hf_state.items(), bucket_bytes), dtype)

    def _weight_root(self, transport: str) -> Any:
        if self.rank != 0:
            raise RuntimeError(f"rank {self.rank} is not a weight transport's root (rank 0 is)")
        roots: dict[str, Any] = self.__dict__.setdefault("_weight_roots", {})
        if transport not in roots:
            roots[transport] = transport_module(transport).RANK_ROOT()
        return roots[transport]


class CriticWorker(FSDPWorkerBase):
    """Value model: the policy backbone with a scalar head."""

    config: CriticConfig

    def _load_model(self) -> nn.Module:
        path = self.config.model_path or self.model_path
        return load_value_model(path, self.config.fsdp, self.trust_remote_code)

    def _forward(self, data: Batch) -> dict[str, Tensor]:
        packed = pack_rows(
            data["input_ids"], data["attention_mask"], data["response_mask"].shape[1]
        ).to(self.device)
        values = self.model(
            packed.input_ids,
            packed.position_ids,
            packed.output_index,
            **packed.attention_kwargs(),
        )
        return {"values": packed.scatter(values)}

    def compute_values(self, shard: Batch) -> dict[str, Tensor]:
        """``{"values": [b, R]}``: the value before each response token; 0 off-response."""
        return self._infer(shard, self.config.max_tokens_per_micro_batch)

    def update_critic(self, shard: Batch, loss_fn: ValueLossFn) -> dict[str, float]:
        """One training step of the value model; metrics as for the actor, ``critic/``."""

        def loss_call(outputs: dict[str, Tensor], micro: MicroBatch) -> tuple[Tensor, Any]:
            return loss_fn(outputs["values"], micro)

        return self._train(shard, loss_call, self.config.max_tokens_per_micro_batch, "critic")


def _copy_tokenizer(source: str, target: str, trust_remote_code: bool) -> None:
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        logger.warning(
            "no tokenizer copied to %s: %s could not be loaded (%s)", target, source, exc
        )
        return
    tokenizer.save_pretrained(str(Path(target)))
