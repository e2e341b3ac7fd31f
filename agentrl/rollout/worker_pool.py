"""``WorkerPool``: the agent-loop worker actors, handed out only while they answer.

Ray restarts a dead actor (``max_restarts``), but a call sent while it restarts does not
wait for the new process: with ``max_task_retries`` 0, Ray 2.60 fails it with
``ActorUnavailableError`` ("The actor is restarting") about a second after it was sent.
A caller that starts the next episode as soon as one fails therefore loses one episode
per slot per second of the restart: the fault suite saw 112 failed episodes for about
32 in flight when it killed the agent-loop worker. (``max_task_retries`` would make Ray
resend them, but also every in-flight episode, with no bound on the wait and no way to
send them to another worker.) So the first failed call marks the worker as restarting,
and until a ``ping()`` gets through to it again, the pool hands out the other live
workers, or waits for one to come back.

A worker is lost when Ray gave up on it (``ActorDiedError``: no restarts left, or its
constructor failed) or when it is not back within ``restart_timeout_s``. Once every
worker is lost, ``acquire`` raises ``NoLiveWorker``, which says what became of each.
"""

from __future__ import annotations

import asyncio
import logging

import ray
from ray.actor import ActorHandle

logger = logging.getLogger(__name__)

_PING_RETRY_S = 0.2
"""Pause before pinging a restarting worker again (each ping fails within ~1 s)."""


class NoLiveWorker(RuntimeError):
    """Every agent-loop worker died for good or did not come back in time."""


class WorkerPool:
    """Round-robin over the live actors (any actors with an async ``ping()`` method), by
    key: up to ``max_run`` calls in a row with one key get the same worker, so the
    episodes of a group, started one after another, share one worker (and one call to it,
    see ``EpisodeBatches``) instead of one call to each of several. ``max_run`` is what
    a worker runs at once: a larger group spreads over workers."""

    def __init__(
        self, actors: list[ActorHandle], restart_timeout_s: float, max_run: int = 1
    ) -> None:
        self.actors = list(actors)
        self.restart_timeout_s = restart_timeout_s
        self.max_run = max_run
        self._restarting: dict[int, asyncio.Task[None]] = {}
        self._lost: dict[int, str] = {}
        self._turn = 0
        self._run: tuple[str, int, int] | None = None  # key, worker and length of the run

    async def acquire(self, key: str | None = None) -> tuple[int, ActorHandle]:
        """The next live worker and its index (the last call's worker, if ``key`` is the
        last call's, that worker is live and its run is shorter than ``max_run``). Waits
        while every worker that is not lost is restarting; raises ``NoLiveWorker`` once
        all are lost."""
        while True:
            live = [
                i
                for i in range(len(self.actors))
                if i not in self._restarting and i not in self._lost
            ]
            if live:
                if key is not None and self._run is not None:
                    run_key, index, length = self._run
                    if run_key == key and index in live and length < self.max_run:
                        self._run = (key, index, length + 1)
                        return index, self.actors[index]
                index = live[self._turn % len(live)]
                self._turn += 1
                self._run = None if key is None else (key, index, 1)
                return index, self.actors[index]
            if not self._restarting:
                fates = "; ".join(f"worker {i} {why}" for i, why in sorted(self._lost.items()))
                raise NoLiveWorker(f"no agent-loop worker is alive: {fates}")
            await asyncio.wait(list(self._restarting.values()), return_when=asyncio.FIRST_COMPLETED)

    def died(self, index: int) -> None:
        """A call to worker ``index`` failed because its process died: hand it out again
        once it answers a ping (Ray restarted it), or never if it does not."""
        if index not in self._restarting and index not in self._lost:
            logger.warning("agent-loop worker %d died; waiting for Ray to restart it", index)
            self._restarting[index] = asyncio.create_task(self._until_back(index))

    def close(self) -> None:
        """Stop waiting for restarting workers (their actors are about to be killed: a
        wait left running would report them lost, for good, in a later run's log)."""
        for task in self._restarting.values():
            task.cancel()

    @property
    def lost(self) -> dict[int, str]:
        """The workers given up on, by index: what became of each."""
        return dict(self._lost)

    async def _until_back(self, index: int) -> None:
        actor = self.actors[index]
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with asyncio.timeout(self.restart_timeout_s):
                while True:
                    try:
                        await actor.ping.remote()
                        break
                    except ray.exceptions.ActorUnavailableError:  # still restarting
                        await asyncio.sleep(_PING_RETRY_S)
            logger.warning("agent-loop worker %d is back after %.1f s", index, loop.time() - start)
        except ray.exceptions.RayActorError as error:
            self._lost[index] = f"died for good ({type(error).__name__}: {error})"
        except TimeoutError:
            self._lost[index] = (
                f"was not back {self.restart_timeout_s:g} s after it died "
                "(rollout.worker_restart_timeout_s)"
            )
            ray.kill(actor, no_restart=True)
        finally:
            del self._restarting[index]
        if index in self._lost:
            logger.error("agent-loop worker %d is lost: it %s", index, self._lost[index])
