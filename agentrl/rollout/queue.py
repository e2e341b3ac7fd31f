"""``TrajectoryQueue``: finished episodes between the rollout producer and the trainer.

The queue is an asyncio object in the driver, next to the producer and the trainer: an
episode travels once, from its agent-loop worker to the driver. The producer awaits
``acquire``, which waits until the staleness rule (``StalenessController``) lets a group
start and reserves as many as it allows, runs them, and ``put``s each finished episode.
The trainer calls ``get_batch`` and receives ``batch_groups`` complete groups (all
``group_size`` episodes of a prompt returned), oldest first. At that point each
episode's staleness — the trainer's version minus the oldest policy version among its
model tokens — is checked: episodes more than η versions behind are dropped, or
down-weighted by ``stale_weight_decay ** (staleness − η)`` in
``output.extra["sample_weight"]``, and counted.

External episodes — finished sessions of free-running clients of the OpenAI gateway —
join the same queue without a reservation. The gateway runs in a Serve replica, so its
queue sink (``gateway.sink: queue``) sends them to ``SessionInbox``, a small named Ray
actor, and ``drain_inbox`` moves them from there into the queue (``put_session``):

- grouping: sessions that gave the same group id (``x-group-id``) form one group, in
  arrival order, complete once ``group_size`` of them arrived; a group takes no more
  sessions after that (later ones are refused, ``async/external_rejected_group_full``).
  A session without a group id is a group of its own when ``group_size`` is 1 and is
  refused otherwise (``async/external_rejected_ungrouped``): one session alone is no
  GRPO group, and pooling unrelated prompts into one would make its advantages
  meaningless. Group ids are namespaced (``ext:<id>``), so they never mix with the
  producer's groups.
- capacity: they take no slot of the staleness rule (the producer never reserved them,
  and the gateway cannot hold a client back), so ``finish`` is not called for them and
  the producer's capacity is the same with or without them. They do take batch slots:
  a batch is the oldest complete groups, internal or external.
- staleness: checked like every episode's when the batch is taken (dropped or
  down-weighted), without giving a rule slot back.
- each session id is accepted once; a repeat is refused and counted
  (``async/duplicate_episodes``), never an error. ``async/external_episodes`` counts
  the accepted ones.

Stragglers: a long-tail episode holds only its own group. With ``oversample_groups``
the producer runs that many groups beyond the staleness rule's budget, so a batch is the
first groups to finish; with ``min_group_size`` (partial groups), when the trainer waits
for a batch and too few groups are complete, groups with at least that many finished
episodes fill it (oldest first) as soon as there are enough of them to; the stragglers
count as finished for the staleness rule (their slots are this step's), so the next
step's groups need not wait for them; the async trainer cancels them on their workers
and engines (``async/aborted_stragglers``), and one that finished meanwhile is discarded
(``async/late_episodes``).

Nothing here waits forever: ``get_batch`` raises ``QueueStalled`` at once when no batch
can ever form (nothing running, no room for the producer to start a group, no external
source) and ``BatchTimeout`` after ``timeout_s``; both say what the queue holds.

All methods run on one event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.rollout.episode import EpisodeResult, episode_from_session
from agentrl.rollout.staleness import StalenessController

logger = logging.getLogger(__name__)

_REFUSAL_COUNTERS = {
    "duplicate": "duplicate_episodes",
    "group_full": "external_rejected_group_full",
    "ungrouped": "external_rejected_ungrouped",
}


class QueueStalled(RuntimeError):
    """No batch can ever form: nothing runs and the staleness rule lets nothing start."""


class BatchTimeout(TimeoutError):
    """``get_batch`` waited ``timeout_s`` without a full batch."""


@dataclass
class TrainingBatch:
    """What the trainer gets: complete groups, and what happened to the rest.

    ``dropped_group_ids``: groups removed since the previous batch without being trained
    (every episode failed or was stale), so their rows can be forgotten."""

    groups: list[list[EpisodeResult]]
    version: int
    staleness: list[int] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    dropped_group_ids: list[str] = field(default_factory=list)

    @property
    def episodes(self) -> list[EpisodeResult]:
        return [episode for group in self.groups for episode in group]


class TrajectoryQueue:
    """Bounded-staleness buffer of finished episodes, grouped by prompt."""

    def __init__(
        self,
        batch_groups: int,
        group_size: int,
        max_staleness: int,
        max_concurrency: int,
        stale_policy: Literal["drop", "downweight"] = "drop",
        stale_weight_decay: float = 0.5,
        max_response_length: int | None = None,
        version: int = 0,
        external_sources: bool = False,
        oversample_groups: int = 0,
        min_group_size: int | None = None,
    ) -> None:
        """``version``: the policy version served now (a resumed run's); the staleness
        rule's step count starts at 0 whatever it is. ``external_sources``: episodes may
        arrive through ``put_session``/``put_external`` (a gateway queue sink), so an idle
        producer is no stall. ``oversample_groups`` and ``min_group_size``: the straggler
        options (module docstring)."""
        if min_group_size is not None and not 1 <= min_group_size <= group_size:
            raise ValueError(f"min_group_size must be in [1, {group_size}], got {min_group_size}")
        self.min_group_size = min_group_size or group_size
        self.batch_groups = batch_groups
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.stale_policy = stale_policy
        self.stale_weight_decay = stale_weight_decay
        self.max_response_length = max_response_length
        self._downweighted: set[str] = set()
        # Complete groups whose staleness was applied at policy version _checked_version:
        # get_batch runs the rule on every arrival, and only a new group or a new version
        # can change what it finds.
        self._checked_groups: set[str] = set()
        self._checked_version = version
        self._rule = StalenessController(
            max_staleness=max_staleness,
            batch_size=batch_groups * group_size,
            max_concurrency=max_concurrency,
            extra=oversample_groups * group_size,
            version=version,
        )
        self.external_sources = external_sources
        self._dropped_group_ids: list[str] = []
        self._open: dict[str, list[EpisodeResult]] = {}
        self._complete: OrderedDict[str, list[EpisodeResult]] = OrderedDict()
        self._changed = asyncio.Condition()
        self._seen: set[str] = set()
        self._full_external_groups: set[str] = set()
        self._cut_groups: set[str] = set()  # taken partial: their stragglers come late
        self._counts: Counter[str] = Counter()
        self._closed = False

    # -- producer side -----------------------------------------------------------------

    async def acquire(self, max_groups: int) -> int:
        """Wait until at least one group may start, then start up to ``max_groups``;
        returns how many the rule allows (at least one), or 0 once the queue closed."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._closed or self._rule.capacity >= self.group_size
            )
        return 0 if self._closed else await self.reserve(max_groups)

    async def reserve(self, max_groups: int) -> int:
        """Start up to ``max_groups`` groups now, without waiting; returns how many the
        rule allows."""
        groups = min(max_groups, self._rule.capacity // self.group_size)
        if groups > 0:
            self._rule.start(groups * self.group_size)
            self._counts["episodes_started"] += groups * self.group_size
        return groups

    async def put(self, episode: EpisodeResult) -> None:
        """A reserved episode finished (ok or failed); each episode id is accepted once.

        An ``external`` episode goes to ``put_external`` (it holds no reservation)."""
        if episode.external:
            await self.put_external(episode)
            return
        if episode.episode_id in self._seen:
            raise ValueError(f"episode {episode.episode_id} was already put")
        self._seen.add(episode.episode_id)
        if episode.group_id in self._cut_groups:
            # Its group went to a batch without it, and its slot was freed then.
            self._counts["late_episodes"] += 1
            return
        self._rule.finish(kept=episode.ok)
        await self._add(episode)

    async def put_session(
        self,
        session_id: str,
        samples: list[AgentLoopOutput],
        reward: float | None,
        group_id: str | None = None,
    ) -> str:
        """A finished gateway session (what the gateway's queue sink sends); see
        ``put_external``. ``samples`` are the session's ``AgentLoopOutput``s, one per
        trajectory the gateway built (``TrajectoryBuilder``)."""
        if group_id is None and self.group_size > 1:
            if session_id in self._seen:
                return self._refuse("duplicate")
            return self._refuse("ungrouped")
        episode = episode_from_session(
            session_id,
            samples,
            reward,
            group_id=f"ext:{group_id if group_id is not None else session_id}",
            max_response_length=self.max_response_length,
        )
        if group_id is not None:
            for output in episode.outputs:
                output.extra["client_group_id"] = group_id
        return await self.put_external(episode)

    async def put_external(self, episode: EpisodeResult) -> str:
        """An episode nobody reserved (e.g. ``episode_from_session``): joins its group in
        arrival order (``sample_index`` is set here) without touching the staleness rule.

        Returns ``accepted``, or why it was refused (counted, never raised):
        ``duplicate`` (episode id seen before) or ``group_full`` (its group already
        has ``group_size`` episodes)."""
        if episode.episode_id in self._seen:
            return self._refuse("duplicate")
        if episode.group_id in self._full_external_groups:
            return self._refuse("group_full")
        self._seen.add(episode.episode_id)
        episode.external = True
        episode.sample_index = len(self._open.get(episode.group_id, []))
        self._counts["external_episodes"] += 1
        if len(self._open.get(episode.group_id, [])) + 1 == self.group_size:
            self._full_external_groups.add(episode.group_id)
        await self._add(episode)
        return "accepted"

    def _refuse(self, reason: str) -> str:
        self._counts[_REFUSAL_COUNTERS[reason]] += 1
        return reason

    async def _add(self, episode: EpisodeResult) -> None:
        self._counts["episodes_in"] += 1
        if not episode.ok:
            self._counts["failed_episodes"] += 1
        if episode.retries:
            self._counts["retried_episodes"] += 1
        group = self._open.setdefault(episode.group_id, [])
        group.append(episode)
        if len(group) == self.group_size:
            del self._open[episode.group_id]
            self._complete[episode.group_id] = sorted(group, key=lambda e: e.sample_index)
        async with self._changed:
            self._changed.notify_all()

    # -- trainer side ------------------------------------------------------------------

    async def get_batch(self, timeout_s: float | None = None) -> TrainingBatch | None:
        """Wait for ``batch_groups`` usable groups; None once closed and drained.

        Raises ``QueueStalled`` as soon as no batch can form any more, and
        ``BatchTimeout`` when none formed within ``timeout_s`` seconds."""
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                while True:
                    if self._apply_staleness():
                        self._changed.notify_all()  # freed slots: wake the producer
                    if len(self._complete) < self.batch_groups:
                        self._take_partial_groups()
                    if len(self._complete) >= self.batch_groups:
                        break
                    if self._closed:
                        return None
                    if self._stalled():
                        raise QueueStalled(f"no training batch can form: {self.describe()}")
                    await self._changed.wait()
        except TimeoutError:
            waited = time.monotonic() - start
            raise BatchTimeout(
                f"no training batch after {waited:.0f} s (trainer.batch_timeout_s): "
                f"{self.describe()}"
            ) from None
        groups = [self._complete.popitem(last=False)[1] for _ in range(self.batch_groups)]
        staleness = [self._staleness(e) for group in groups for e in group if e.ok]
        self._counts["episodes_out"] += sum(len(g) for g in groups)
        dropped, self._dropped_group_ids = self._dropped_group_ids, []
        return TrainingBatch(groups, self._rule.version, staleness, self.metrics(), dropped)

    async def set_version(self, version: int) -> None:
        """The trainer now serves ``version`` (one step per new version): more episodes
        may start."""
        self._rule.set_version(version)
        async with self._changed:
            self._changed.notify_all()

    async def finish_step(self, version: int) -> None:
        """The trainer finished a step and serves ``version`` (unchanged when the step
        made no update): the step's batch frees its slots either way."""
        self._rule.finish_step(version)
        async with self._changed:
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Wake every waiter; ``get_batch`` returns None once nothing usable is left."""
        self._closed = True
        async with self._changed:
            self._changed.notify_all()

    def _take_partial_groups(self) -> None:
        """Partial groups: once the batch is short by no more groups than there are open
        groups of the producer with at least ``min_group_size`` finished episodes (one of
        them ok), the oldest of those fill it. Until then they stay open and may still
        finish whole; the stragglers of the groups taken are dropped if they finish
        (``put``)."""
        if self.min_group_size >= self.group_size:
            return
        missing = self.batch_groups - len(self._complete)
        eligible = [
            group_id
            for group_id, group in self._open.items()
            if not any(episode.external for episode in group)
            and len(group) >= self.min_group_size
            and any(episode.ok for episode in group)
        ]
        if missing <= 0 or len(eligible) < missing:
            return
        for group_id in eligible[:missing]:
            group = self._open.pop(group_id)
            self._cut_groups.add(group_id)
            # The stragglers count as finished now: their slots belong to this step's
            # budget (none frees before the step ends, or the groups started in it would
            # be stale), and the next step's groups need not wait for them.
            for _ in range(self.group_size - len(group)):
                self._rule.finish(kept=True)
            self._complete[group_id] = sorted(group, key=lambda e: e.sample_index)
            self._counts["partial_groups"] += 1

    def _stalled(self) -> bool:
        return (
            not self.external_sources
            and self._rule.running == 0
            and self._rule.capacity < self.group_size
        )

    def describe(self) -> str:
        """What the queue holds and what runs, for error messages."""
        rule = self._rule
        open_sizes = sorted(len(group) for group in self._open.values())
        return (
            f"{len(self._complete)} complete groups of the {self.batch_groups} a batch "
            f"needs, {len(self._open)} incomplete groups (episodes in each: {open_sizes}), "
            f"{rule.running} episodes running, room to start {rule.capacity} more "
            f"(staleness rule: η={self.max_staleness}, step {rule.steps}, accepted "
            f"{rule.accepted}, rejected {rule.rejected}); policy version {rule.version}; "
            f"counters {dict(self._counts)}"
        )

    def pending_episode_ids(self) -> list[str]:
        """Episodes received but not yet handed to the trainer (complete or open groups)."""
        groups = [*self._complete.values(), *self._open.values()]
        return [episode.episode_id for group in groups for episode in group]

    def metrics(self) -> dict[str, float]:
        """Counters under ``async/`` plus the current queue depth."""
        return {
            "async/queue_depth_groups": float(len(self._complete)),
            "async/open_groups": float(len(self._open)),
            "async/running": float(self._rule.running),
            **{f"async/{k}": float(v) for k, v in self._counts.items()},
        }

    # -- staleness ---------------------------------------------------------------------

    def _staleness(self, episode: EpisodeResult) -> int:
        oldest = episode.oldest_version
        return 0 if oldest is None else self._rule.version - oldest

    def _apply_staleness(self) -> bool:
        """Drop or down-weight episodes more than η versions behind; drop empty groups.
        Returns whether a dropped episode gave a slot of the staleness rule back."""
        freed = False
        if self._rule.version != self._checked_version:
            self._checked_groups.clear()
            self._checked_version = self._rule.version
        for group_id in [g for g in self._complete if g not in self._checked_groups]:
            self._checked_groups.add(group_id)
            kept = []
            for episode in self._complete[group_id]:
                excess = self._staleness(episode) - self.max_staleness if episode.ok else 0
                if excess > 0 and self.stale_policy == "drop":
                    self._counts["dropped_stale"] += 1
                    if not episode.external:  # external episodes never held a rule slot
                        self._rule.discard_accepted()
                        freed = True
                    continue
                if excess > 0:
                    if episode.episode_id not in self._downweighted:
                        self._downweighted.add(episode.episode_id)
                        self._counts["downweighted_stale"] += 1
                    for output in episode.outputs:
                        output.extra["sample_weight"] = self.stale_weight_decay**excess
                kept.append(episode)
            if any(e.ok for e in kept):
                self._complete[group_id] = kept
            else:
                del self._complete[group_id]
                self._dropped_group_ids.append(group_id)
                self._counts["dropped_groups"] += 1
                self._counts["dropped_group_episodes"] += len(kept)
        return freed


Session = tuple[str, list[AgentLoopOutput], float | None, str | None]
"""A finished gateway session: session id, samples, reward, group id."""


class SessionInbox:
    """The gateway's inbox: finished sessions held until the driver takes them.

    Runs as a small named Ray actor (the name the gateway's queue sink looks up), since the
    gateway, in a Serve replica, cannot call the driver's ``TrajectoryQueue``. It decides
    nothing: ``put_session`` takes every session (returns ``accepted``: delivered), and
    the queue accepts or refuses it when ``drain_inbox`` hands it over, counting refusals
    in its metrics.

    Sessions are numbered in arrival order. ``take(start)`` forgets those before
    ``start`` (the caller has them) and returns the rest, so a reply lost on its way is
    sent again by the next call and no session is delivered twice.
    """

    def __init__(self) -> None:
        self._sessions: list[Session] = []
        self._first = 0  # the number of self._sessions[0]
        self._arrived = asyncio.Event()

    async def put_session(
        self,
        session_id: str,
        samples: list[AgentLoopOutput],
        reward: float | None,
        group_id: str | None = None,
    ) -> str:
        """Hold a finished session (what the gateway's queue sink sends)."""
        self._sessions.append((session_id, samples, reward, group_id))
        self._arrived.set()
        return "accepted"

    async def take(self, start: int) -> list[Session]:
        """The sessions numbered ``start`` on; waits until there is at least one. Those
        before ``start`` are forgotten."""
        if not self._first <= start <= self._first + len(self._sessions):
            raise ValueError(
                f"take({start}): the inbox holds sessions {self._first} to "
                f"{self._first + len(self._sessions) - 1}"
            )
        del self._sessions[: start - self._first]
        self._first = start
        while not self._sessions:
            self._arrived.clear()
            await self._arrived.wait()
        return list(self._sessions)


async def drain_inbox(
    take: Callable[[int], Awaitable[list[Session]]], queue: TrajectoryQueue
) -> None:
    """Move finished sessions from an inbox into ``queue`` as they arrive, until cancelled.

    ``take`` is ``SessionInbox.take`` (``inbox.take.remote`` for the actor)."""
    start = 0
    while True:
        sessions = await take(start)
        for session_id, samples, reward, group_id in sessions:
            status = await queue.put_session(session_id, samples, reward, group_id)
            if status != "accepted":
                logger.warning("the trajectory queue refused session %s (%s)", session_id, status)
        start += len(sessions)
