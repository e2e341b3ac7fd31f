"""The guides in docs/ hold true: their files load, snippets run, commands validate.

Conventions the guides follow (see docs/index.md): a code block whose first line is
``# file: NAME`` is a file later examples use, written to a scratch folder that is the
working directory and on ``sys.path``; other Python blocks of a guide run in order in one
namespace (top-level ``await`` allowed); every ``agentrl ...`` line of a bash block is
parsed by the real CLI parser and its config file + overrides are validated.

Every command of a bash block is accounted for. A page runs top to bottom in a scratch
folder that holds the checkout's ``recipes/`` and ``configs/`` (a fresh clone): Python
blocks run, ``python ...`` commands run (the data-making steps), and each ``agentrl``
command finds the data, model, tool and reward files its config names. A command that
cannot run here (docker, a cluster, GPUs, a running server, minutes of Ray) has a
``# not run in tests: WHY`` comment at the end of its line, or on a line above it that
covers the rest of its block; those are listed as skipped by
``test_commands_not_run_here``. Any other command fails the page.

Every Python block of every page in docs/ writes against the public namespace only: it
imports ``agentrl`` and ``agentrl.testing`` (and any non-agentrl module), never a module
under them, and every ``agentrl.X`` it names is one of their exports.
"""

from __future__ import annotations

import ast
import inspect
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import agentrl
import agentrl.testing
from agentrl.algos.advantages import get_adv_estimator
from agentrl.algos.policy_losses import get_policy_loss
from agentrl.cli import command_data_files, parse_args
from agentrl.config import AgentRLConfig, load_config
from agentrl.preflight import missing_inputs
from agentrl.testing.benchmarks import available_benchmarks, find_bench_dir, script_path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GUIDES = (
    "guides/agent-loops.md",
    "guides/tools.md",
    "guides/external-agents.md",
    "guides/rewards.md",
    "guides/environments.md",
    "guides/algorithms.md",
    "guides/training-runs.md",
    "guides/gpu-cluster.md",
    "guides/deploy.md",
    "guides/models.md",
    "getting-started/quickstart.md",
    "benchmarks.md",
)
FILE_MARKER = re.compile(r"^#\s*file:\s*(\S+)\s*$")
NOT_RUN_MARKER = re.compile(r"#\s*not run in tests:\s*(\S.*?)\s*$")
CONFIG_COMMANDS = {"train", "eval", "serve", "rollout", "config"}
PYTHON = ("python", ".venv/bin/python")
CHECKOUT = ("recipes", "configs")  # what the pages' commands use of a fresh clone


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


@dataclass
class Command:
    """One command of a bash block: a line (continuations joined) or a part of it
    between ``&&``, ``;`` or ``|``."""

    line: str  # as on the page, without its marker
    words: list[str]  # environment assignments dropped
    not_run: str | None  # the reason of its ``# not run in tests:`` marker

    @property
    def is_agentrl(self) -> bool:
        return self.words[0] == "agentrl" or self.words[0].endswith("/agentrl")


def block_commands(block: Block) -> list[Command]:
    """The commands of a bash block, each with the marker that covers it (if any)."""
    commands = []
    covering = None  # a marker on a line of its own covers the lines below it
    for line in block.code.replace("\\\n", " ").splitlines():
        marker = NOT_RUN_MARKER.search(line)
        if line.lstrip().startswith("#"):
            covering = marker.group(1) if marker else covering
            continue
        for part in re.split(r"&&|;|\|", line):
            words = shlex.split(part, comments=True)
            while words and re.match(r"^\w+=", words[0]):
                words.pop(0)  # environment assignments
            if words:
                reason = marker.group(1) if marker else covering
                commands.append(Command(NOT_RUN_MARKER.sub("", line).strip(), words, reason))
    return commands


def guide_commands(guide: str) -> list[Command]:
    return [c for b in blocks(guide) if b.lang == "bash" for c in block_commands(b)]


def agentrl_commands(guide: str) -> list[list[str]]:
    """argv (after ``agentrl``) of every agentrl command in the guide's bash blocks."""
    return [c.words[1:] for c in guide_commands(guide) if c.is_agentrl]


def command_config(argv: list[str], files: dict[str, Path]) -> tuple[Any, AgentRLConfig | None]:
    """The parsed command line and, for a config command, its validated config (the
    page's own files first, then the checkout's; ``CONFIG`` stands for defaults)."""
    args = parse_args(argv)
    if args.command not in CONFIG_COMMANDS:
        return args, None
    config = args.config
    if config == "CONFIG":
        config = None
    elif config is not None:
        config = str(files.get(config, ROOT / config))
    cfg = load_config(config, args.overrides)
    get_adv_estimator(cfg.algorithm.adv_estimator)
    get_policy_loss(cfg.algorithm.policy_loss.loss_mode)
    return args, cfg


