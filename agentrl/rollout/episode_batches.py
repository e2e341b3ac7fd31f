"""Episodes sent to one agent-loop worker travel in batches, and come back as they finish.

One Ray actor call per episode costs the driver about as much as the whole episode does
on a fast engine (``bench/rollout_transport.py``, single-turn). So the episodes the
manager sends to one worker in one event-loop tick go as one streaming call,
``run_episodes``; the worker yields, each time it is resumed, every result that has
finished since, so a lone episode comes back as soon as it ends and a thousand that end
together come back in a few messages.

``EpisodeStreamer`` is the worker's side (mixed into ``AgentLoopWorker`` and into any
stand-in with an async ``run_episode``); ``EpisodeBatches`` is the manager's.

An episode whose caller gives up (its future is cancelled: a straggler of a group that
trained without it, a run that stops) is cancelled on its worker too, so it stops using
the worker and the engine: the agent loop's pending generation is aborted on its
replica (``DataClient``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from functools import partial
from typing import Any

import ray
from ray.actor import ActorHandle

from agentrl.rollout.episode import EpisodeRequest, EpisodeResult

Chunk = list[tuple[int, EpisodeResult]]
"""Finished episodes as (position in the batch, result)."""


class EpisodeStreamer:
    """Runs a batch of episodes with the class's own ``run_episode``."""

    async def run_episode(self, request: EpisodeRequest) -> EpisodeResult:
        raise NotImplementedError

    async def run_episodes(self, requests: list[EpisodeRequest]) -> AsyncIterator[Chunk]:
        """Run ``requests`` concurrently; yield what has finished each time the caller
        takes the next chunk (an episode cancelled by ``cancel_episodes`` never comes).
        An exception from ``run_episode`` ends the batch with it."""
        running = self._running_episodes()
        finished: asyncio.Queue[asyncio.Task[EpisodeResult]] = asyncio.Queue()
        positions: dict[asyncio.Task[EpisodeResult], int] = {}
        for position, request in enumerate(requests):
            task = asyncio.ensure_future(self.run_episode(request))
            task.add_done_callback(finished.put_nowait)
            positions[task] = position
            running[request.episode_id] = task
        try:
            left = len(requests)
            while left:
                done = [await finished.get()]
                while not finished.empty():
                    done.append(finished.get_nowait())
                left -= len(done)
                chunk = [(positions[task], task.result()) for task in done if not task.cancelled()]
                if chunk:
                    yield chunk
        finally:
            for request, task in zip(requests, positions, strict=True):
                task.cancel()
                running.pop(request.episode_id, None)

    def _running_episodes(self) -> dict[str, asyncio.Task[EpisodeResult]]:
        """Every batch's running episodes by id (a mixin has no ``__init__`` to make it)."""
        return self.__dict__.setdefault("_running_episodes_by_id", {})

    async def cancel_episodes(self, episode_ids: list[str]) -> int:
        """Cancel these running episodes (ids not running are ignored); how many were."""
        running = self._running_episodes()
        tasks = [running[i] for i in episode_ids if i in running and not running[i].done()]
        for task in tasks:
            task.cancel()
        return len(tasks)


class EpisodeBatches:
    """The manager's side: ``submit`` returns a future of one episode's result; the
    episodes submitted for one worker in one tick share one ``run_episodes`` call.

    A call that fails (the worker died, or ``run_episode`` raised) fails every episode
    of its batch that had not come back, with the call's exception."""

    def __init__(self) -> None:
        self._forming: dict[int, list[tuple[EpisodeRequest, asyncio.Future[EpisodeResult]]]] = {}
        self._calls: set[asyncio.Task[None]] = set()
        # Episodes given up on this tick, per worker: one cancel_episodes call each.
        self._cancelling: dict[int, list[str]] = {}

    def submit(
        self, index: int, worker: ActorHandle, request: EpisodeRequest
    ) -> asyncio.Future[EpisodeResult]:
        """Queue ``request`` for worker ``index``; the batch leaves at the end of the tick."""
        loop = asyncio.get_running_loop()
        batch = self._forming.get(index)
        if batch is None:
            batch = self._forming[index] = []
            loop.call_soon(self._send, index, worker)
        future: asyncio.Future[EpisodeResult] = loop.create_future()
        batch.append((request, future))
        return future

    def _send(self, index: int, worker: ActorHandle) -> None:
        batch = self._forming.pop(index)
        futures = [future for _, future in batch]
        requests = [request for request, _ in batch]
        call = self._start(self._call(worker, requests, futures))
        pending = len(futures)  # a count: a batch holds up to thousands of episodes

        def drop_when_unwanted(future: asyncio.Future[EpisodeResult], episode_id: str) -> None:
            nonlocal pending
            pending -= 1
            if future.cancelled() and not call.done():
                self._cancel_on_worker(index, worker, episode_id)
            if not pending:
                call.cancel()  # nothing left to listen for

        for request, future in batch:
            future.add_done_callback(partial(drop_when_unwanted, episode_id=request.episode_id))

    def _cancel_on_worker(self, index: int, worker: ActorHandle, episode_id: str) -> None:
        """Cancel ``episode_id`` on worker ``index``, with the others of this tick."""
        ids = self._cancelling.get(index)
        if ids is None:
            ids = self._cancelling[index] = []
            asyncio.get_running_loop().call_soon(self._send_cancels, index, worker)
        ids.append(episode_id)

    def _send_cancels(self, index: int, worker: ActorHandle) -> None:
        self._start(_cancel(worker, self._cancelling.pop(index)))

    def _start(self, call: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``call`` as a task held until it ends (the loop keeps only weak references)."""
        task = asyncio.get_running_loop().create_task(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return task

    @staticmethod
    async def _call(
        worker: ActorHandle,
        requests: list[EpisodeRequest],
        futures: list[asyncio.Future[EpisodeResult]],
    ) -> None:
        try:
            stream = worker.run_episodes.options(num_returns="streaming").remote(requests)
            async for chunk_ref in stream:
                for position, result in await chunk_ref:
                    if not futures[position].done():
                        futures[position].set_result(result)
            missing = sum(not future.done() for future in futures)
            if missing:
                raise RuntimeError(f"the worker's batch ended with {missing} episodes missing")
        except Exception as error:
            for future in futures:
                if not future.done():
                    future.set_exception(error)


async def _cancel(worker: ActorHandle, episode_ids: list[str]) -> None:
    # A worker that died meanwhile has cancelled everything already.
    with contextlib.suppress(ray.exceptions.RayError):
        await worker.cancel_episodes.remote(episode_ids)
