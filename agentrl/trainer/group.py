"""Ray actor groups: ``world_size`` FSDP ranks of one role, driven from the controller.

``WorkerGroup.call`` runs a method on every rank at once and returns the per-rank
results; the role groups below shard batches across ranks (balanced by tokens, see
:mod:`agentrl.trainer.dispatch`) and put the results back in batch order.

    actor = ActorGroup(cfg.actor, model_path, total_training_steps=100)
    old = actor.compute_log_prob(batch)["log_probs"]
    metrics = actor.update_actor(batch | {"old_log_probs": old, ...}, loss_fn)
    for bucket in actor.iter_weight_buckets():
        ...  # (name, tensor) pairs with HF names, e.g. for ObjectStoreSync.push
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import ray
from torch import Tensor

from agentrl.placement import TrainerPlacementConfig, place_ranks
from agentrl.server.weight_transport.base import DEFAULT_BUCKET_BYTES
from agentrl.trainer.config import ActorConfig, CriticConfig, ReferenceConfig
from agentrl.trainer.dispatch import (
    Batch,
    gather_rows,
    num_rows,
    shard_mini_batches,
    shard_rows,
    validate_batch,
)
from agentrl.trainer.fsdp_worker import ActorWorker, CriticWorker, ReferenceWorker
from agentrl.trainer.micro_batch import PolicyLossFn, ValueLossFn

logger = logging.getLogger(__name__)


class WorkerGroupError(RuntimeError):
    """A rank failed; the group's process group is broken and its actors were killed."""


def _node_id(_actor: Any) -> str:
    return ray.get_runtime_context().get_node_id()


