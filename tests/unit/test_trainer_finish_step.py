"""The end of a training step: its metrics line is written before its checkpoint, and a
completed run's last checkpoint after its loop has stopped.

Found by the driver-kill fault (docs/benchmarks.md#fault-injection): a driver killed
after the checkpoint but before the line resumed past a step that ``metrics.jsonl`` never
recorded. Written first, a kill in between costs a step trained and logged again on
resume, whose later line wins, and never a missing one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.trainer.trainer import Trainer


class _Recorder:
    """Stands in for the metrics logger and the checkpoint: records the order of calls."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def log(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        self.events.append(("metrics", step))
        return metrics


def _trainer(tmp_path: Path, save_every: int, total_steps: int = 20) -> tuple[Trainer, _Recorder]:
    cfg = load_config(
        None,
        [
            f"trainer.run_dir={tmp_path}",
            f"trainer.save_every={save_every}",
            f"trainer.total_steps={total_steps}",
        ],
    )
    trainer = Trainer(cfg)
    recorder = _Recorder()
    trainer.processes.tracker = recorder

    async def no_validation() -> None:
        return None

    def save_checkpoint() -> Path:
        recorder.events.append(("checkpoint", trainer.step))
        return tmp_path

    trainer._maybe_validate = no_validation
    trainer.save_checkpoint = save_checkpoint
    return trainer, recorder


def test_a_step_is_logged_before_its_checkpoint(tmp_path: Path) -> None:
    trainer, recorder = _trainer(tmp_path, save_every=1)
    for _ in range(2):
        asyncio.run(trainer._finish_step({"actor/loss": 0.5}))
    assert recorder.events == [
        ("metrics", 1),
        ("checkpoint", 1),
        ("metrics", 2),
        ("checkpoint", 2),
    ]


def test_steps_between_checkpoints_are_logged_without_one(tmp_path: Path) -> None:
    trainer, recorder = _trainer(tmp_path, save_every=2)
    logged = [asyncio.run(trainer._finish_step({"actor/loss": 0.5})) for _ in range(2)]
    assert recorder.events == [("metrics", 1), ("metrics", 2), ("checkpoint", 2)]
    assert all(metrics["trainer/version"] == trainer.version for metrics in logged)


class _Client:
    """Stands in for the rollout client's data path, which ``fit`` holds open."""

    async def __aenter__(self) -> _Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def _fit_two_steps(tmp_path: Path, save_every: int, total_steps: int) -> list[tuple[str, int]]:
    """``fit`` over a loop of two steps that records when it stops: the recorded events."""
    trainer, recorder = _trainer(tmp_path, save_every=save_every, total_steps=total_steps)
    trainer.processes.client = _Client()

    async def two_steps() -> list[dict[str, float]]:
        history = [await trainer._finish_step({"actor/loss": 0.5}) for _ in range(2)]
        recorder.events.append(("loop stopped", trainer.step))
        return history

    trainer.train_steps = two_steps
    asyncio.run(trainer.fit())
    return recorder.events


def _checkpoints(events: list[tuple[str, int]]) -> list[int]:
    return [step for event, step in events if event == "checkpoint"]


@pytest.mark.parametrize(("save_every", "saved"), [(1, [1, 2]), (2, [2]), (3, [2]), (0, [2])])
def test_a_run_ends_with_one_checkpoint_of_its_last_step(tmp_path: Path, save_every, saved):
    """A loop that stops before ``trainer.total_steps`` (20)."""
    assert _checkpoints(_fit_two_steps(tmp_path, save_every, total_steps=20)) == saved


@pytest.mark.parametrize(("save_every", "saved"), [(1, [1, 2]), (2, [2]), (3, [2]), (0, [2])])
def test_a_completed_run_writes_its_last_checkpoint_after_the_loop_stops(
    tmp_path: Path, save_every, saved
):
    """The async trainer's producer keeps handing out rows until the loop's ``finally``
    stops it: a last checkpoint written inside the loop could precede some of those
    rows in the audit, which then read the completed run as having lost them (found by
    the FSDP-rank node loss of bench/fault_tolerance.py, 2026-12-02)."""
    events = _fit_two_steps(tmp_path, save_every, total_steps=2)
    assert _checkpoints(events) == saved
    assert events[-2:] == [("loop stopped", 2), ("checkpoint", 2)]
