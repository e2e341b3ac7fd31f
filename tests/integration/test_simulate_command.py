"""``agentrl simulate`` end to end: a user's config, loop and tool against the simulated
engine and trainer, then the split of the GPUs that trains the most tokens per second."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml
from toy_task import TOY_REWARD, toy_row

from agentrl.testing.serving import worker_port

pytestmark = pytest.mark.integration

COMMAND = [sys.executable, "-m", "agentrl.cli", "simulate"]
TOOL_S = 0.2
"""Wall seconds the loop's tool takes: real time, so modeled seconds as they are."""

LOOP = f'''
import asyncio

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.registry import register_agent_loop


async def lookup(query: str) -> str:
    """The user's tool: a slow lookup."""
    await asyncio.sleep({TOOL_S})
    return "result for " + query


@register_agent_loop("planner_tool_loop")
class ToolLoop(AgentLoopBase):
    """A model turn, the tool, a second model turn."""

    async def run(self, sample, sampling):
        conv = await self.conversation(sample["prompt"])
        await conv.generate(sampling)
        answer = await lookup("x")
        await conv.add_messages([{{"role": "tool", "content": answer}}])
        await conv.generate(sampling)
        return conv.build()
'''


def test_simulate_records_the_users_loop_and_picks_a_split(tiny_checkpoint, tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({**toy_row(f"Task {i}."), "agent_name": "planner_tool_loop"}) + "\n"
            for i in range(16)
        )
    )
    config = {
        "model": {"path": str(tiny_checkpoint)},
        "plugins": [str(tmp_path / "loop.py")],
        "data": {"train_files": [str(rows)], "train_batch_size": 2, "max_prompt_length": 64},
        "server": {
            "num_replicas": 1,
            "http_port": worker_port(18775),
            "engine": {
                "max_model_len": 1024,
                "sim": {"response_length_median": 100, "response_length_p99": 400},
            },
        },
        "rollout": {"n": 2, "max_response_length": 900, "num_workers": 1},
        "reward": {"reward_fn_path": str(TOY_REWARD)},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"max_staleness": 1},
        "ray": {"num_cpus": 2},
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "plan.json"
    start = time.perf_counter()
    run = subprocess.run(
        [*COMMAND, str(path), "--profile", "qwen2.5-7b-h100", "--gpus", "6", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.perf_counter() - start
    assert run.returncode == 0, run.stderr[-3000:]
    plan = json.loads(out.read_text())

    # The user's loop ran: two model turns, and its tool's real seconds were recorded.
    workload = plan["workload"]
    assert workload["episodes"] >= 2 * 2 * 2  # steps x prompts x samples
    assert workload["turns_per_episode"] == 2
    assert workload["env_s_per_episode"] >= TOOL_S
    # Every split of 6 GPUs was tried (7B: a replica takes 1 GPU, training at least 2 for
    # its 122 GB of model states), and the best is the one of most trained tokens/s.
    assert (plan["gpus_per_replica"], plan["min_train_gpus"]) == (1, 2)
    splits = [(c["split"]["replicas"], c["split"]["train_gpus"]) for c in plan["candidates"]]
    assert splits == [(r, 6 - r) for r in range(1, 5)]
    best = max(plan["candidates"], key=lambda c: c["trained_tokens_per_s"])
    assert plan["best"] == best
    for candidate in plan["candidates"]:
        assert candidate["step_s"] > 0
        assert 0 < candidate["pool_busy"] <= 1
        assert 0 < candidate["trainer_busy"] <= 1
    # The table is printed, not per-request lines.
    assert "tokens/s" in run.stdout and "Best split" in run.stdout
    assert wall < 60, f"agentrl simulate took {wall:.0f} s"