def run_command(command: Command, files: dict[str, Path]) -> None:
    """Run or check one command in the working directory (see the module docstring)."""
    if command.not_run:
        return
    if command.is_agentrl:
        args, cfg = command_config(command.words[1:], files)
        if cfg is not None:
            missing = missing_inputs(cfg, command_data_files(args, cfg))
            assert not missing, f"`{command.line}`: {missing} (no earlier step makes them)"
    elif command.words[0] in PYTHON:
        done = subprocess.run(
            [sys.executable, *command.words[1:]], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"`{command.line}` failed:\n{done.stderr[-2000:]}"
    else:
        raise AssertionError(
            f"`{command.line}` is neither run nor checked by this test: make it an agentrl or "
            "python command, or mark it `# not run in tests: WHY`"
        )


async def run_guide(guide: str, namespace: dict[str, Any]) -> None:
    """Run the guide top to bottom in the working directory: its files written, Python
    blocks run in ``namespace``, bash commands run or checked (``run_command``)."""
    files = write_files(guide, Path.cwd())
    for index, block in enumerate(blocks(guide)):
        if block.lang == "bash":
            for command in block_commands(block):
                run_command(command, files)
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
    """A scratch working directory on sys.path (the guides' files are written there),
    holding the checkout's folders the pages' commands use, as a fresh clone would."""
    for name in CHECKOUT:
        (tmp_path / name).symlink_to(ROOT / name)
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
        args, _ = command_config(argv, files)
        if args.command == "bench":
            assert args.name in benchmarks, argv


GUIDES_WITH_OWN_RUN = {
    "guides/agent-loops.md",
    "guides/tools.md",
    "guides/external-agents.md",
    "guides/rewards.md",
    "guides/training-runs.md",
}


@pytest.mark.parametrize("guide", [g for g in GUIDES if g not in GUIDES_WITH_OWN_RUN])
async def test_guide_runs_top_to_bottom(guide, workspace):
    await run_guide(guide, {})


def bench_invocation(command: Command) -> tuple[str, list[str]] | None:
    """The benchmark a ``python bench/NAME.py ...`` or ``agentrl bench NAME ...`` command
    runs, as written, with the options it passes (``--name`` of ``--name=value``); None for
    other commands."""
    words = command.words
    if words[0] in PYTHON and len(words) > 1 and re.fullmatch(r"bench/\w+\.py", words[1]):
        name, rest = words[1], words[2:]
    elif command.is_agentrl and words[1:2] == ["bench"] and len(words) > 2:
        name, rest = words[2], words[3:]
    else:
        return None
    return name, [word.split("=", 1)[0] for word in rest if word.startswith("-")]


def declared_options(script: Path) -> set[str]:
    """Every option string the script's own ``add_argument`` calls declare, and ``--help``."""
    options = {"-h", "--help"}
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            options |= {
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")
            }
    return options


NOT_RUN = [(g, c) for g in GUIDES for c in guide_commands(g) if c.not_run]
NOT_RUN_BENCH = [(g, c) for g, c in NOT_RUN if bench_invocation(c)]
NOT_RUN_OTHER = [(g, c) for g, c in NOT_RUN if not bench_invocation(c)]


@pytest.mark.parametrize(
    ("guide", "command"), NOT_RUN_BENCH, ids=[f"{g}:{c.words[1]}" for g, c in NOT_RUN_BENCH]
)
def test_bench_commands_not_run_here_pass_only_options_their_script_declares(guide, command):
    """A benchmark runs for minutes to hours, so the page's command is not run; its script
    must exist and declare every option the command passes (a renamed flag fails here)."""
    name, options = bench_invocation(command)
    script = script_path(name)  # the CLI's resolver: an unknown benchmark fails here
    unknown = sorted(set(options) - declared_options(script))
    assert not unknown, f"{guide}: `{command.line}`: {script.name} declares no {unknown}"


@pytest.mark.parametrize(
    ("guide", "command"), NOT_RUN_OTHER, ids=[f"{g}:{c.words[0]}" for g, c in NOT_RUN_OTHER]
)
def test_commands_not_run_here(guide, command):
    """Listed as skipped, with the reason the page gives next to the command."""
    pytest.skip(f"{guide}: `{command.line}`: {command.not_run}")


def test_declared_options_are_read_from_the_scripts_parser(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--steps", type=int)\n'
        'parser.add_argument(\n    "-r",\n    "--runs",\n    type=int,\n)\n'
        'parser.add_argument("overrides", nargs="*")\n'
    )
    assert declared_options(script) == {"-h", "--help", "--steps", "-r", "--runs"}
    command = Command("", ["python", "bench/x.py", "--steps=3", "--tag", "a", "k=v"], "slow")
    assert bench_invocation(command) == ("bench/x.py", ["--steps", "--tag"])
    command = Command("", ["agentrl", "bench", "x", "--runs", "2"], "slow")
    assert bench_invocation(command) == ("x", ["--runs"])


def test_the_marker_covers_its_line_or_the_rest_of_its_block():
    block = Block(
        "bash",
        "python a.py\n# not run in tests: needs docker\ndocker build .\ndocker run x\n"
        "ls  # not run in tests: an example\n",
        None,
    )
    assert [(c.words[0], c.not_run) for c in block_commands(block)] == [
        ("python", None),
        ("docker", "needs docker"),
        ("docker", "needs docker"),
        ("ls", "an example"),
    ]


def test_an_unmarked_command_that_is_not_run_fails_the_page():
    (command,) = block_commands(Block("bash", "docker build .\n", None))
    with pytest.raises(AssertionError, match="not run in tests: WHY"):
        run_command(command, {})


def test_a_train_command_whose_data_no_step_makes_fails_the_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (command,) = block_commands(
        Block("bash", "agentrl train CONFIG data.train_files=[train.jsonl]\n", None)
    )
    with pytest.raises(AssertionError, match=r"train\.jsonl"):
        run_command(command, {})
    (tmp_path / "train.jsonl").write_text("")
    run_command(command, {})


PUBLIC = {"agentrl": set(agentrl.__all__), "agentrl.testing": set(agentrl.testing.__all__)}
PYTHON_BLOCK = re.compile(r"^([ \t]*)```(?:python|py)\n(.*?)^\1```", re.DOTALL | re.MULTILINE)


def private_api_uses(code: str) -> list[str]:
    """What ``code`` takes from agentrl outside ``agentrl`` and ``agentrl.testing``'s
    exports: an import of another agentrl module, a name they do not export, or an
    attribute of the ``agentrl`` module that is not one."""
    found = []
    aliases = {}  # local name -> public module it is bound to
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "agentrl":
                    continue
                if alias.name not in PUBLIC:
                    found.append(f"import {alias.name}")
                elif alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases["agentrl"] = "agentrl"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "agentrl":
            if node.module not in PUBLIC:
                found.append(f"from {node.module} import ...")
                continue
            exported = PUBLIC[node.module] | ({"testing"} if node.module == "agentrl" else set())
            found += [f"{node.module}.{a.name}" for a in node.names if a.name not in exported]
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
            module = ast.unparse(node.value)
            module = aliases.get(module, module)  # agentrl, agentrl.testing or an alias
            if module in PUBLIC and node.attr not in PUBLIC[module] | {"testing"}:
                found.append(f"{module}.{node.attr}")
    return found


DOC_PAGES = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


@pytest.mark.parametrize("page", DOC_PAGES)
def test_python_blocks_use_only_the_public_namespace(page):
    text = (DOCS / page).read_text()
    for indent, code in PYTHON_BLOCK.findall(text):
        code = "\n".join(line.removeprefix(indent) for line in code.splitlines())
        assert not private_api_uses(code), f"{page}: {private_api_uses(code)} in\n{code}"


def test_the_public_namespace_check_finds_what_a_block_takes_from_elsewhere():
    code = (
        "import agentrl\n"
        "import agentrl.testing as t\n"
        "from agentrl import SamplingParams, rollout\n"
        "from agentrl.testing import ScriptedClient\n"
        "import agentrl.rollout.worker\n"
        "from agentrl.core.types import TokenOutput\n"
        "from agentrl import RolloutEngine\n"
        "agentrl.rollout(cfg)\n"
        "agentrl.ObjectStoreSync(control).push\n"
        "agentrl.envs.env_factory\n"
        "t.ScriptedClient, t.fidelity\n"
        "config_path = 'agentrl.envs.reward'\n"
    )
    assert sorted(private_api_uses(code)) == [
        "agentrl.RolloutEngine",
        "agentrl.envs",
        "agentrl.testing.fidelity",
        "from agentrl.core.types import ...",
        "import agentrl.rollout.worker",
    ]


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


async def test_agent_loop_guide_runs(workspace):
    namespace: dict[str, Any] = {}
    await run_guide("guides/agent-loops.md", namespace)
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
    namespace: dict[str, Any] = {}
    await run_guide("guides/tools.md", namespace)
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
    namespace: dict[str, Any] = {}
    await run_guide("guides/external-agents.md", namespace)
    sample = namespace["sample"]
    assert sample.reward == 1.0
    assert sample.num_turns == 3
    assert 0 in sample.response_mask
    assert len(namespace["engine"].calls) == 2


async def test_reward_guide_runs(workspace):
    namespace: dict[str, Any] = {}
    await run_guide("guides/rewards.md", namespace)
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
    await run_guide("guides/training-runs.md", namespace)
    assert sorted(namespace["report"].written) == ["accuracy", "overview", "reward"]
    assert (workspace / "runs" / "demo" / "plots" / "reward.png").exists()
