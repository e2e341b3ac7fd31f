"""What happened to the episodes and rows of a run under a fault, as the fault tests
record it (the ``fault`` property) for ``bench/fault_tolerance.py``."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from code_task import code_tool_overrides

from agentrl.trainer.async_trainer import AsyncTrainer
from agentrl.trainer.audit import read_row_audit

MULTI_TURN = "rollout.agent_name=agentrl.testing.loops:MultiTurnChatLoop"
FULL_RUNS_ENV = "AGENTRL_FAULT_RUNS"
FULL_RUNS = os.environ.get(FULL_RUNS_ENV) == "full"
"""Set by ``bench/fault_tolerance.py``: every fault's run has 2 rollout replicas and
multi-turn tool loops (one real sandbox call per episode), as the fault suite specifies.
The default test suite runs the cheaper shape (1 replica where a fault does not need 2,
the loop the test names) for its time budget."""
REPLICAS = ["server.num_replicas=2"] if FULL_RUNS else []
"""Overrides for a fault run of the sandbox fault (its own tool loop and rows)."""
QUICK_ENGINE = [] if FULL_RUNS else ["server.engine.backend=hf"]
"""For a fault the rollout engine plays no part in (resume, agent-loop worker): the
default suite runs it on the HF engine, which starts in seconds; the bench on vLLM-CPU."""


async def when_step(trainer: AsyncTrainer, fit: asyncio.Task, step: int) -> None:
    """Waits until ``trainer`` reached ``step``; fails if its ``fit`` ended before."""
    while trainer.step < step and not fit.done():
        await asyncio.sleep(0.05)
    assert not fit.done(), fit


def fault_injected(record_property) -> float:
    """Records, just before a test injects its fault, that it does (the
    ``fault_injected`` property: the bench tells a test that failed before its fault from
    a fault not survived), and returns the time (``time.monotonic()``)."""
    record_property("fault_injected", "true")
    return time.monotonic()


def run_shape(tmp: Path) -> list[str]:
    """Overrides, after a test's own, that give a fault run the bench's shape: 2 replicas
    and ``CodeToolLoop`` on code rows written under ``tmp`` (nothing in the default suite)."""
    return [*REPLICAS, *code_tool_overrides(tmp)] if FULL_RUNS else []


@dataclass
class Ledger:
    """What happened to the episodes and rows of one fault's run(s)."""

    fault: str
    completed: bool = False
    error: str | None = None
    resumed: bool = False
    seconds_to_recover_or_stop: float | None = None
    steps: int = 0
    episodes_generated: int = 0
    episodes_trained: int = 0
    episodes_failed: int = 0
    episodes_retried: int = 0
    episodes_dropped_stale: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    seconds_to_first_trained_step: float | None = None
    """From the fault to the end of the first actor update after it (the resumed run's,
    where the run stopped): how long training stood still."""
    optimizer: dict[str, int] | None = None
    """The independent count (``OptimizerLedger.counts``), where the test keeps one."""
    audit: dict[str, int] | None = None
    """The run directory's audit, read after the run (``read_row_audit``)."""

    def keep(self, optimizer: OptimizerLedger, last: AsyncTrainer, fault_at: float) -> None:
        """Take the independent count and the time to the first update after the fault
        (``fault_at``, ``time.monotonic()``) from ``optimizer``, and the run directory's
        audit."""
        self.optimizer = optimizer.counts(last)
        self.seconds_to_first_trained_step = optimizer.seconds_to_update_after(fault_at)
        self.read_audit(last.run_dir)

    def read_audit(self, run_dir: Path) -> None:
        """The run directory's row audit, replayed after the run (every process gone)."""
        self.audit = read_row_audit(run_dir).as_dict()

    def add_run(self, history: list[dict[str, float]]) -> None:
        """One ``fit`` call's logged steps (its queue counters are cumulative)."""
        self.steps += len(history)
        self.episodes_trained += int(sum(h["trainer/episodes"] for h in history))
        if history:
            last = history[-1]
            self.episodes_generated += int(last.get("async/episodes_in", 0))
            self.episodes_failed += int(last.get("async/failed_episodes", 0))
            self.episodes_retried += int(last.get("async/retried_episodes", 0))
            self.episodes_dropped_stale += int(last.get("async/dropped_stale", 0))

    def count_rows(self, trainer: AsyncTrainer, resumed_from: dict | None = None) -> None:
        """Every row the run handed out is done once or pending in its last state; rows
        done before the checkpoint it ``resumed_from`` (a feed state) count as done."""
        before: set[int] = set()
        if resumed_from is not None:
            before = set(range(resumed_from["next_index"])) - _pending(resumed_from)
        done = trainer.ledger.feed.done_indices
        final = trainer.ledger.feed.state_dict()
        self.rows_duplicated += len(done) - len(set(done)) + len(before & set(done))
        self.rows_lost += final["next_index"] - len(before | set(done) | _pending(final))

    def record_completed_run(
        self, history: list[dict[str, float]], steps: int, trainer: AsyncTrainer, record_property
    ) -> None:
        """One uninterrupted ``fit`` of ``steps`` steps: its counts, then ``record``."""
        self.add_run(history)
        self.completed = len(history) == steps
        self.count_rows(trainer)
        self.record(record_property)

    def record(self, record_property) -> None:
        record_property("fault", json.dumps(asdict(self)))
        assert self.rows_lost == 0 and self.rows_duplicated == 0, self
        if self.optimizer is not None:
            assert self.optimizer["rows_lost"] == 0, self.optimizer
            assert self.optimizer["rows_trained_twice"] == 0, self.optimizer
        if self.audit is not None:
            assert self.audit["rows_lost"] == 0, self.audit
            assert self.audit["rows_trained_twice"] == 0, self.audit
            assert self.audit["episodes_trained_twice"] == 0, self.audit


