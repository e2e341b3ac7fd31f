"""`agentrl rollout` and `plugins:` on real Ray workers and a real (HF) rollout server.

One Ray start for the module. The docs' files and commands (docs/guides/agent-loops.md) run as
written; a loop registered in a user module outside the package runs by its name on
fresh agent-loop workers, scored by a scorer that same module registers, in a reward
process pool.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import json
import os
import runpy
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import serve

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.rollout import rollout
from agentrl.server.launch import init_ray
from tests.unit.test_docs_examples import agentrl_commands, blocks, write_files

pytestmark = pytest.mark.integration

GUIDE = "guides/agent-loops.md"
QUESTIONS = ("What is 2 + 2?", "What is 3 * 5?")

USER_MODULE = """
from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.registry import register_agent_loop
from agentrl.core.trajectory import TrajectoryBuilder
from agentrl.reward.builtin import register_scorer


@register_agent_loop("guess_number")
class GuessNumber(AgentLoopBase):
    async def run(self, sample, sampling):
        trajectory = TrajectoryBuilder(await self.apply_chat_template(sample["prompt"]))
        trajectory.add_model_turn(await self.generate(trajectory.ids, sampling))
        return trajectory.build(metrics={"guesses": 1})


@register_scorer("guess")
def guess_score(data_source, solution_str, ground_truth, extra_info):
    import os
    return {"score": 0.75, "scorer_pid": os.getpid(), "turns": extra_info["num_turns"]}
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_checkpoint):
    """The guide's files in a scratch folder (the working directory), a user package
    folder on the workers' PYTHONPATH, and one Ray instance for the module."""
    folder = tmp_path_factory.mktemp("guide")
    user_pkgs = tmp_path_factory.mktemp("user_pkgs")
    (user_pkgs / "guess_loops.py").write_text(textwrap.dedent(USER_MODULE))
    saved = os.getcwd(), list(sys.path), os.environ.get("PYTHONPATH")
    os.chdir(folder)
    sys.path[:0] = [str(folder), str(user_pkgs)]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(user_pkgs), saved[2]]))
    write_files(GUIDE, folder)
    if ray.is_initialized():  # an earlier module's Ray: its workers lack this PYTHONPATH
        serve.shutdown()
        ray.shutdown()
    init_ray(load_config(None, ["ray.num_cpus=2"]).ray)  # workers inherit PYTHONPATH
    try:
        yield folder
    finally:
        serve.shutdown()
        ray.shutdown()
        os.chdir(saved[0])
        sys.path[:] = saved[1]
        if saved[2] is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved[2]


def _check_records(records: list[dict[str, Any]], agent_name: str) -> None:
    for record in records:
        assert record["error"] is None, record["error"]
        assert record["agent_name"] == agent_name
        n = len(record["response_ids"])
        assert n > 0 and record["prompt_ids"]
        assert len(record["response_mask"]) == len(record["response_logprobs"]) == n
        assert len(record["response_versions"]) == n
        model = [
            v
            for v, m in zip(record["response_versions"], record["response_mask"], strict=True)
            if m
        ]
        assert model and set(model) == {0}
        assert record["messages"][1]["role"] == "assistant"
        assert isinstance(record["reward"], float)


