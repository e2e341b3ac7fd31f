"""``AgentLoopManager``: runs a batch of episodes across Ray worker actors.

Episodes are spread over ``rollout.num_workers`` ``AgentLoopWorker`` actors (each runs up
to ``rollout.max_concurrent_loops`` loops on one event loop) and come back as they
finish (``stream``) or all at once (``generate``). Those sent to one worker in one
event-loop tick travel as one call (``EpisodeBatches``). A failing episode is a result
with an ``error``; it never takes the batch down.

A worker whose process dies is restarted by Ray (up to 3 times). Its in-flight episodes
run again on a live worker, up to ``rollout.worker_death_retries`` times, then count as
failed; episodes started meanwhile go to the other workers or wait for the restart
(``WorkerPool``), so none fails only because it was sent during the restart. With no
worker left, ``run`` raises ``NoLiveWorker``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import ray

from agentrl.core.types import SamplingParams
from agentrl.rollout.episode import EpisodeRequest, EpisodeResult, make_requests
from agentrl.rollout.episode_batches import EpisodeBatches
from agentrl.rollout.worker import AgentLoopWorker, AgentLoopWorkerConfig
from agentrl.rollout.worker_nodes import worker_placement
from agentrl.rollout.worker_pool import WorkerPool

logger = logging.getLogger(__name__)


# Tools start subprocesses (the code sandbox) while other threads of the actor are inside
# gRPC calls; gRPC's fork handlers then log a line per fork and do nothing useful, since
# the child execs at once and never uses gRPC.
_WORKER_ENV = {"GRPC_ENABLE_FORK_SUPPORT": "0"}
_WORKER_RESTARTS = 3


class AgentLoopManager:
    """Owns the worker actors; hands them episodes round-robin."""

    def __init__(
        self, config: AgentLoopWorkerConfig | Any, worker_cls: type = AgentLoopWorker
    ) -> None:
        """``config``: the sections the workers read, or a full config (``AgentRLConfig``)
        to take them from. ``worker_cls``: the actor class, built from those sections as a
        dict (tests pass a stand-in: an ``EpisodeStreamer`` with the same ``run_episode``
        and ``ping``)."""
        # The plugins are imported here first, so that one that fails names its cause in
        # the driver; the workers get them and the model as resolved (plugin file paths
        # made absolute, builtin: model names as checkpoint directories), and only the
        # sections they read.
        self.config = AgentLoopWorkerConfig.of(config).resolved()
        rollout = self.config.rollout
        worker_config = self.config.model_dump()
        actor_cls = ray.remote(worker_cls)
        workers = [
            actor_cls.options(
                num_cpus=rollout.worker_num_cpus,
                # Concurrency is bounded inside the worker; leave room for control calls.
                max_concurrency=rollout.max_concurrent_loops + 16,
                runtime_env={"env_vars": _WORKER_ENV},
                max_restarts=_WORKER_RESTARTS,
                # Dealt over the nodes (worker_nodes): a lost node takes only its share
                # of the episodes in flight, and Ray restarts those workers on the nodes left.
                **placement,
            ).remote(worker_config)
            for placement in worker_placement(rollout.num_workers, rollout.worker_num_cpus)
        ]
        self._pool = WorkerPool(
            workers, rollout.worker_restart_timeout_s, max_run=rollout.max_concurrent_loops
        )
        self._batches = EpisodeBatches()

    def default_sampling(self) -> SamplingParams:
        """Sampling from the rollout config (max_tokens = the response budget)."""
        rollout = self.config.rollout
        return SamplingParams(
            max_tokens=rollout.max_response_length,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            seed=rollout.seed,
        )

    async def run(self, request: EpisodeRequest) -> EpisodeResult:
        """Run one episode on a live worker. One whose worker died under it runs again
        (``result.retries``), up to ``rollout.worker_death_retries`` times, then is a
        failed episode. Raises ``NoLiveWorker`` when no worker is left to run it."""
        retries = 0
        while True:
            index, worker = await self._pool.acquire(request.group_id)
            try:
                result = await self._batches.submit(index, worker, request)
            except ray.exceptions.RayActorError as error:
                self._pool.died(index)
                if retries == self.config.rollout.worker_death_retries:
                    return self._failed(request, "its agent-loop worker died", error)
                retries += 1
                logger.warning(
                    "episode %s: its agent-loop worker died (%s); running it again",
                    request.episode_id,
                    type(error).__name__,
                )
            except ray.exceptions.RayError as error:
                return self._failed(request, "agent-loop worker failed", error)
            else:
                result.retries = retries
                return result

    def _failed(self, request: EpisodeRequest, what: str, error: Exception) -> EpisodeResult:
        logger.warning("episode %s failed: %s: %s", request.episode_id, what, error)
        return EpisodeResult(
            request.episode_id,
            request.group_id,
            request.row_index,
            request.sample_index,
            request.row.get("agent_name") or self.config.rollout.agent_name,
            error=f"{what}: {type(error).__name__}: {error}",
        )

    async def stream(
        self,
        rows: list[dict[str, Any]],
        n: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> AsyncIterator[EpisodeResult]:
        """Run ``n`` episodes per row; yield each result as soon as it finishes."""
        requests = make_requests(
            rows, n or self.config.rollout.n, sampling or self.default_sampling()
        )
        async for result in self.stream_requests(requests):
            yield result

    async def stream_requests(self, requests: list[EpisodeRequest]) -> AsyncIterator[EpisodeResult]:
        """Run prepared episode requests; yield each result as soon as it finishes."""
        pending = [asyncio.ensure_future(self.run(r)) for r in requests]
        try:
            for finished in asyncio.as_completed(pending):
                yield await finished
        finally:
            for task in pending:
                task.cancel()

    async def generate(
        self,
        rows: list[dict[str, Any]],
        n: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> list[EpisodeResult]:
        """Run the whole batch; results ordered by (row, sample)."""
        results = [r async for r in self.stream(rows, n, sampling)]
        return sorted(results, key=lambda r: (r.row_index, r.sample_index))

    @property
    def workers(self) -> list[ray.actor.ActorHandle]:
        """The worker actors (live, restarting or lost)."""
        return self._pool.actors

    async def event_loop_names(self) -> list[str]:
        return await asyncio.gather(*(_await(w.event_loop_name.remote()) for w in self.workers))

    def shutdown(self) -> None:
        """Kill the worker actors."""
        self._pool.close()
        for worker in self.workers:
            ray.kill(worker)
        self.workers.clear()


async def _await(ref: ray.ObjectRef) -> Any:
    return await ref
