"""Where a trainer's batches come from: the one thing synchronous and asynchronous
training do differently.

A ``BatchSource`` gives each step a ``StepBatch`` of finished episodes. ``SyncBatches``
generates it when the step asks, with the weights the step starts from; ``AsyncBatches``
(``agentrl.trainer.async_trainer``) takes it from a queue that generation fills ahead of
training. The fit loop (``Trainer.train_steps``) is the same for both.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.config import AgentRLConfig
from agentrl.rollout.episode import EpisodeResult
from agentrl.rollout.manager import AgentLoopManager
from agentrl.trainer.ledger import RunLedger

KeepReplicasCurrent = Callable[[], Awaitable[None]]
"""Pushes the current weights to replicas that serve older ones (restarted ones)."""


@dataclass
class StepBatch:
    """The episodes of one training step.

    ``group_ids``: the groups the step settles (its rows are done after it, trained or
    not); ``dropped_group_ids``: groups dropped before they reached any batch."""

    episodes: list[EpisodeResult]
    rows_by_group: dict[str, dict[str, Any]]
    group_ids: list[str]
    dropped_group_ids: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def extend(self, more: StepBatch) -> None:
        """Add ``more`` (dynamic sampling's extra groups) to this step."""
        self.episodes += more.episodes
        self.rows_by_group |= more.rows_by_group
        self.group_ids += more.group_ids
        self.dropped_group_ids += more.dropped_group_ids


class BatchSource:
    """What the fit loop needs of a source of batches; a subclass gives ``next_batch``
    and ``step_done``, and starts and stops what it runs in ``start`` and ``close``."""

    regenerates = False
    """Whether ``more`` can generate groups for the current step (dynamic sampling)."""

    def __init__(
        self,
        cfg: AgentRLConfig,
        manager: AgentLoopManager,
        ledger: RunLedger,
        keep_replicas_current: KeepReplicasCurrent,
    ) -> None:
        self.cfg = cfg
        self.manager = manager
        self.ledger = ledger
        self.keep_replicas_current = keep_replicas_current
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` when the config asks what this source cannot give."""

    async def start(self, version: int) -> None:
        """Before the first batch of a ``fit``, with the weights of ``version`` served
        (the async source starts generating here)."""

    async def next_batch(self, step: int, last: bool) -> StepBatch | None:
        """The batch of ``step`` (``last``: the run's last step); None: no more batches."""
        raise NotImplementedError

    async def more(self) -> StepBatch | None:
        """More groups for the current step, or None when the source makes none."""
        return None

    async def step_done(self, version: int) -> dict[str, float]:
        """The step ended and the replicas serve ``version``; returns its metrics."""
        raise NotImplementedError

    async def close(self) -> None:
        """Stop whatever the source runs (called once, after the last step or a failure)."""


class SyncBatches(BatchSource):
    """Each step generates ``data.train_batch_size`` groups of ``rollout.n`` episodes with
    the weights it starts from, and waits for all of them."""

    regenerates = True
    _gen_s = 0.0

    def check(self) -> None:
        if self.ledger.feed is None:
            raise ValueError(
                "trainer.agent_loop_episodes=false (gateway sessions only) needs the async "
                "trainer (`agentrl train` without --sync)"
            )
        if self.cfg.trainer.oversample_groups or self.cfg.trainer.min_group_size is not None:
            raise ValueError(
                "trainer.oversample_groups and trainer.min_group_size (straggler options) "
                "need the async trainer: run `agentrl train` without --sync, with "
                "trainer.max_staleness=0 for synchronous steps"
            )

    async def next_batch(self, step: int, last: bool) -> StepBatch:
        await self.keep_replicas_current()
        return await self.more()

    async def more(self) -> StepBatch:
        """One batch of new groups, generated now."""
        started = time.perf_counter()
        sampling = self.manager.default_sampling()
        groups = [
            self.ledger.next_group(self.cfg.rollout.n, sampling)
            for _ in range(self.cfg.data.train_batch_size)
        ]
        requests = [request for group in groups for request in group]
        episodes = [e async for e in self.manager.stream_requests(requests)]
        self._gen_s += time.perf_counter() - started
        return StepBatch(
            episodes,
            {group[0].group_id: group[0].row for group in groups},
            [group[0].group_id for group in groups],
        )

    async def step_done(self, version: int) -> dict[str, float]:
        gen_s, self._gen_s = self._gen_s, 0.0
        return {"timing/gen": gen_s}
