"""The machinery every FSDP2 rank shares, whatever its role.

A worker is a plain class; :mod:`agentrl.trainer.group` runs ``world_size`` of them as
Ray actors and calls every method on all ranks at once, each with its own shard of
the batch (every method here is collective):

- ``setup``: join the process group (gloo on CPU, NCCL on GPU), load and shard the
  model, build AdamW and the LR schedule for trainable roles;
- ``_plan``: the micro-batches of this rank's rows, by token budget, with the same
  count on every rank (each forward gathers parameters collectively);
- ``_infer``: packed forwards without grad, outputs back as ``[b, R]`` tensors;
- ``_train``: mini-batches (one optimizer step each) of micro-batches (gradient
  accumulation), loss normalised by mini-batch-wide counts, grad-norm clipping,
  AdamW, one LR-schedule step per call;
- checkpoints of model, optimizer, schedule, step, RNG and an opaque ``extra`` dict.

Roles (:mod:`agentrl.trainer.fsdp_worker`) add the model they load and their
per-micro-batch forward.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from agentrl.models.attention import varying_shape_attention
from agentrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from agentrl.trainer.config import ActorConfig, CriticConfig, ReferenceConfig
from agentrl.trainer.dispatch import MINI_BATCH_KEY, Batch, select_rows, sequence_lengths
from agentrl.trainer.micro_batch import MicroBatch, count_micro_batches, plan_micro_batches
from agentrl.trainer.model import shard_model
from agentrl.trainer.optim import build_optimizer, build_scheduler

logger = logging.getLogger(__name__)

LossCall = Callable[[dict[str, Tensor], MicroBatch], tuple[Tensor, Any]]
"""Role adapter: per-token model outputs and the micro-batch → (loss share, metrics)."""


class FSDPWorkerBase:
    """Distributed setup and the shared compute machinery; subclasses define the model."""

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
        """The unsharded model of this role (float32, on CPU)."""
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
    @varying_shape_attention()
    def _infer(self, shard: Batch, max_tokens: int, **kwargs: Any) -> dict[str, Tensor]:
        self.model.eval()
        result: dict[str, Tensor] = {}
        for micro_rows in self._plan(shard, max_tokens):
            for key, value in self._forward(select_rows(shard, micro_rows), **kwargs).items():
                if key not in result:
                    result[key] = torch.zeros(shard["response_mask"].shape)
                result[key][micro_rows] = value.float().cpu()
        return result

    @varying_shape_attention()
    def _train(
        self, shard: Batch, loss_call: LossCall, max_tokens: int, prefix: str, **kwargs: Any
    ) -> dict[str, float]:
        """One update call: ``epochs`` passes over the mini-batches of ``shard``.

        Metrics (``prefix/…``): ``loss`` (mean over optimizer steps of the mini-batch
        loss), ``grad_norm`` (mean pre-clip norm), ``lr``, ``num_optimizer_steps``, and
        the loss function's own metrics as loss-token-weighted means.
        """
        self._require_trainable("update")
        self.model.train()
        tags = shard[MINI_BATCH_KEY]
        num_mini = int(tags.max()) + 1
        lo, hi = self._all_reduce([-num_mini, num_mini], dist.ReduceOp.MAX)
        if -lo != hi:
            raise ValueError(f"ranks got different numbers of mini-batches ({-lo} to {hi})")
        mini_batches = [
            select_rows(shard, (tags == m).nonzero().squeeze(1)) for m in range(num_mini)
        ]
        lr = self.scheduler.get_last_lr()[0]
        losses: list[float] = []
        grad_norms: list[float] = []
        metrics = _WeightedSums()
        for _ in range(self.config.epochs):
            for mini in mini_batches:
                losses.append(
                    self._accumulate_grads(mini, loss_call, max_tokens, metrics, **kwargs)
                )
                grad_norms.append(self._optimizer_step())
        self.scheduler.step()
        self.step += 1
        names = sorted(metrics.sums)
        totals = self._all_reduce(
            losses + [metrics.sums[n] for n in names] + [metrics.weight], dist.ReduceOp.SUM
        )
        losses, sums, weight = totals[: len(losses)], totals[len(losses) : -1], totals[-1]
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

    def _accumulate_grads(
        self,
        mini: Batch,
        loss_call: LossCall,
        max_tokens: int,
        metrics: _WeightedSums,
        **kwargs: Any,
    ) -> float:
        """Forward/backward every micro-batch of one mini-batch; this rank's loss share."""
        mask = mini["response_mask"]
        tokens, seqs = self._all_reduce(
            [float(mask.sum()), float((mask.sum(dim=1) > 0).sum())], dist.ReduceOp.SUM
        )
        rank_loss = torch.zeros((), device=self.device)
        for micro_rows in self._plan(mini, max_tokens):
            data = {k: v.to(self.device) for k, v in select_rows(mini, micro_rows).items()}
            micro = MicroBatch(data, global_num_tokens=int(tokens), global_num_seqs=int(seqs))
            loss, micro_metrics = loss_call(self._forward(data, **kwargs), micro)
            # FSDP averages gradients over ranks, but the ranks' loss shares add up.
            (loss * self.world_size).backward()
            rank_loss += loss.detach()
            metrics.add(micro_metrics, float(data["response_mask"].sum()))
        return float(rank_loss)

    def _optimizer_step(self) -> float:
        """Clip the global grad norm, step AdamW (skipped on a non-finite norm); the norm."""
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
        self._require_trainable("checkpoint")
        save_checkpoint(path, self.model, self.optimizer, self.scheduler, self.step, extra)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Resume from ``path``; returns the ``extra`` dict that was saved with it."""
        self._require_trainable("checkpoint")
        self.step, extra = load_checkpoint(path, self.model, self.optimizer, self.scheduler)
        return extra

    def _require_trainable(self, what: str) -> None:
        if self.optimizer is None or self.scheduler is None:
            raise RuntimeError(f"{type(self).__name__} is frozen: it has no {what}")


class _WeightedSums:
    """Running ``Σ weight · metric`` of the loss function's metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weight = 0.0

    def add(self, metrics: Mapping[str, float | Tensor], weight: float) -> None:
        self.weight += weight
        for name, value in metrics.items():
            value = value.detach() if isinstance(value, Tensor) else value
            self.sums[name] = self.sums.get(name, 0.0) + weight * float(value)
