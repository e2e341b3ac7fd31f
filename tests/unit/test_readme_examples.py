"""The README's examples run as written, import only the public namespace, and the page
stays a page a newcomer reads in a minute.

The "From Python" example starts Ray and a server, so it runs in
``tests/e2e/test_wheel_install.py``, from an installed wheel.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
from pathlib import Path

import yaml
from transformers import AutoTokenizer

import agentrl
from agentrl.testing import ScriptedClient, loop_context

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PUBLIC_MODULES = {"agentrl", "agentrl.testing"}
MAX_LINES, MAX_FIRST_SCREEN = 250, 40


def _section(heading: str) -> str:
    start = README.index(f"\n{heading}\n")
    end = README.find("\n## ", start + len(heading) + 2)
    return README[start : end if end != -1 else None]


def _blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def _run(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


async def test_the_agent_loop_example_runs_token_exact(tiny_checkpoint, monkeypatch):
    from agentrl.agent_loops import registry

    # The quickstart's loop has the same name (its test may have run in this process): the
    # README's registers in a copy of the registry without it.
    loops = {name: cls for name, cls in registry._LOOPS.items() if name != "two_drafts"}
    monkeypatch.setattr(registry, "_LOOPS", loops)
    namespace = _run(_blocks("python", _section("## Write an agent loop"))[0])
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    eos = tokenizer.eos_token_id
    client = ScriptedClient(lambda session, turn, prompt: [10 + turn, 20, eos])
    loop = namespace["TwoDrafts"](loop_context(tokenizer, client, session_id="readme"))
    sample = {"prompt": [{"role": "user", "content": "2+2?"}]}
    out = await loop.run(sample, agentrl.SamplingParams())
    assert len(client.calls) == 2
    assert out.response_ids[:3] == [10, 20, eos]
    assert out.response_ids[-3:] == [11, 20, eos]
    nudge = tokenizer.decode(out.response_ids[3:-3])
    assert nudge == "\n<|im_start|>user\nPlease double-check.<|im_end|>\n<|im_start|>assistant\n"
    assert out.response_mask == [1, 1, 1] + [0] * (len(out.response_ids) - 6) + [1, 1, 1]


async def test_the_tool_example_runs():
    lookup = _run(_blocks("python", _section("## Give it tools"))[0])["lookup"]
    schema = lookup.tool_schema.to_dict()["function"]
    assert schema["name"] == "lookup"
    assert schema["parameters"]["properties"]["unit"]["enum"] == ["c", "f"]
    assert schema["parameters"]["required"] == ["city"]
    response, _, _ = await lookup.execute("i", {"city": "Paris", "unit": "f"})
    assert response.text == "21 degrees f in Paris"


def test_the_external_agent_keys_validate(tmp_path, monkeypatch):
    section = _section("## Train an agent you already have")
    (tmp_path / "my_agent.py").write_text(_blocks("python", section)[0])
    keys = dict(re.findall(r"`([\w.]+): ([^`]+)`", section))
    assert set(keys) == {
        "plugins",
        "gateway.enabled",
        "rollout.agent_name",
        "rollout.external.entrypoint",
    }
    overrides = [f"{key}={value}" for key, value in keys.items()]
    monkeypatch.chdir(tmp_path)
    cfg = agentrl.load_config(overrides=overrides)
    assert cfg.gateway.enabled and cfg.rollout.agent_name == "external"
    assert yaml.safe_load(keys["plugins"]) == cfg.plugins == ["my_agent.py"]


def test_the_environment_rows_command_and_config_validate(tmp_path):
    section = _section("## Train on an environment you already have")
    command = _blocks("bash", section)[0].strip()
    python, args = command.split(" -m ", 1)
    assert python == ".venv/bin/python"
    run = subprocess.run(
        [str(ROOT / python), "-m", *shlex.split(args)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in (tmp_path / "ttt.jsonl").read_text().splitlines()]
    assert len(rows) == 256 and rows[0]["agent_name"] == "env"
    assert rows[0]["extra_info"]["env_kwargs"] == {"opponent": "self"}
    config = _blocks("yaml", section)[0]
    assert config.startswith("# file: ttt.yaml\n")
    (tmp_path / "ttt.yaml").write_text(config)
    cfg = agentrl.load_config(tmp_path / "ttt.yaml")
    assert cfg.rollout.agent_name == "env" and cfg.rollout.env.self_play_trained == "both"
    assert cfg.reward.reward_fn_path == "agentrl.envs.reward"


def test_examples_import_only_the_public_namespace():
    for code in _blocks("python"):
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "agentrl":
                    assert name in PUBLIC_MODULES, f"README imports {name}"


def test_the_page_is_short_and_its_first_screen_holds_the_essentials():
    lines = README.splitlines()
    assert len(lines) <= MAX_LINES
    first_screen = README[: README.index("\n## ")]
    assert len(first_screen.splitlines()) <= MAX_FIRST_SCREEN
    for essential in ("scripts/setup.sh && recipes/retool/run_cpu.sh", "scripts/test.sh"):
        assert essential in first_screen
    assert "| Python |" in first_screen


def test_prose_names_no_commits():
    known = {line.split()[0][:7] for line in _git_log()}
    words = set(re.findall(r"\b[0-9a-f]{7,40}\b", README))
    assert not {word for word in words if word[:7] in known}


def _git_log() -> list[str]:
    result = subprocess.run(
        ["git", "log", "--format=%H", "-n", "2000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.splitlines()