class WorkerGroup:
    """``config.world_size`` Ray actors of ``worker_cls`` forming one process group.

    Subclasses set ``worker_cls``; ``total_training_steps`` feeds the LR schedule;
    ``placement`` puts the ranks in per-node placement groups (:mod:`agentrl.placement`).
    """

    worker_cls: type = ReferenceWorker

    def __init__(
        self,
        config: ActorConfig | ReferenceConfig | CriticConfig,
        model_path: str,
        *,
        total_training_steps: int | None = None,
        trust_remote_code: bool = False,
        placement: TrainerPlacementConfig | None = None,
    ) -> None:
        self.config = config
        self.world_size = config.world_size
        self.name = self.worker_cls.__name__
        num_gpus = config.num_gpus_per_worker
        if num_gpus is None:
            num_gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
        remote_cls = ray.remote(num_cpus=config.num_cpus_per_worker, num_gpus=num_gpus)(
            self.worker_cls
        )
        self.placement = place_ranks(
            self.world_size, config.num_cpus_per_worker, num_gpus, placement, name=self.name
        )
        self.actors = [
            remote_cls.options(**self.placement.options(rank)).remote(
                config,
                model_path,
                rank=rank,
                world_size=self.world_size,
                trust_remote_code=trust_remote_code,
                total_training_steps=total_training_steps,
            )
            for rank in range(self.world_size)
        ]
        self.rank_nodes: list[str] = []  # read by _wait, should this first call fail
        self.rank_nodes = self._wait([a.__ray_call__.remote(_node_id) for a in self.actors])
        addr, port = self._wait([self.actors[0].master_address.remote()])[0]
        self.call("setup", addr, port)
        logger.info("%s: %d ranks ready (rendezvous %s:%d)", self.name, self.world_size, addr, port)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method(*args, **kwargs)`` on every rank; the per-rank results."""
        return self._wait([getattr(a, method).remote(*args, **kwargs) for a in self.actors])

    def call_sharded(self, method: str, shards: list[Any], **kwargs: Any) -> list[Any]:
        """Run ``method(shards[rank], **kwargs)`` on every rank; the per-rank results."""
        if len(shards) != self.world_size:
            raise ValueError(f"{len(shards)} shards for {self.world_size} ranks")
        refs = [
            getattr(a, method).remote(s, **kwargs) for a, s in zip(self.actors, shards, strict=True)
        ]
        return self._wait(refs)

    def _wait(self, refs: list[ray.ObjectRef]) -> list[Any]:
        """Results in rank order; on the first failure, kill the group (others would hang)."""
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except Exception as exc:
                lost = self._unreachable_ranks() if self.rank_nodes else ""
                self.shutdown()
                raise WorkerGroupError(
                    f"{self.name}: a rank failed, group stopped{lost}: {exc}"
                ) from exc
        return ray.get(refs)

    def _unreachable_ranks(self, timeout_s: float = 5.0) -> str:
        """`` (rank R on node N: unreachable, ...)`` for the ranks that do not answer a
        ping within ``timeout_s``, else empty. When a node is lost, a rank on a live node
        may fail first (its collective's peer vanished), so every rank is asked."""
        pings = [actor.__ray_call__.remote(_node_id) for actor in self.actors]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
        answered = set()
        for rank, ping in enumerate(pings):
            if ping in ready:
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.get(ping)
                    answered.add(rank)
        dead_nodes = {n["NodeID"] for n in ray.nodes() if not n["Alive"]}
        lost = [
            f"rank {rank} on node {node[:8]}"
            + (" (the cluster lists it dead)" if node in dead_nodes else "")
            for rank, node in enumerate(self.rank_nodes)
            if rank not in answered
        ]
        return f" ({'; '.join(lost)}: unreachable, its process or node lost)" if lost else ""

    def infer(self, method: str, batch: Batch, **kwargs: Any) -> dict[str, Tensor]:
        """A per-row forward method over the whole batch, results in batch order."""
        validate_batch(batch)
        shards, rows = shard_rows(batch, self.world_size)
        results = self.call_sharded(method, shards, **kwargs)
        return {
            key: gather_rows([r[key] for r in results], rows, num_rows(batch)) for key in results[0]
        }

    def train(self, method: str, batch: Batch, loss_fn: Any, **kwargs: Any) -> dict[str, float]:
        """An update method over the whole batch: mini-batches split here, then sharded."""
        validate_batch(batch)
        shards, _ = shard_mini_batches(batch, self.world_size, self.config.mini_batch_size)
        return self.call_sharded(method, shards, loss_fn=loss_fn, **kwargs)[0]

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """Save every rank's shards, the schedule, step, RNG and ``extra`` under ``path``."""
        self.call("save_checkpoint", path, extra)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Resume from ``path``; returns the saved ``extra`` dict."""
        return self.call("load_checkpoint", path)[0]

    def shutdown(self) -> None:
        """Kill the actors (their process group dies with them)."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        self.placement.remove()


class ReferenceGroup(WorkerGroup):
    """The frozen reference policy."""

    worker_cls = ReferenceWorker

    def compute_log_prob(
        self, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, Tensor]:
        """``{"log_probs": [B, R]}`` (+ ``"entropy"``) of the response tokens.

        ``temperature`` divides the logits, as the rollout sampler did.
        """
        _check_temperature(temperature)
        return self.infer(
            "compute_log_prob", batch, temperature=temperature, with_entropy=with_entropy
        )


class ActorGroup(ReferenceGroup):
    """The policy being trained."""

    worker_cls = ActorWorker
    config: ActorConfig

    def update_actor(
        self,
        batch: Batch,
        loss_fn: PolicyLossFn,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> dict[str, float]:
        """One training step (see ``ActorWorker.update_actor`` for the metrics)."""
        _check_temperature(temperature)
        return self.train(
            "update_actor",
            batch,
            loss_fn,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )

    def export_hf(self, path: str) -> None:
        """Write the policy and tokenizer to ``path`` in Hugging Face format."""
        self.call("export_hf", path)

    def iter_weight_buckets(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, Tensor]]]:
        """The full weights as buckets of ``(HF name, CPU tensor)``, gathered on rank 0 and
        streamed to this process a bucket at a time."""
        streams = [
            a.weight_buckets.options(num_returns="streaming").remote(bucket_bytes)
            for a in self.actors
        ]
        for ref in streams[0]:
            yield ray.get(ref)
        for stream in streams[1:]:
            for ref in stream:
                ray.get(ref)

    def named_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[tuple[str, Tensor]]:
        """The full weights as one stream of ``(HF name, CPU tensor)`` pairs, gathered in
        buckets of about ``bucket_bytes``."""
        for bucket in self.iter_weight_buckets(bucket_bytes):
            yield from bucket

    # -- RankZeroSource: rank 0 as a weight transport's sender --------------------------

    @property
    def root_key(self) -> str:
        return f"actor-rank0:{self.actors[0]._actor_id.hex()}"

    async def call_root(self, transport: str, method: str, *args: Any) -> Any:
        """``method(*args)`` of ``transport``'s root on rank 0 (``ActorWorker.call_root``)."""
        return await self.actors[0].call_root.remote(transport, method, *args)

    async def stage_on_root(self, transport: str, dtype: str | None, bucket_bytes: int) -> Any:
        """Gather the weights and stage them on rank 0's root of ``transport``."""
        staged = await asyncio.to_thread(self.call, "stage_on_root", transport, dtype, bucket_bytes)
        return staged[0]


class CriticGroup(WorkerGroup):
    """The value model."""

    worker_cls = CriticWorker
    config: CriticConfig

    def compute_values(self, batch: Batch) -> dict[str, Tensor]:
        """``{"values": [B, R]}`` before each response token."""
        return self.infer("compute_values", batch)

    def update_critic(self, batch: Batch, loss_fn: ValueLossFn) -> dict[str, float]:
        """One training step of the critic (metrics under ``critic/``)."""
        return self.train("update_critic", batch, loss_fn)


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (the rollout's), got {temperature}")
