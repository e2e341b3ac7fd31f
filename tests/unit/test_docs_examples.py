"""The guides in docs/ hold true: their files load, snippets run, commands validate.

Conventions the guides follow (see docs/README.md): a code block whose first line is
``# file: NAME`` is a file later examples use, written to a scratch folder that is the
working directory and on ``sys.path``; other Python blocks of a guide run in order in one
namespace (top-level ``await`` allowed); every ``agentrl ...`` line of a bash block is
parsed by the real CLI parser and its config file + overrides are validated.
"""

from __future__ import annotations

import ast
import inspect
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.algos.advantages import get_adv_estimator
from agentrl.algos.policy_losses import get_policy_loss
from agentrl.cli import parse_args
from agentrl.config import load_config
from agentrl.testing.benchmarks import available_benchmarks, find_bench_dir

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GUIDES = (
    "agent-loops.md",
    "tools.md",
    "external-agents.md",
    "rewards.md",
    "algorithms.md",
    "training-runs.md",
    "gpu-cluster.md",
    "deploy.md",
    "models.md",
)
PENDING_LINKS: set[str] = set()
FILE_MARKER = re.compile(r"^#\s*file:\s*(\S+)\s*$")
CONFIG_COMMANDS = {"train", "eval", "serve", "rollout"}


@dataclass
class Block:
    lang: str
    code: str
    file: str | None


