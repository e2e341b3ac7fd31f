"""``AsyncTrainer``: rollout and training overlap, bounded by the staleness rule.

Its batches come from ``AsyncBatches``; everything else is ``Trainer``'s. A producer task
keeps starting episode groups whenever ``TrajectoryQueue`` allows it
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
from functools import partial
from typing import TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agentrl.config import AgentRLConfig
from agentrl.rollout.episode import EpisodeRequest, EpisodeResult
from agentrl.rollout.manager import AgentLoopManager
from agentrl.rollout.queue import SessionInbox, TrajectoryQueue, drain_inbox
from agentrl.server.gateway.sink import queue_actor_name
from agentrl.trainer.batches import BatchSource, KeepReplicasCurrent, StepBatch
from agentrl.trainer.ledger import RunLedger
from agentrl.trainer.trainer import Trainer

T = TypeVar("T")

FIRST = asyncio.FIRST_COMPLETED
_REPLICA_CHECK_S = 5.0
"""How often a trainer waiting for a batch checks that no replica serves old weights."""


class AsyncBatches(BatchSource):
    """Batches from a ``TrajectoryQueue`` that a producer task fills ahead of training,
    within the staleness rule, and, with a queue sink, the gateway's sessions."""

    def __init__(
        self,
        cfg: AgentRLConfig,
        manager: AgentLoopManager,
        ledger: RunLedger,
        keep_replicas_current: KeepReplicasCurrent,
        version: int,
    ) -> None:
        """``version``: the weight version the replicas serve at the start."""
        super().__init__(cfg, manager, ledger, keep_replicas_current)
        self.queue = self._make_queue(version)
        self._inbox: ray.actor.ActorHandle | None = None
        self._gen_clock = _BusyClock()
        # What fills the queue: tasks that end only by failing, named for their error.
        self._sources: dict[str, asyncio.Task] = {}
        # The producer's running episode tasks, by group: a partial group's stragglers
        # are cancelled when it goes to a batch.
        self._episodes: dict[str, dict[str, asyncio.Task]] = {}

    def check(self) -> None:
        sink = self.cfg.gateway.sink
        if not self.cfg.trainer.agent_loop_episodes and queue_actor_name(sink) is None:
            raise ValueError(
                "trainer.agent_loop_episodes=false needs episodes from somewhere: set "
                "gateway.sink=queue (and gateway.enabled=true, or a gateway of your own)"
            )

    async def start(self, version: int) -> None:
        """Start the producer (unless only gateway sessions are trained) and the inbox;
        a new queue when the last ``fit`` closed this one."""
        if self.queue.closed:
            self.queue = self._make_queue(version)
        if self.cfg.trainer.agent_loop_episodes:
            self._sources["producer"] = asyncio.create_task(
                self._produce(), name="the rollout producer"
            )
        self._inbox = self._make_inbox()
        if self._inbox is not None:
            self._sources["inbox"] = asyncio.create_task(
                drain_inbox(self._inbox.take.remote, self.queue), name="the gateway inbox"
            )

    def _make_queue(self, version: int) -> TrajectoryQueue:
        """The driver-side queue (external sources when the gateway's sink is a queue)."""
        cfg = self.cfg
        return TrajectoryQueue(
            batch_groups=cfg.data.train_batch_size,
            group_size=cfg.rollout.n,
            max_staleness=cfg.trainer.max_staleness,
            max_concurrency=cfg.rollout.num_workers * cfg.rollout.max_concurrent_loops,
            stale_policy=cfg.trainer.stale_policy,
            max_response_length=cfg.rollout.max_response_length,
            version=version,
            external_sources=queue_actor_name(cfg.gateway.sink) is not None,
            oversample_groups=cfg.trainer.oversample_groups,
            min_group_size=cfg.trainer.min_group_size,
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

    async def next_batch(self, step: int, last: bool) -> StepBatch | None:
        """The batch of ``step``; a source's error instead, as soon as one fails. Before and
        while it waits, replicas that came back with old weights get the current ones.

        With ``last``, the producer stops once the batch is in hand: episodes started
        then would never be trained, and would share the cores with the last update and
        the final validation. Their rows stay pending in the last checkpoint."""
        await self.keep_replicas_current()
        sources = list(self._sources.values())
        get = asyncio.ensure_future(
            self.queue.get_batch(timeout_s=self.cfg.trainer.batch_timeout_s)
        )
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
                f"{failed.get_name()} failed at step {step}: {type(error).__name__}: {error}"
            ) from error
        batch = await get
        if batch is None:
            return None
        if last and "producer" in self._sources:
            await _stop(self._sources.pop("producer"))
        aborted = sum(self._abort_stragglers(group) for group in batch.groups)
        return StepBatch(
            batch.episodes,
            self.ledger.rows_by_group,
            [group[0].group_id for group in batch.groups],
            batch.dropped_group_ids,
            batch.metrics | {"async/aborted_stragglers": float(aborted)},
        )

    def _abort_stragglers(self, group: list[EpisodeResult]) -> int:
        """Cancel the episodes of a partial ``group`` that are still running (on their
        workers and engines too, so they stop taking turns from the next step's
        episodes); how many there were."""
        trained = {episode.episode_id for episode in group}
        tasks = self._episodes.pop(group[0].group_id, {})
        stragglers = [t for i, t in tasks.items() if i not in trained and not t.done()]
        for task in stragglers:
            task.cancel()
        return len(stragglers)

    async def step_done(self, version: int) -> dict[str, float]:
        """The step's batch frees its slots; generation may run ``η`` versions ahead of
        ``version``."""
        await self.queue.finish_step(version)
        return {"timing/gen": self._gen_clock.take()}

    async def close(self) -> None:
        for source in self._sources.values():
            await _stop(source)
        await self.queue.close()
        if self._inbox is not None:
            ray.kill(self._inbox)  # free the name for the next run in this Ray session

    async def _produce(self) -> None:
        """Start groups as the staleness rule allows; put each episode when it finishes.

        Raises the first error of an episode task (a failed episode is not an error)."""
        failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        episodes: set[asyncio.Task] = set()

        def watch(task: asyncio.Task, request: EpisodeRequest) -> None:
            episodes.discard(task)
            group = self._episodes.get(request.group_id, {})
            group.pop(request.episode_id, None)
            if not group:
                self._episodes.pop(request.group_id, None)
            if not task.cancelled() and task.exception() and not failure.done():
                failure.set_exception(task.exception())

        try:
            while True:
                allowed = await _unless_failed(
                    self.queue.acquire(self.cfg.data.train_batch_size), failure
                )
                if not allowed:  # the queue closed
                    return
                for _ in range(allowed):
                    group = self.ledger.next_group(
                        self.cfg.rollout.n, self.manager.default_sampling()
                    )
                    for request in group:
                        task = asyncio.create_task(self.run_one(request))
                        episodes.add(task)
                        group_tasks = self._episodes.setdefault(request.group_id, {})
                        group_tasks[request.episode_id] = task
                        task.add_done_callback(partial(watch, request=request))
                        self._gen_clock.track(task)
        finally:
            for task in episodes:
                task.cancel()
            await asyncio.gather(*episodes, return_exceptions=True)
            if failure.done():
                failure.exception()  # raised above already; mark it retrieved

    async def run_one(self, request: EpisodeRequest) -> None:
        """Run one episode and put it in the queue, failed or not."""
        await self.queue.put(await self.manager.run(request))


class AsyncTrainer(Trainer):
    """The same steps as ``Trainer``; generation runs ahead by up to η versions."""

    def make_batch_source(self) -> AsyncBatches:
        return AsyncBatches(
            self.cfg,
            self.processes.manager,
            self.ledger,
            self.keep_replicas_current,
            self.version,
        )


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
