"""One FSDP2 rank of a training role: reference, actor (policy) or critic.

A worker is a plain class; :mod:`agentrl.trainer.group` runs ``world_size`` of them as
Ray actors and calls every method on all ranks at once, each with its own shard of
the batch (every method here is collective). Roles share one machinery:

- ``_plan``: the micro-batches of this rank's rows, by token budget, with the same
  count on every rank (each forward gathers parameters collectively);
- ``_infer``: packed forwards without grad, outputs back as ``[b, R]`` tensors;
- ``_train``: mini-batches (one optimizer step each) of micro-batches (gradient
  accumulation), loss normalised by mini-batch-wide counts, grad-norm clipping,
  AdamW, one LR-schedule step per call.

Roles differ only in the model they load and their per-micro-batch forward.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from agentrl.trainer.checkpoint import (
    full_state_dict,
    iter_buckets,
    load_checkpoint,
    save_checkpoint,
)
from agentrl.trainer.config import ActorConfig, CriticConfig, ReferenceConfig
from agentrl.trainer.dispatch import MINI_BATCH_KEY, Batch, select_rows, sequence_lengths
from agentrl.trainer.micro_batch import (
    MicroBatch,
    PolicyLossFn,
    ValueLossFn,
    count_micro_batches,
    pack_rows,
    plan_micro_batches,
)
from agentrl.trainer.model import (
    add_lora,
    hf_model_of,
    load_causal_lm,
    load_value_model,
    shard_model,
    to_hf_state_dict,
)
from agentrl.trainer.optim import build_optimizer, build_scheduler

logger = logging.getLogger(__name__)

LossCall = Callable[[dict[str, Tensor], MicroBatch], tuple[Tensor, Any]]
"""Role adapter: per-token model outputs and the micro-batch → (loss share, metrics)."""


class _FSDPWorker:
    """Distributed setup and the shared compute machinery of every role."""

    def __init__(
        self,
        config: ActorConfig | ReferenceConfig | CriticConfig,
        model_path: str,
        *,
        rank: int,
        world_size: int,
        trust_remote_code: bool = False,
        total_training_steps: int | None = None,
    ) -> None:
        self.config = config
        self.model_path = model_path
        self.rank = rank
        self.world_size = world_size
        self.trust_remote_code = trust_remote_code
        self.total_training_steps = total_training_steps
        self.step = 0
        self.model: nn.Module
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None

    def master_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port for the process-group rendezvous (rank 0)."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int) -> None:
        """Join the process group, then load and shard the model (all ranks at once)."""
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",  # Ray gives each actor its own CUDA_VISIBLE_DEVICES
        )
        if torch.cuda.is_available():
            self.device = torch.device("cuda", 0)
            torch.cuda.set_device(self.device)
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(self.config.fsdp.cpu_threads_per_rank)
            backend = "gloo"
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        torch.manual_seed(self.config.seed)
        trainable = isinstance(self.config, ActorConfig | CriticConfig)
        self.model = shard_model(self._load_model(), mesh, self.config.fsdp, trainable=trainable)
        if trainable:
            self.optimizer = build_optimizer(self.model, self.config.optim)
            self.scheduler = build_scheduler(
                self.optimizer, self.config.optim, self.total_training_steps
            )
        logger.info(
            "%s rank %d/%d ready on %s",
            type(self).__name__,
            self.rank,
            self.world_size,
            self.device,
        )

    def _load_model(self) -> nn.Module:
        raise NotImplementedError

    def _forward(self, data: Batch, **kwargs: Any) -> dict[str, Tensor]:
        """Per-token outputs ``[b, R]`` of the rows in ``data`` (one packed forward)."""
        raise NotImplementedError

    # -- collective helpers -------------------------------------------------------------

    def _all_reduce(self, values: list[float], op: dist.ReduceOp.RedOpType) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def _plan(self, data: Batch, max_tokens: int) -> list[list[int]]:
        """This rank's micro-batches; the same number of them on every rank."""
        lengths = sequence_lengths(data)
        need, rows = self._all_reduce(
            [count_micro_batches(lengths, max_tokens), -len(lengths)], dist.ReduceOp.MAX
        )
        return plan_micro_batches(lengths, max_tokens, int(min(need, -rows)))

    # -- shared compute -----------------------------------------------------------------

    @torch.no_grad()
    def _infer(self, shard: Batch, max_tokens: int, **kwargs: Any) -> dict[str, Tensor]:
        self.model.eval()
        rows = torch.arange(shard["input_ids"].shape[0])
        parts: list[tuple[list[int], dict[str, Tensor]]] = []
        for micro_rows in self._plan(shard, max_tokens):
            outputs = self._forward(select_rows(shard, micro_rows), **kwargs)
            parts.append((micro_rows, {k: v.cpu() for k, v in outputs.items()}))
        result: dict[str, Tensor] = {}
        for key in parts[0][1]:
            out = torch.zeros(len(rows), shard["response_mask"].shape[1])
            for micro_rows, outputs in parts:
                out[micro_rows] = outputs[key]
            result[key] = out
        return result

    def _train(
        self, shard: Batch, loss_call: LossCall, max_tokens: int, prefix: str, **kwargs: Any
    ) -> dict[str, float]:
        """One update call: ``epochs`` passes over the mini-batches of ``shard``."""
        assert self.optimizer is not None and self.scheduler is not None
        self.model.train()
        tags = shard[MINI_BATCH_KEY]
        num_mini = int(tags.max()) + 1
        lo, hi = self._all_reduce([-num_mini, num_mini], dist.ReduceOp.MAX)
        if -lo != hi:
            raise ValueError(f"ranks got different numbers of mini-batches ({-lo} to {hi})")
        mini_batches = [
            select_rows(shard, (tags == m).nonzero().squeeze(1)) for m in range(num_mini)
        ]
        step_losses: list[Tensor] = []
        grad_norms: list[float] = []
        metric_sums: dict[str, float] = {}
        metric_weight = 0.0
        lr = self.scheduler.get_last_lr()[0]
        for _ in range(self.config.epochs):
            for mini in mini_batches:
                mask = mini["response_mask"]
                tokens, seqs = self._all_reduce(
                    [float(mask.sum()), float((mask.sum(dim=1) > 0).sum())], dist.ReduceOp.SUM
                )
                step_loss = torch.zeros((), device=self.device)
                for micro_rows in self._plan(mini, max_tokens):
                    data = {k: v.to(self.device) for k, v in select_rows(mini, micro_rows).items()}
                    outputs = self._forward(data, **kwargs)
                    micro = MicroBatch(
                        data, global_num_tokens=int(tokens), global_num_seqs=int(seqs)
                    )
                    loss, metrics = loss_call(outputs, micro)
                    # FSDP averages gradients over ranks; the loss shares must add up.
                    (loss * self.world_size).backward()
                    step_loss += loss.detach()
                    weight = float(data["response_mask"].sum())
                    metric_weight += weight
                    for name, value in metrics.items():
                        value = value.detach() if isinstance(value, Tensor) else value
                        metric_sums[name] = metric_sums.get(name, 0.0) + weight * float(value)
                grad_norms.append(self._optimizer_step())
                step_losses.append(step_loss)
        self.scheduler.step()
        self.step += 1
        names = sorted(metric_sums)
        totals = self._all_reduce(
            [float(x) for x in step_losses] + [metric_sums[n] for n in names] + [metric_weight],
            dist.ReduceOp.SUM,
        )
        losses, sums, weight = totals[: len(step_losses)], totals[len(step_losses) : -1], totals[-1]
        result = {f"{prefix}/{n}": s / max(weight, 1.0) for n, s in zip(names, sums, strict=True)}
        result.update(
            {
                f"{prefix}/loss": sum(losses) / len(losses),
                f"{prefix}/grad_norm": sum(grad_norms) / len(grad_norms),
                f"{prefix}/lr": lr,
                f"{prefix}/num_optimizer_steps": float(len(losses)),
            }
        )
        return result

    def _optimizer_step(self) -> float:
        """Clip the global grad norm, step AdamW (skipped on a non-finite norm); the norm."""
        assert self.optimizer is not None
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.optim.grad_clip)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        value = float(norm)
        if math.isfinite(value):
            self.optimizer.step()
        else:
            logger.warning("rank %d: grad norm is %s, optimizer step skipped", self.rank, value)
        self.optimizer.zero_grad(set_to_none=True)
        return value

    # -- checkpoints (trainable roles) --------------------------------------------------

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """Save model, optimizer, scheduler, step, RNG and ``extra`` to ``path``."""
        assert self.optimizer is not None and self.scheduler is not None
        save_checkpoint(path, self.model, self.optimizer, self.scheduler, self.step, extra)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Resume from ``path``; returns the ``extra`` dict that was saved with it."""
        assert self.optimizer is not None and self.scheduler is not None
        self.step, extra = load_checkpoint(path, self.model, self.optimizer, self.scheduler)
        return extra


class ReferenceWorker(_FSDPWorker):
    """A frozen policy: log-probs (and entropy) of response tokens."""

    config: ReferenceConfig | ActorConfig

    def _load_model(self) -> nn.Module:
        return load_causal_lm(self.model_path, self.config.fsdp, self.trust_remote_code)

    def _forward(
        self, data: Batch, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, Tensor]:
        packed = pack_rows(
            data["input_ids"], data["attention_mask"], data["response_mask"].shape[1]
        ).to(self.device)
        logits = self.model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            logits_to_keep=packed.output_index,
        ).logits[0]
        logits = logits.float() / temperature
        log_z = logits.logsumexp(dim=-1)
        log_probs = logits.gather(-1, packed.target_ids.unsqueeze(-1)).squeeze(-1) - log_z
        outputs = {"log_probs": packed.scatter(log_probs)}
        if with_entropy:
            entropy = log_z - (logits.softmax(dim=-1) * logits).sum(dim=-1)
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
    ) -> dict[str, float]:
        """One training step on this rank's shard (tagged with mini-batch indices).

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

    def weight_buckets(self, bucket_mb: float | None = None) -> Iterator[list[tuple[str, Tensor]]]:
        """Rank 0 yields the full weights as ``(HF name, CPU tensor)`` buckets; others none.

        Collective: every rank must run it (as a Ray streaming generator).
        """
        state = full_state_dict(self.model)
        if self.rank != 0:
            return
        bucket_bytes = int((bucket_mb or self.config.weight_sync_bucket_mb) * 2**20)
        yield from iter_buckets(to_hf_state_dict(state, self.config.lora), bucket_bytes)


class CriticWorker(_FSDPWorker):
    """Value model: the policy backbone with a scalar head."""

    config: CriticConfig

    def _load_model(self) -> nn.Module:
        path = self.config.model_path or self.model_path
        return load_value_model(path, self.config.fsdp, self.trust_remote_code)

    def _forward(self, data: Batch) -> dict[str, Tensor]:
        packed = pack_rows(
            data["input_ids"], data["attention_mask"], data["response_mask"].shape[1]
        ).to(self.device)
        values = self.model(packed.input_ids, packed.position_ids, packed.output_index)
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
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        logger.warning(
            "no tokenizer copied to %s: %s could not be loaded (%s)", target, source, exc
        )
        return
    tokenizer.save_pretrained(str(Path(target)))
