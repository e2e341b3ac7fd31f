"""``AsyncTrainer``: rollout and training overlap, bounded by the staleness rule.

A producer task keeps starting episode groups whenever ``TrajectoryQueue`` allows it
(``(η + version + 1)·B − (accepted + running)``); the trainer takes complete groups,
updates, and pushes weights while generation goes on (``pause(keep)`` holds in-flight
requests for the swap only). η = ``trainer.max_staleness``: 0 is the synchronous loop,
1 one-step-off-policy. The producer stops once the last step's batch is in hand: the
last update and the final validation run without generation beside them.

The queue lives in the driver: an episode comes from its agent-loop worker to the driver
once, and each reservation is one awaited ``acquire``. With ``gateway.sink: queue`` (or
``queue:NAME``) a ``SessionInbox`` actor gets that name in ``ray.namespace``; the
gateway's queue sink puts finished sessions of free-running OpenAI clients into it, and
the driver drains them into the queue: they are trained on next to the producer's
episodes, grouped by their ``x-group-id`` and rewarded by their client (see
``TrajectoryQueue``). With ``trainer.agent_loop_episodes: false`` the producer does not
run: every batch is made of gateway sessions.

Faults: the producer and every episode task are supervised. An episode whose agent-loop
worker died runs again, then is a failed episode (counted, its slot returned; see
``AgentLoopManager``); any other producer error, ``NoLiveWorker`` included, stops ``fit``
at once with that error, and so does a failure of the inbox's drain; a batch that can
never form, or does not form within ``trainer.batch_timeout_s``, stops it with what the
queue holds. A resumed run
pushes the restored weights before the producer starts and replays the rows that were
started but not trained (``RowFeed``), so no row is skipped or trained twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agentrl.algos import DynamicSampler
from agentrl.data.loader import RowLoader
from agentrl.rollout.episode import EpisodeRequest, make_requests
from agentrl.rollout.queue import SessionInbox, TrainingBatch, TrajectoryQueue, drain_inbox
from agentrl.server.gateway.sink import queue_actor_name
from agentrl.trainer.batch import Sample
from agentrl.trainer.row_feed import RowFeed
from agentrl.trainer.steps import sample_groups, sampled
from agentrl.trainer.trainer import Trainer, timer

T = TypeVar("T")

FIRST = asyncio.FIRST_COMPLETED
_REPLICA_CHECK_S = 5.0
"""How often a trainer waiting for a batch checks that no replica serves old weights."""


class AsyncTrainer(Trainer):
    """The same steps as ``Trainer``; generation runs ahead by up to η versions."""

    _feed: RowFeed | None = None

    async def train_steps(self) -> list[dict[str, float]]:
        """The asynchronous fit loop: train on batches from the queue the producer fills."""
        cfg = self.cfg
        if not cfg.trainer.agent_loop_episodes and queue_actor_name(cfg.gateway.sink) is None:
            raise ValueError(
                "trainer.agent_loop_episodes=false needs episodes from somewhere: set "
                "gateway.sink=queue (and gateway.enabled=true, or a gateway of your own)"
            )
        await self.serve_restored_weights()
        queue = self._make_queue()
        inbox = self._make_inbox()
        self._gen_clock = _BusyClock()
        # What fills the queue: tasks that end only by failing, named for their error.
        sources: dict[str, asyncio.Task] = {}
        if cfg.trainer.agent_loop_episodes:
            sources["producer"] = asyncio.create_task(
                self._produce(queue), name="the rollout producer"
            )
        if inbox is not None:
            sources["inbox"] = asyncio.create_task(
                drain_inbox(inbox.take.remote, queue), name="the gateway inbox"
            )
        history = []
        try:
            await self._maybe_validate(force=True)
            while self.step < cfg.trainer.total_steps:
                metrics: dict[str, float] = {}
                with timer(metrics, "step"):
                    with timer(metrics, "wait_for_batch"):
                        batch = await self._next_batch(queue, list(sources.values()))
                    if batch is None:
                        break
                    if "producer" in sources and self.step + 1 >= cfg.trainer.total_steps:
                        # The last batch is in hand: episodes started now would never be
                        # trained, and would share the cores with the last update and the
                        # final validation. Their rows stay pending in the last checkpoint.
                        await _stop(sources.pop("producer"))
                    metrics |= batch.metrics
                    rows = self._feed.rows_by_group if self._feed is not None else {}
                    metrics |= await self.train_on(batch.episodes, rows, metrics)
                    if self._feed is not None:
                        self._feed.done([g[0].group_id for g in batch.groups])
                        dropped = self._feed.done(batch.dropped_group_ids)
                        self.audit.dropped(dropped, "the queue dropped its group (stale or failed)")
                    await queue.finish_step(self.version)
                metrics["timing/gen"] = self._gen_clock.take()
                history.append(await self._finish_step(metrics))
        finally:
            for source in sources.values():
                await _stop(source)
            await queue.close()
            if inbox is not None:
                ray.kill(inbox)  # free the name for the next run in this Ray session
        return history

    def _make_queue(self) -> TrajectoryQueue:
        """The driver-side queue (external sources when the gateway's sink is a queue)."""
        cfg = self.cfg
        return TrajectoryQueue(
            batch_groups=cfg.data.train_batch_size,
            group_size=cfg.rollout.n,
            max_staleness=cfg.trainer.max_staleness,
            max_concurrency=cfg.rollout.num_workers * cfg.rollout.max_concurrent_loops,
            stale_policy=cfg.trainer.stale_policy,
            max_response_length=cfg.rollout.max_response_length,
            version=self.version,
            external_sources=queue_actor_name(cfg.gateway.sink) is not None,
        )

    def _make_inbox(self) -> ray.actor.ActorHandle | None:
        """The gateway's inbox actor, named for its queue sink (None without one)."""
        name = queue_actor_name(self.cfg.gateway.sink)
        if name is None:
            return None
        return (
            ray.remote(SessionInbox)
            .options(
                name=name,
                namespace=self.cfg.ray.namespace,
                # On the driver's node: the inbox holds finished sessions, and one on a
                # worker node would be lost with that node (the driver's own loss ends
                # the run anyway).
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    ray.get_runtime_context().get_node_id(), soft=False
                ),
            )
            .remote()
        )

    async def _next_batch(
        self, queue: TrajectoryQueue, sources: list[asyncio.Task]
    ) -> TrainingBatch | None:
        """The next batch; a source's error instead, as soon as one fails. Before and
        while it waits, replicas that came back with old weights get the current ones."""
        await self.keep_replicas_current()
        get = asyncio.ensure_future(queue.get_batch(timeout_s=self.cfg.trainer.batch_timeout_s))
        while True:
            done, _ = await asyncio.wait(
                {get, *sources}, timeout=_REPLICA_CHECK_S, return_when=FIRST
            )
            if done:
                break
            await self.keep_replicas_current()
        if not get.done():  # a source ended first, which it only does by failing
            get.cancel()
            failed = next(task for task in sources if task.done())
            error = failed.exception()
            raise RuntimeError(
                f"{failed.get_name()} failed at step {self.step + 1}: "
                f"{type(error).__name__}: {error}"
            ) from error
        return await get

    async def informative(self, samples: list[Sample], metrics: dict[str, float]) -> list[Sample]:
        """Dynamic sampling drops uninformative groups; the producer never regenerates."""
        groups = len({s.group_id for s in samples})
        sampler: DynamicSampler[list[Sample]] = DynamicSampler(num_groups=max(groups, 1))
        sample_groups(sampler, samples)
        return sampled(sampler, metrics)

    async def _produce(self, queue: TrajectoryQueue) -> None:
        """Start groups as the staleness rule allows; put each episode when it finishes.

        Raises the first error of an episode task (a failed episode is not an error)."""
        assert self._feed is not None
        clock = self._gen_clock
        failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        episodes: set[asyncio.Task] = set()

        def watch(task: asyncio.Task) -> None:
            episodes.discard(task)
            if not task.cancelled() and task.exception() and not failure.done():
                failure.set_exception(task.exception())

        try:
            while True:
                allowed = await _unless_failed(
                    queue.acquire(self.cfg.data.train_batch_size), failure
                )
                if not allowed:  # the queue closed
                    return
                for _ in range(allowed):
                    index, row = self._feed.next_row()
                    group = make_requests(
                        [row],
                        self.cfg.rollout.n,
                        self.manager.default_sampling(),
                        first_row_index=index,
                    )
                    self._feed.start(group[0].group_id, index, row)
                    self.audit.handed_out(index, group[0].group_id)
                    for request in group:
                        task = asyncio.create_task(self._run_one(request, queue))
                        episodes.add(task)
                        task.add_done_callback(watch)
                        clock.track(task)
        finally:
            for task in episodes:
                task.cancel()
            await asyncio.gather(*episodes, return_exceptions=True)
            if failure.done():
                failure.exception()  # raised above already; mark it retrieved

    async def _run_one(self, request: EpisodeRequest, queue: TrajectoryQueue) -> None:
        await queue.put(await self.manager.run(request))

    # -- data position -----------------------------------------------------------------

    def _row_loader(self) -> RowLoader | None:
        loader = super()._row_loader()
        self._feed = RowFeed(loader) if loader is not None else None
        return loader

    def _data_state(self) -> dict[str, Any]:
        return {"row_feed": self._feed.state_dict() if self._feed is not None else None}

    def _pending_rows(self) -> list[int]:
        if self._feed is None:
            return []
        return [index for index, _ in self._feed.state_dict()["pending"]]

    def _load_data_state(self, extra: dict[str, Any]) -> None:
        if self._feed is None:
            return
        if extra.get("row_feed") is not None:
            self._feed.load_state_dict(extra["row_feed"])
        elif extra.get("loader") is not None:  # a synchronous run's checkpoint
            super()._load_data_state(extra)
            self._feed = RowFeed(self.loader, next_index=self.loader.rows_drawn)


async def _unless_failed(awaitable: Awaitable[T], failure: asyncio.Future[None]) -> T:
    """``await awaitable``, or raise ``failure``'s exception as soon as it has one."""
    task = asyncio.ensure_future(awaitable)
    await asyncio.wait({task, failure}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        failure.result()
    return task.result()


async def _stop(producer: asyncio.Task) -> None:
    """Cancel the producer and wait until its episode tasks are cancelled too."""
    producer.cancel()
    await asyncio.gather(producer, return_exceptions=True)


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
