"""DAPO dynamic sampling in the trainers: which groups a step trains on, and when the
synchronous trainer generates more.

Generation and reward are scripted (each generated "row" is a list of scores, one per
sample); the trainers' own ``informative`` step and the DynamicSampler are real.
"""

from __future__ import annotations

import itertools
import logging

import pytest

from agentrl.config import load_config
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.trainer import trainer as trainer_module
from agentrl.trainer.async_trainer import AsyncBatches, AsyncTrainer
from agentrl.trainer.batch import Sample
from agentrl.trainer.batches import StepBatch
from agentrl.trainer.trainer import Trainer

pytestmark = pytest.mark.asyncio

_group_counter = itertools.count()


def group(scores: list[float]) -> list[Sample]:
    """One prompt's samples with these scores."""
    group_id = f"g{next(_group_counter)}"
    output = AgentLoopOutput([1], [2], [1], [0.0], [0])
    return [Sample(output=output, group_id=group_id, score=s) for s in scores]


class ScriptedBatches:
    """A regenerating batch source whose every batch is the next scripted list of
    "episodes" (each a list of scores: one group once scored)."""

    regenerates = True

    def __init__(self, batches: list[list[list[float]]]) -> None:
        self.batches = iter(batches)
        self.generated = 0

    async def more(self) -> StepBatch:
        self.generated += 1
        return StepBatch(next(self.batches), {}, [])


class ScriptedTrainer(Trainer):
    """A trainer whose generation returns the next scripted batch of groups."""

    def __init__(self, batches: list[list[list[float]]], overrides: list[str]) -> None:
        super().__init__(load_config(None, overrides))
        self.batches = ScriptedBatches(batches)
        self.tokenizer = None

    @property
    def generated(self) -> int:
        return self.batches.generated


def step_batch() -> StepBatch:
    return StepBatch([], {}, [])


@pytest.fixture(autouse=True)
def scripted_scores(monkeypatch):
    """Reward: each scripted row (a list of scores) becomes one group of samples."""

    async def score_episodes(episodes, row_of, rewards, tokenizer):
        return [s for scores in episodes for s in group(scores)], {}

    monkeypatch.setattr(trainer_module, "score_episodes", score_episodes)


def overrides(batch_size: int, max_batches: int) -> list[str]:
    return [
        f"data.train_batch_size={batch_size}",
        "algorithm.dynamic_sampling.enable=true",
        f"algorithm.dynamic_sampling.max_num_gen_batches={max_batches}",
    ]


async def test_sync_trainer_generates_until_the_batch_is_full_and_drops_surplus_groups():
    first = group([1, 1]) + group([0, 1]) + group([0, 0])
    trainer = ScriptedTrainer([[[0, 0], [1, 0], [1, 1], [0, 1], [1, 0]]], overrides(3, 5))
    metrics: dict[str, float] = {}
    kept = await trainer.informative(first, metrics, step_batch())
    # Group 2 of the first batch, then the first two informative groups of the second.
    assert [s.score for s in kept] == [0, 1, 1, 0, 0, 1]
    assert len({s.group_id for s in kept}) == 3
    assert trainer.generated == 1
    assert metrics["dapo/num_gen_batches"] == 2
    assert metrics["dapo/num_groups_filtered"] == 4
    assert metrics["dapo/num_groups_surplus"] == 1


async def test_sync_trainer_stops_at_the_generation_budget_with_a_warning(caplog):
    first = group([1, 1]) + group([0, 1])
    trainer = ScriptedTrainer([[[0, 0]], [[1, 1]], [[0, 1]]], overrides(2, 3))
    metrics: dict[str, float] = {}
    with caplog.at_level(logging.WARNING, logger="agentrl.trainer.trainer"):
        kept = await trainer.informative(first, metrics, step_batch())
    # Budget 3: the first batch and two more, the third scripted batch never generated.
    assert trainer.generated == 2
    assert [s.score for s in kept] == [0, 1]
    assert metrics["dapo/num_groups_kept"] == 1
    assert "kept 1/2 groups" in caplog.text and "after 3 generation batches" in caplog.text


async def test_sync_trainer_does_not_generate_when_the_first_batch_is_enough():
    trainer = ScriptedTrainer([], overrides(1, 2))
    kept = await trainer.informative(group([0, 1]) + group([1, 0]), {}, step_batch())
    assert trainer.generated == 0
    assert [s.score for s in kept] == [0, 1]


async def test_async_trainer_filters_flat_groups_without_generating():
    cfg = load_config(None, overrides(4, 1))
    trainer = AsyncTrainer(cfg)
    trainer.batches = AsyncBatches(cfg, None, trainer.ledger, None, version=0)
    samples = group([1, 1]) + group([0, 1]) + group([0.5, 0.5]) + group([1])
    metrics: dict[str, float] = {}
    kept = await trainer.informative(samples, metrics, step_batch())
    # The single-sample group is kept: its raw score is its advantage.
    assert [s.score for s in kept] == [0, 1, 1]
    assert metrics["dapo/num_groups_filtered"] == 2
    assert metrics["dapo/num_gen_batches"] == 1
    assert await trainer.informative([], {}, step_batch()) == []
