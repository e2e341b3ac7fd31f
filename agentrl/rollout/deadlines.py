"""Episode time limits of one worker: a single watchdog task instead of a timer per episode.

Kept over ``asyncio.timeout``, which cost 2-2.6% more CPU per episode at 10k concurrent episodes
(``bench/agent_loop_overhead.py``'s tool loop, medians of 9 paired runs; 6 µs per episode in a
bare micro-benchmark).

``asyncio.timeout`` pushes a timer handle into the event loop's heap for every episode and
cancels it afterwards; at thousands of episodes a second per worker that bookkeeping is a
measurable share of the worker's time. Every episode of a worker has the same limit, so
episodes expire in the order they started: a dict in insertion order holds the running
ones, and one watchdog task sleeps until the oldest one's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class EpisodeTimeout(TimeoutError):
    """An episode ran past the worker's time limit (and was cancelled)."""


class EpisodeDeadlines:
    """Runs awaitables under one shared time limit (``timeout_s``), like ``asyncio.timeout``.

    An episode past its deadline is cancelled and ``run`` raises ``EpisodeTimeout`` (a
    ``TimeoutError``); a cancellation from elsewhere still propagates as ``CancelledError``.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: dict[int, tuple[float, asyncio.Task]] = {}
        self._expired: set[int] = set()
        self._last_key = 0
        self._watchdog: asyncio.Task | None = None

    async def run(self, episode: Awaitable[T]) -> T:
        """Await ``episode`` in the current task; ``EpisodeTimeout`` if it runs out of time."""
        key = self._start()
        try:
            result = await episode
        except asyncio.CancelledError:
            if self._finish(key) and asyncio.current_task().uncancel() == 0:
                raise EpisodeTimeout(f"ran past {self.timeout_s:g} s") from None
            raise
        except BaseException:
            self._finish(key)
            raise
        if self._finish(key):
            # Out of time, but the episode swallowed the cancellation and returned.
            asyncio.current_task().uncancel()
            raise EpisodeTimeout(f"ran past {self.timeout_s:g} s")
        return result

    @property
    def running(self) -> int:
        """Episodes being timed now."""
        return len(self._running)

    def _start(self) -> int:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A new event loop (tests run one per test): what the old one left is gone.
            self._loop, self._watchdog = loop, None
            self._running.clear()
            self._expired.clear()
        key = self._last_key = self._last_key + 1
        self._running[key] = (loop.time() + self.timeout_s, asyncio.current_task())
        if self._watchdog is None:
            self._watchdog = loop.create_task(self._watch())
        return key

    def _finish(self, key: int) -> bool:
        """Stop timing ``key``; True if the watchdog cancelled it for running out of time."""
        if self._running.pop(key, None) is not None:
            return False
        if key in self._expired:
            self._expired.remove(key)
            return True
        return False

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._running:
                key = next(iter(self._running))  # the oldest running episode
                deadline, task = self._running[key]
                delay = deadline - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    continue
                del self._running[key]
                self._expired.add(key)
                task.cancel()
        finally:
            if self._loop is loop:
                self._watchdog = None