def _pending(state: dict) -> set[int]:
    return {index for index, _ in state["pending"]}


@dataclass
class OptimizerLedger:
    """A count kept apart from the trainer's own bookkeeping, at its boundaries: the rows
    the data feed hands out, the row of each group the producer starts, the groups the
    queue reports dropped, and the rows whose episodes an actor update (the optimizer)
    ran on. Attach it to every trainer of a fault (the first run and the resumed one)."""

    handed_out: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    """One entry per (row, optimizer step): a row twice here was trained twice."""
    dropped: set[int] = field(default_factory=set)
    updated_at: list[float] = field(default_factory=list)
    """When each actor update ended (``time.monotonic()``)."""
    _row_of_group: dict[str, int] = field(default_factory=dict)

    def attach(self, trainer: AsyncTrainer) -> None:
        feed, actor, batches = trainer.ledger.feed, trainer.processes.actor, trainer.batches
        next_row, run_one, next_batch = feed.next_row, batches.run_one, batches.next_batch
        train_on, update_actor = trainer.train_on, actor.update_actor
        step_rows: set[int] = set()

        def recording_next_row() -> tuple[int, dict]:
            index, row = next_row()
            self.handed_out.append(index)
            return index, row

        async def recording_run_one(request: Any) -> None:
            self._row_of_group[request.group_id] = request.row_index
            await run_one(request)

        async def recording_next_batch(*args: Any, **kwargs: Any) -> Any:
            batch = await next_batch(*args, **kwargs)
            if batch is not None:
                self.dropped.update(self._row_of_group[g] for g in batch.dropped_group_ids)
            return batch

        async def recording_train_on(batch: Any, *args: Any) -> dict[str, float]:
            step_rows.clear()
            step_rows.update(e.row_index for e in batch.episodes)
            return await train_on(batch, *args)

        def recording_update_actor(*args: Any, **kwargs: Any) -> dict[str, float]:
            metrics = update_actor(*args, **kwargs)
            self.trained.extend(sorted(step_rows))
            self.updated_at.append(time.monotonic())
            return metrics

        feed.next_row, batches.run_one = recording_next_row, recording_run_one
        batches.next_batch, trainer.train_on = recording_next_batch, recording_train_on
        actor.update_actor = recording_update_actor

    def seconds_to_update_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the end of the first actor update after it (None:
        no update ended after it)."""
        return next((t - moment for t in self.updated_at if t > moment), None)

    def counts(self, last: AsyncTrainer) -> dict[str, int]:
        """Rows handed out, trained, trained twice, dropped by the queue, handed out and
        pending in the ``last`` run's saved state (handed out again by a resume), and lost:
        handed out and none of those. (The saved state's pending rows also hold rows read
        from the data but not handed out yet; those are not counted.)"""
        handed, trained = set(self.handed_out), set(self.trained)
        pending = _pending(last.ledger.feed.state_dict()) & handed
        lost = handed - trained - self.dropped - pending
        return {
            "rows_handed_out": len(handed),
            "rows_trained": len(trained),
            "rows_trained_twice": len(self.trained) - len(trained),
            "rows_dropped": len(self.dropped - trained),
            "rows_pending": len(pending - trained),
            "rows_lost": len(lost),
        }