def test_the_guide_rolls_out_its_plugin_loop_from_the_cli_and_python(workspace):
    _write_questions(workspace)
    (argv,) = [a for a in agentrl_commands(GUIDE) if a[0] == "rollout"]
    assert main(argv) == 0  # as written: `agentrl rollout rollout.yaml --split val ...`
    lines = (workspace / "trajectories.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 2 * 2  # --limit 2 rows, rollout.n 2
    _check_records(records, "retry_with_feedback")
    assert {r["row_index"] for r in records} == {0, 1}
    assert len({r["group_id"] for r in records}) == 2
    for record in records:
        first = record["messages"][0]
        assert first["role"] == "user" and first["content"] in QUESTIONS
        attempts = record["metrics"]["attempts"]
        assert 1 <= attempts <= 3 and record["num_turns"] == 2 * attempts - 1
        envs = [m for m in record["messages"] if m["role"] == "env"]
        assert len(envs) == attempts - 1
        # The feedback reached the model; an env turn that ends the response may be cut
        # short by the response budget (``trajectory.build`` truncates the tail).
        answered = [m for m in record["messages"][:-1] if m["role"] == "env"]
        assert all("Not quite." in m["content"] for m in answered)
        assert 0 in record["response_mask"] or attempts == 1
        assert record["reward_info"]["acc"] in (0.0, 1.0)  # the built-in math scorer

    (workspace / "trajectories.jsonl").unlink()
    namespace = runpy.run_path(str(workspace / "run_rollout.py"))  # `python run_rollout.py`
    result = namespace["result"]
    assert result.failed == 0 and len(result.trajectories) == 4
    assert result.metrics["rollout/episodes"] == 4.0
    assert 1.0 <= result.metrics["rollout/attempts"] <= 3.0
    assert len((workspace / "trajectories.jsonl").read_text().splitlines()) == 4
    _check_records(result.trajectories, "retry_with_feedback")


def _write_questions(workspace: Path) -> None:
    """Run the guide's block that writes questions.jsonl, as written."""
    (code,) = [
        b.code for b in blocks(GUIDE) if b.lang == "python" and not b.file and "questions" in b.code
    ]
    exec(compile(code, f"{GUIDE}[questions]", "exec"), {})
    assert len((workspace / "questions.jsonl").read_text().splitlines()) == 3


def test_a_registered_loop_from_a_user_module_runs_on_fresh_workers(workspace):
    overrides = [
        "model.path=builtin:tiny-qwen2",
        "server.num_replicas=1",
        "server.engine.backend=hf",
        "rollout.num_workers=2",
        "rollout.n=2",
        "rollout.max_response_length=16",
        "reward.executor=process",
        "reward.num_workers=1",
    ]
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Guess a number ({i})."}],
            "data_source": "guess",
            "agent_name": "guess_number",
        }
        for i in range(3)
    ]
    # Without the setting the workers do not know the name (the failure)...
    before = rollout(load_config(None, overrides), rows=rows[:1], progress=False)
    assert before.failed == 2
    assert "unknown agent loop 'guess_number'" in before.trajectories[0]["error"]
    assert "under `plugins:`" in before.trajectories[0]["error"]

    # ...with it, every fresh worker imports the module and runs the loop by name.
    cfg = load_config(None, ["plugins=[guess_loops]", *overrides])
    result = rollout(cfg, workspace / "guess.jsonl", rows=rows, progress=False)
    assert result.failed == 0 and len(result.trajectories) == 6
    _check_records(result.trajectories, "guess_number")
    for record in result.trajectories:
        assert record["metrics"]["guesses"] == 1
        assert record["reward"] == 0.75  # the plugin's scorer, in the reward process pool
        assert record["reward_info"]["scorer_pid"] != os.getpid()
        assert record["reward_info"]["turns"] == 1
    assert result.metrics["reward/score/mean"] == 0.75
    assert len((workspace / "guess.jsonl").read_text().splitlines()) == 6


async def test_the_guides_notebook_cell_awaits_arollout_in_a_running_loop(workspace):
    _write_questions(workspace)
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    cell = (workspace / "notebook_cell.py").read_text()
    code = compile(cell, "notebook_cell.py", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, Any] = {}
    ticker = asyncio.create_task(tick())
    try:
        await eval(code, namespace)  # as a notebook runs a cell: in its running loop
    finally:
        ticker.cancel()
    result = namespace["result"]
    assert result.failed == 0 and len(result.trajectories) == 4
    _check_records(result.trajectories, "retry_with_feedback")
    # Starting the server and the workers took seconds; the loop kept ticking meanwhile.
    assert max(b - a for a, b in itertools.pairwise(ticks)) < 3.0