def blocks(guide: str) -> list[Block]:
    text = (DOCS / guide).read_text()
    found = []
    for lang, code in re.findall(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        first = code.split("\n", 1)[0]
        marker = FILE_MARKER.match(first)
        found.append(Block(lang, code, marker.group(1) if marker else None))
    return found


def write_files(guide: str, folder: Path) -> dict[str, Path]:
    files = {}
    for block in blocks(guide):
        if block.file:
            files[block.file] = folder / block.file
            files[block.file].write_text(block.code)
    return files


def agentrl_commands(guide: str) -> list[list[str]]:
    """argv (after ``agentrl``) of every agentrl command in the guide's bash blocks."""
    commands = []
    for block in blocks(guide):
        if block.lang != "bash":
            continue
        for line in block.code.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;|\|", line):
                words = shlex.split(part, comments=True)
                while words and re.match(r"^\w+=", words[0]):
                    words.pop(0)  # environment assignments
                if words and (words[0] == "agentrl" or words[0].endswith("/agentrl")):
                    commands.append(words[1:])
    return commands


async def run_snippets(guide: str, namespace: dict[str, Any]) -> None:
    for index, block in enumerate(blocks(guide)):
        if block.lang != "python" or block.file:
            continue
        code = compile(
            block.code, f"{guide}[{index}]", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        result = eval(code, namespace)
        if inspect.iscoroutine(result):
            await result


@pytest.fixture
def workspace(tmp_path, monkeypatch, tiny_checkpoint):
    """A scratch working directory on sys.path (the guides' files are written there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("guide", GUIDES)
def test_every_agentrl_command_parses_and_its_config_validates(guide, tmp_path):
    files = write_files(guide, tmp_path)
    commands = agentrl_commands(guide)
    assert commands, f"{guide} shows no agentrl command"
    benchmarks = available_benchmarks(find_bench_dir())
    for argv in commands:
        args = parse_args(argv)
        if args.command == "bench":
            assert args.name in benchmarks, argv
        if args.command not in CONFIG_COMMANDS:
            continue
        config = args.config
        if config == "CONFIG":
            config = None
        elif config is not None:
            config = str(files.get(config, ROOT / config))
        cfg = load_config(config, args.overrides)
        get_adv_estimator(cfg.algorithm.adv_estimator)
        get_policy_loss(cfg.algorithm.policy_loss.loss_mode)


@pytest.mark.parametrize("guide", GUIDES)
def test_every_yaml_block_is_a_valid_config_or_tool_file(guide, tmp_path):
    write_files(guide, tmp_path)
    for block in blocks(guide):
        if block.lang != "yaml":
            continue
        tree = yaml.safe_load(block.code)
        if "tools" in tree:
            assert all("class_name" in entry for entry in tree["tools"])
        else:
            load_config(tmp_path / block.file if block.file else None, [])


def test_every_guide_is_linked_from_the_index_and_links_resolve():
    index = (DOCS / "README.md").read_text()
    for guide in GUIDES:
        assert f"]({guide})" in index
    for page in ("README.md", *GUIDES):
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", (DOCS / page).read_text()):
            assert (DOCS / target).exists() or target in PENDING_LINKS, (page, target)


async def test_agent_loop_guide_runs(workspace):
    write_files("agent-loops.md", workspace)
    namespace: dict[str, Any] = {}
    await run_snippets("agent-loops.md", namespace)
    out, client = namespace["out"], namespace["client"]
    assert out.metrics == {"attempts": 2, "solved": 1}
    assert out.num_turns == 3
    assert len(client.calls) == 2
    tokenizer = namespace["tokenizer"]
    feedback = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0]
    assert "Not quite. Check your work and answer again." in tokenizer.decode(feedback)

    from agentrl.agent_loops.registry import get_agent_loop

    cls = namespace["RetryWithFeedback"]
    assert get_agent_loop("retry_loop:RetryWithFeedback") is cls
    assert get_agent_loop("retry_with_feedback") is cls


async def test_tools_guide_runs(workspace):
    write_files("tools.md", workspace)
    namespace: dict[str, Any] = {}
    await run_snippets("tools.md", namespace)
    assert sorted(namespace["tools"]) == ["calculator", "convert", "notebook"]
    assert namespace["response"].text == "3.107 mi"
    out, tokenizer = namespace["out"], namespace["tokenizer"]
    masked = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0]
    assert "<tool_response>\n16.093 km\n</tool_response>" in tokenizer.decode(masked)
    assert out.metrics["tool_calls"] == 1
    assert out.metrics["tool_calls/ok"] == 1

    notebook = namespace["tools"]["notebook"]
    assert notebook.config == {"max_chars": 80}
    episode = await notebook.create()
    await notebook.execute(episode, {"note": "x" * 100})
    response, _, metrics = await notebook.execute(episode, {"note": "second"})
    assert response.text == "x" * 80 + "\nsecond" and metrics == {"notes": 2}
    await notebook.release(episode)
    assert notebook.notes == {}


async def test_external_agent_guide_runs(workspace):
    write_files("external-agents.md", workspace)
    namespace: dict[str, Any] = {}
    await run_snippets("external-agents.md", namespace)
    sample = namespace["sample"]
    assert sample.reward == 1.0
    assert sample.num_turns == 3
    assert 0 in sample.response_mask
    assert len(namespace["engine"].calls) == 2


async def test_reward_guide_runs(workspace):
    write_files("rewards.md", workspace)
    namespace: dict[str, Any] = {}
    await run_snippets("rewards.md", namespace)
    batch = namespace["batch"]
    assert batch.scores == [1.0, 0.0]
    assert batch.metrics["reward/acc/mean"] == 0.5
    assert batch.metrics["reward/formatted/mean"] == 0.5

    from my_reward import compute_score  # the length penalty, straight from the file

    long = "<answer>4</answer>" + " " * 3000
    result = compute_score("quiz", long, "4", {"char_budget": 1000})
    assert result["acc"] == 1.0 and result["score"] == pytest.approx(1.0 - 0.1 * 2.018)


async def test_training_runs_guide_runs(workspace):
    namespace: dict[str, Any] = {}
    await run_snippets("training-runs.md", namespace)
    assert sorted(namespace["report"].written) == ["accuracy", "overview", "reward"]
    assert (workspace / "runs" / "demo" / "plots" / "reward.png").exists()
