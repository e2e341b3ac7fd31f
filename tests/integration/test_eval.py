"""``agentrl eval`` on a real checkpoint: same validation score as the trainer's own.

Trains the toy task for 2 steps with greedy validation after each, then evaluates the
final checkpoint in a fresh Trainer (new servers, new FSDP workers) and compares; the
run's curves are plotted at the end.
"""

from __future__ import annotations

import json

import pytest
import ray
from ray import serve
from toy_task import _write_rows, toy_config

from agentrl.evaluate import evaluate
from agentrl.plot import plot_run
from agentrl.trainer.trainer import Trainer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def ray_session():
    yield
    serve.shutdown()
    ray.shutdown()


async def test_eval_of_the_last_checkpoint_reproduces_the_last_validation(
    tiny_checkpoint, tmp_path_factory, ray_session
):
    tmp = tmp_path_factory.mktemp("eval")
    _write_rows(tmp / "val.jsonl", 6)
    cfg = toy_config(
        tiny_checkpoint,
        tmp,
        steps=2,
        extra=[
            f"data.val_files=[{tmp / 'val.jsonl'}]",
            "trainer.val_every=1",
            "trainer.val_temperature=0.0",
            "server.http_port=18772",
        ],
    )
    trainer = Trainer(cfg)
    trainer.setup()
    try:
        await trainer.fit()
    finally:
        trainer.shutdown()
    run = tmp / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last_val = [r for r in records if "val/score/mean" in r][-1]
    assert last_val["step"] == 2

    result = await _in_thread(evaluate, cfg, run / "checkpoints" / "step_2")

    assert result["step"] == 2 and result["version"] == 2
    assert result["metrics"]["val/score/mean"] == pytest.approx(
        last_val["val/score/mean"], abs=0.02
    )
    assert json.loads((run / "eval.json").read_text())["checkpoint"].endswith("step_2")
    report = plot_run(run)
    assert {"reward", "overview"} <= set(report.written)


async def _in_thread(fn, *args):
    """``evaluate`` runs its own event loop (asyncio.run): keep it off this test's loop."""
    import asyncio

    return await asyncio.to_thread(fn, *args)
