"""Where finished sessions go: the ``TrajectorySink`` interface and the built-in sinks.

``memory`` keeps finished sessions in the gateway (read back with ``Gateway.drain_sink``);
``queue`` / ``queue:NAME`` sends them to a ``TrajectoryQueue`` Ray actor, so sessions of
free-running clients become training episodes next to the internal agent loops';
``pkg.module:factory`` is any object with ``async def put``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentrl.core.trajectory import AgentLoopOutput

logger = logging.getLogger(__name__)

DEFAULT_QUEUE_NAME = "agentrl-trajectory-queue"
"""Ray actor name of the trajectory queue that ``gateway.sink: queue`` sends to."""


@dataclass(frozen=True)
class SessionInfo:
    """What the gateway knows about a finished session besides its samples.

    ``group_id``: the client's group (``x-group-id`` header, ``POST /v1/sessions/{id}``
    or the finish body); sessions of one group are one GRPO group in the trainer.
    ``managed``: the session is driven by ``ExternalAgentLoop``, which gets the samples
    back from ``finish`` and hands them to the trainer itself, so training sinks skip it.
    """

    group_id: str | None = None
    managed: bool = False
    finish_reason: str = "finished"


@runtime_checkable
class TrajectorySink(Protocol):
    """Receives each finished session once.

    ``samples`` are the session's training samples (``AgentLoopOutput``, each with its
    reward if one was given); ``reward`` is the session reward, if one was given.
    ``info`` (``SessionInfo``) is passed when ``put`` accepts a fourth argument.
    """

    async def put(
        self, session_id: str, samples: list[AgentLoopOutput], reward: float | None
    ) -> None: ...


def accepts_info(sink: TrajectorySink) -> bool:
    """Whether ``sink.put`` takes the ``SessionInfo`` argument (older sinks take three)."""
    try:
        params = inspect.signature(sink.put).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return (
        sum(p.kind in positional for p in params) >= 4
        or any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
        or any(p.name == "info" for p in params)
    )


class InMemorySink:
    """Keeps the last ``capacity`` finished sessions in the gateway's memory."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._items: deque[tuple[str, list[AgentLoopOutput], float | None]] = deque(maxlen=capacity)

    async def put(
        self, session_id: str, samples: list[AgentLoopOutput], reward: float | None
    ) -> None:
        self._items.append((session_id, samples, reward))

    def __len__(self) -> int:
        return len(self._items)

    def drain(self) -> list[tuple[str, list[AgentLoopOutput], float | None]]:
        """Every stored session, oldest first; the sink is empty afterwards."""
        items = list(self._items)
        self._items.clear()
        return items


class QueueSink:
    """Sends each finished session to a ``TrajectoryQueue`` (``put_session``).

    ``queue`` is the queue itself (anything with ``async def put_session``, e.g. an
    in-process ``TrajectoryQueue``) or the name of its Ray actor, looked up in
    ``namespace`` at the first finished session (so the gateway may start before the
    trainer creates the queue). Sessions driven by ``ExternalAgentLoop`` (``managed``)
    are skipped: the loop returns their samples to the trainer itself.

    While the actor does not exist yet (or a call to it fails), finished sessions are
    held, up to ``capacity`` (oldest dropped, with a warning), and sent with the next
    finished session, oldest first, or at the session store's next sweep (``flush``).
    """

    def __init__(self, queue: Any, namespace: str | None = None, capacity: int = 10_000) -> None:
        self._name = queue if isinstance(queue, str) else None
        self._queue = None if isinstance(queue, str) else queue
        self._namespace = namespace
        self._held: deque[tuple[str, list[AgentLoopOutput], float | None, str | None]] = deque(
            maxlen=capacity
        )
        self._lock = asyncio.Lock()
        self.sent = 0
        self.skipped = 0

    async def put(
        self,
        session_id: str,
        samples: list[AgentLoopOutput],
        reward: float | None,
        info: SessionInfo | None = None,
    ) -> None:
        info = info or SessionInfo()
        if info.managed:
            self.skipped += 1
            return
        if len(self._held) == self._held.maxlen:
            logger.warning("queue sink: holding too many sessions; dropped %s", self._held[0][0])
        self._held.append((session_id, samples, reward, info.group_id))
        await self.flush()

    @property
    def held(self) -> int:
        """Finished sessions not yet delivered to the queue."""
        return len(self._held)

    async def flush(self) -> bool:
        """Send every held session; False if the queue could not be reached (kept held)."""
        async with self._lock:
            return await self._flush()

    async def _flush(self) -> bool:
        while self._held:
            session_id, samples, reward, group_id = self._held[0]
            try:
                status = await self._put_session(session_id, samples, reward, group_id)
            except Exception as exc:  # the actor is missing or failed: keep it, retry later
                logger.warning(
                    "queue sink: cannot deliver session %s to %s (%s); %d session(s) held",
                    session_id,
                    self._name or type(self._queue).__name__,
                    exc,
                    len(self._held),
                )
                if self._name is not None:
                    self._queue = None  # look the actor up again next time
                return False
            self._held.popleft()
            self.sent += 1
            if status != "accepted":
                logger.warning("queue sink: the queue refused session %s (%s)", session_id, status)
        return True

    async def _put_session(
        self,
        session_id: str,
        samples: list[AgentLoopOutput],
        reward: float | None,
        group_id: str | None,
    ) -> Any:
        args = (session_id, samples, reward, group_id)
        if self._name is None or self._queue is None:
            return await self._send(args)
        try:
            return await self._send(args)
        except Exception:  # the actor we knew is gone (a new run?): look the name up again
            self._queue = None
            return await self._send(args)

    async def _send(self, args: tuple[Any, ...]) -> Any:
        if self._queue is None:
            import ray

            self._queue = ray.get_actor(self._name, namespace=self._namespace)
        method = self._queue.put_session
        if hasattr(method, "remote"):  # a Ray actor handle
            return await method.remote(*args)
        return await method(*args)


def queue_actor_name(spec: str) -> str | None:
    """The actor name a ``gateway.sink`` spec sends to (None unless it is a queue sink)."""
    if spec == "queue":
        return DEFAULT_QUEUE_NAME
    kind, _, name = spec.partition(":")
    return name if kind == "queue" and name else None


def load_sink(spec: str, capacity: int, namespace: str | None = None) -> TrajectorySink:
    """``memory``, ``queue`` / ``queue:ACTOR_NAME`` (a ``TrajectoryQueue`` Ray actor in
    ``namespace``), or ``pkg.module:factory`` (a class or function called with no arguments)."""
    if spec == "memory":
        return InMemorySink(capacity)
    name = queue_actor_name(spec)
    if name is not None:
        return QueueSink(name, namespace=namespace, capacity=capacity)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(
            f"gateway.sink must be `memory`, `queue`, `queue:ACTOR_NAME` or "
            f"`pkg.module:factory`, got {spec!r}"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import gateway.sink {spec!r}: {exc}") from exc
    sink = factory()
    if not isinstance(sink, TrajectorySink) or not inspect.iscoroutinefunction(sink.put):
        raise ValueError(f"gateway.sink {spec!r} must build an object with `async def put`")
    return sink
