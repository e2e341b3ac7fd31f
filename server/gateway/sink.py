"""Where finished sessions go: the ``TrajectorySink`` interface and the built-in sinks.

``memory`` keeps finished sessions in the gateway (read back with ``Gateway.drain_sink``);
``queue`` / ``queue:NAME`` sends them to the trainer's inbox, a small Ray actor of that
name (``SessionInbox``) that the driver drains into its ``TrajectoryQueue``, so sessions
of free-running clients become training episodes next to the internal agent loops';
``pkg.module:factory`` is any object with ``async def put``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import pickle
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentrl.core.trajectory import AgentLoopOutput

logger = logging.getLogger(__name__)

DEFAULT_QUEUE_NAME = "agentrl-trajectory-queue"
"""Ray actor name of the trainer's inbox (``SessionInbox``) that ``gateway.sink: queue``
sends to."""


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

    def stats(self) -> dict[str, int]:
        """``held``: sessions stored and not drained yet."""
        return {"held": len(self._items)}


HeldSession = tuple[str, list[AgentLoopOutput], float | None, str | None]


class SessionSpool:
    """Finished sessions on local disk, oldest first: one pickle file per session in a
    directory made at the first ``append`` (under ``$TMPDIR``) and removed once empty.

    Where ``QueueSink`` keeps what does not fit in memory while the queue is unreachable,
    so a long outage costs disk, not sessions.
    """

    def __init__(self, prefix: str = "agentrl-sink-") -> None:
        self._prefix = prefix
        self._dir: Path | None = None
        self._head = self._tail = 0  # file numbers: [head, tail) are on disk

    def __len__(self) -> int:
        return self._tail - self._head

    @property
    def directory(self) -> Path | None:
        """Where the held sessions are (None while nothing was spilled)."""
        return self._dir

    def append(self, item: HeldSession) -> None:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=self._prefix))
        path = self._path(self._tail)
        partial = path.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(partial, path)  # a file is either complete or absent
        self._tail += 1

    def peek(self) -> HeldSession:
        """The oldest session (``IndexError`` when empty)."""
        if not len(self):
            raise IndexError("the spool is empty")
        return pickle.loads(self._path(self._head).read_bytes())

    def pop(self) -> None:
        """Forget the oldest session (delivered)."""
        self._path(self._head).unlink()
        self._head += 1
        if not len(self) and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _path(self, number: int) -> Path:
        assert self._dir is not None
        return self._dir / f"{number:012d}.pkl"


class QueueSink:
    """Sends each finished session to a trajectory queue (``put_session``).

    ``queue`` is anything with ``async def put_session`` (e.g. an in-process
    ``TrajectoryQueue``) or the name of a Ray actor with one (the trainer's
    ``SessionInbox``), looked up in ``namespace`` at the first finished session (so the
    gateway may start before the trainer creates the actor). Sessions driven by
    ``ExternalAgentLoop`` (``managed``) are skipped: the loop returns their samples to the
    trainer itself.

    While the actor does not exist yet (or a call to it fails), finished sessions are
    held and sent with the next finished session, oldest first, or at the session store's
    next sweep (``flush``). ``capacity`` sessions are held in memory; more go to a
    ``SessionSpool`` on local disk (``spilled`` counts them), so none is dropped.
    """

    def __init__(self, queue: Any, namespace: str | None = None, capacity: int = 10_000) -> None:
        self._name = queue if isinstance(queue, str) else None
        self._queue = None if isinstance(queue, str) else queue
        self._namespace = namespace
        self._capacity = capacity
        self._held: deque[HeldSession] = deque()
        self._spool = SessionSpool()
        self._lock = asyncio.Lock()
        self.sent = 0
        self.skipped = 0
        self.spilled = 0
        self._unreachable = False

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
        item = (session_id, samples, reward, info.group_id)
        if len(self._spool) or len(self._held) >= self._capacity:  # in order: after those
            if not len(self._spool):
                logger.warning(
                    "queue sink: %d sessions held in memory; holding the next ones on disk",
                    len(self._held),
                )
            self._spool.append(item)
            self.spilled += 1
        else:
            self._held.append(item)
        await self.flush()

    @property
    def held(self) -> int:
        """Finished sessions not yet delivered to the queue (in memory and on disk)."""
        return len(self._held) + len(self._spool)

    def stats(self) -> dict[str, int]:
        """``held`` (undelivered), ``held_on_disk``, ``spilled`` (ever held on disk),
        ``sent`` and ``skipped`` (managed sessions) counts."""
        return {
            "held": self.held,
            "held_on_disk": len(self._spool),
            "spilled": self.spilled,
            "sent": self.sent,
            "skipped": self.skipped,
        }

    async def flush(self) -> bool:
        """Send every held session; False if the queue could not be reached (kept held)."""
        async with self._lock:
            return await self._flush()

    async def _flush(self) -> bool:
        while self.held:
            from_memory = bool(self._held)  # memory holds the older sessions
            session_id, samples, reward, group_id = (
                self._held[0] if from_memory else self._spool.peek()
            )
            try:
                status = await self._put_session(session_id, samples, reward, group_id)
            except Exception as exc:  # the actor is missing or failed: keep it, retry later
                if not self._unreachable:  # once per outage, not once per session
                    logger.warning(
                        "queue sink: cannot deliver session %s to %s (%s); holding finished "
                        "sessions until it answers",
                        session_id,
                        self._name or type(self._queue).__name__,
                        exc,
                    )
                self._unreachable = True
                if self._name is not None:
                    self._queue = None  # look the actor up again next time
                return False
            if self._unreachable:
                logger.info("queue sink: the queue answers again; delivering held sessions")
                self._unreachable = False
            if from_memory:
                self._held.popleft()
            else:
                self._spool.pop()
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
    """``memory``, ``queue`` / ``queue:ACTOR_NAME`` (the trainer's ``SessionInbox`` actor
    in ``namespace``), or ``pkg.module:factory`` (a class or function called with no arguments)."""
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
