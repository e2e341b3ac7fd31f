"""The async trainer stops its producer once the last step's batch is in hand.

Before, the producer ran until the loop's ``finally``: during the last update and the
final validation it generated up to a batch of episodes that no step would train, on
the cores that update and validation share. The producer and the queue are
stand-ins here; the fit loop and the batch source that stop the producer are real.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.config import load_config
from agentrl.trainer.async_trainer import AsyncBatches, AsyncTrainer


def _batch() -> SimpleNamespace:
    return SimpleNamespace(metrics={}, episodes=[], groups=[], dropped_group_ids=[])


async def nothing(*args, **kwargs) -> None:
    return None


def _run(tmp_path: Path, total_steps: int) -> list[tuple[str, int]]:
    """Runs ``AsyncTrainer.train_steps`` for ``total_steps``: the recorded events."""
    cfg = load_config(None, [f"trainer.run_dir={tmp_path}", f"trainer.total_steps={total_steps}"])
    trainer = AsyncTrainer(cfg)
    trainer.batches = batches = AsyncBatches(cfg, None, trainer.ledger, nothing, version=0)
    events: list[tuple[str, int]] = []

    async def get_batch(*args, **kwargs) -> SimpleNamespace:
        return _batch()

    queue = SimpleNamespace(get_batch=get_batch, finish_step=nothing, close=nothing, closed=False)

    async def produce() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            events.append(("producer stopped", trainer.step))

    async def train_on(*args, **kwargs) -> dict[str, float]:
        events.append(("update", trainer.step + 1))
        return {}

    async def finish_step(metrics: dict[str, float]) -> dict[str, float]:
        trainer.step += 1
        return metrics

    trainer.serve_restored_weights = nothing
    trainer._maybe_validate = nothing
    batches.queue = queue
    batches._produce = produce
    trainer.train_on = train_on
    trainer._finish_step = finish_step
    asyncio.run(trainer.train_steps())
    return events


@pytest.mark.parametrize("total_steps", [1, 3])
def test_the_producer_stops_before_the_last_update(tmp_path: Path, total_steps: int) -> None:
    events = _run(tmp_path, total_steps)
    updates = [("update", step) for step in range(1, total_steps + 1)]
    assert events == [*updates[:-1], ("producer stopped", total_steps - 1), updates[-1]]
