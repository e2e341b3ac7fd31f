"""``AsyncTrainer``: rollout and training overlap, bounded by the staleness rule.

A producer task keeps starting episode groups whenever ``TrajectoryQueue`` allows it
(``(η + version + 1)·B − (accepted + running)``); the trainer takes complete groups,
updates, and pushes weights while generation goes on (``pause(keep)`` holds in-flight
requests for the swap only). η = ``trainer.max_staleness``: 0 is the synchronous loop,
1 one-step-off-policy.

With ``gateway.sink: queue`` (or ``queue:NAME``) the queue actor gets that name in
``ray.namespace``, and the gateway's queue sink puts finished sessions of free-running
OpenAI clients into it: they are trained on next to the producer's episodes, grouped by
their ``x-group-id`` and rewarded by their client (see ``TrajectoryQueue``). With
``trainer.agent_loop_episodes: false`` the producer does not run: every batch is made of
gateway sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from agentrl.algos import DynamicSampler
from agentrl.rollout.episode import EpisodeRequest, make_requests
from agentrl.rollout.queue import TrajectoryQueue
from agentrl.server.gateway.sink import queue_actor_name
from agentrl.trainer.batch import Sample
from agentrl.trainer.steps import sample_groups, sampled
from agentrl.trainer.trainer import Trainer, timer

logger = logging.getLogger(__name__)


class AsyncTrainer(Trainer):
    """The same steps as ``Trainer``; generation runs ahead by up to η versions."""

    async def fit(self) -> list[dict[str, float]]:
        cfg = self.cfg
        if not cfg.trainer.agent_loop_episodes and queue_actor_name(cfg.gateway.sink) is None:
            raise ValueError(
                "trainer.agent_loop_episodes=false needs episodes from somewhere: set "
                "gateway.sink=queue (and gateway.enabled=true, or a gateway of your own)"
            )
        queue = self._make_queue()
        await queue.set_version.remote(self.version)
        self._rows: dict[str, dict[str, Any]] = {}
        self._gen_clock = _BusyClock()
        producer = asyncio.create_task(
            self._produce(queue) if cfg.trainer.agent_loop_episodes else asyncio.sleep(0)
        )
        history = []
        try:
            await self._maybe_validate(force=True)
            while self.step < cfg.trainer.total_steps:
                metrics: dict[str, float] = {}
                with timer(metrics, "step"):
                    with timer(metrics, "wait_for_batch"):
                        batch = await queue.get_batch.remote()
                    if batch is None:
                        break
                    metrics |= batch.metrics
                    metrics |= await self.train_on(batch.episodes, self._rows, metrics)
                    await queue.set_version.remote(self.version)
                    for group in batch.groups:
                        self._rows.pop(group[0].group_id, None)
                metrics["timing/gen"] = self._gen_clock.take()
                history.append(await self._finish_step(metrics))
        finally:
            await queue.close.remote()
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            if queue_actor_name(cfg.gateway.sink) is not None:
                ray.kill(queue)  # free the name for the next run in this Ray session
        self.save_checkpoint()
        return history

    def _make_queue(self) -> ray.actor.ActorHandle:
        """The queue actor; named for the gateway's queue sink when one is configured."""
        cfg = self.cfg
        options: dict[str, Any] = {"max_concurrency": 1000}
        name = queue_actor_name(cfg.gateway.sink)
        if name is not None:
            options |= {"name": name, "namespace": cfg.ray.namespace}
        return (
            ray.remote(TrajectoryQueue)
            .options(**options)
            .remote(
                batch_groups=cfg.data.train_batch_size,
                group_size=cfg.rollout.n,
                max_staleness=cfg.trainer.max_staleness,
                max_concurrency=cfg.rollout.num_workers * cfg.rollout.max_concurrent_loops,
                stale_policy=cfg.trainer.stale_policy,
                max_response_length=cfg.rollout.max_response_length,
            )
        )

    async def informative(self, samples: list[Sample], metrics: dict[str, float]) -> list[Sample]:
        """Dynamic sampling drops uninformative groups; the producer never regenerates."""
        groups = len({s.group_id for s in samples})
        sampler: DynamicSampler[list[Sample]] = DynamicSampler(num_groups=max(groups, 1))
        sample_groups(sampler, samples)
        return sampled(sampler, metrics)

    async def _produce(self, queue: ray.actor.ActorHandle) -> None:
        """Start groups as the staleness rule allows; put each episode when it finishes."""
        clock = _BusyClock()
        self._gen_clock = clock
        next_row_index = self.step * self.cfg.data.train_batch_size
        rows: list[dict[str, Any]] = []
        while True:
            await queue.wait_for_capacity.remote()
            for _ in range(await queue.reserve.remote(max_groups=self.cfg.data.train_batch_size)):
                rows = rows or list(self.loader.next_batch())
                group = make_requests(
                    [rows.pop(0)],
                    self.cfg.rollout.n,
                    self.manager.default_sampling(),
                    first_row_index=next_row_index,
                )
                next_row_index += 1
                self._rows[group[0].group_id] = group[0].row
                for request in group:
                    clock.track(asyncio.create_task(self._run_one(request, queue)))

    async def _run_one(self, request: EpisodeRequest, queue: ray.actor.ActorHandle) -> None:
        await queue.put.remote(await self.manager.submit(request))


class _BusyClock:
    """Seconds during which at least one tracked task was running."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task] = set()
        self._since = 0.0
        self._busy = 0.0

    def track(self, task: asyncio.Task) -> None:
        if not self._running:
            self._since = time.perf_counter()
        self._running.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        if not self._running:
            self._busy += time.perf_counter() - self._since

    def take(self) -> float:
        """Busy seconds since the last call (including the current busy stretch)."""
        now = time.perf_counter()
        busy = self._busy + (now - self._since if self._running else 0.0)
        self._busy, self._since = 0.0, now
        return busy
