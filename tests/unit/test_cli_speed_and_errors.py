"""``agentrl`` as a user meets it, in a fresh process: help, ``config`` and every error in
what the user gave load no torch, Ray, vLLM or transformers (so they answer fast), and
each bad input prints one short block naming where the problem is, exits 2 and shows no
traceback. Times are measured by hand (see the issue), never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "ray", "vllm", "transformers")

# Runs agentrl's main in this interpreter and reports which heavy modules it loaded.
RUN = f"""
import json, sys
from agentrl.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit_:
    code = exit_.code
print("HEAVY=" + json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)
sys.exit(code)
"""

ROW = {"prompt": [{"role": "user", "content": "hi"}]}


def _agentrl(cwd: Path, *argv: str) -> tuple[int, str, str, list[str]]:
    """``agentrl ARGV`` run in ``cwd``: exit code, stdout, stderr and heavy modules loaded."""
    done = subprocess.run(
        [sys.executable, "-c", RUN, *argv], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    err, _, heavy = done.stderr.rpartition("HEAVY=")
    return done.returncode, done.stdout, err, json.loads(heavy)


FILES = {
    "run.yaml": "model:\n  path: Org/Model\ndata:\n  train_files: [rows.jsonl]\n",
    "rows.jsonl": json.dumps(ROW) + "\n",
    "bad_rows.jsonl": "".join(
        json.dumps({**ROW, "agent_name": name}) + "\n" for name in ("single_turn", "singel_turn")
    ),
    "my_loops.py": "",
    "typo.yaml": "rollout:\n  agent_nmae: x\n",
    "type.yaml": "rollout:\n  n: two\n",
    "enum.yaml": "server:\n  engine:\n    backend: vlm\n",
}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A user's folder: a valid config, its data, a plugin file, and some mistakes."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_importing_the_cli_loads_nothing_heavy():
    script = f"import sys, agentrl.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["train", "--help"], ["train", "--help", "rollout"]]
)
def test_help_and_version_load_nothing_heavy(argv, workspace):
    code, out, err, heavy = _agentrl(workspace, *argv)
    assert (code, heavy) == (0, [])
    assert out and not err


def test_config_prints_the_config_loading_nothing_heavy(workspace):
    code, out, err, heavy = _agentrl(workspace, "config", "run.yaml", "rollout.n=3")
    assert (code, heavy) == (0, [])
    assert "  n: 3\n" in out and "Traceback" not in err


BAD_INPUTS = {
    "key typo": (
        ["train", "typo.yaml"],
        [
            "invalid config file typo.yaml",
            "rollout.agent_nmae (line 2): unknown key",
            "did you mean rollout.agent_name?",
        ],
    ),
    "wrong type": (
        ["train", "type.yaml"],
        ["invalid config file type.yaml", "rollout.n (line 2): expected int, got 'two'"],
    ),
    "bad choice": (
        ["config", "enum.yaml"],
        [
            "invalid config file enum.yaml",
            "server.engine.backend (line 3): 'vlm' is not allowed",
            "did you mean vllm? one of: vllm, hf",
        ],
    ),
    "missing config file": (
        ["train", "rnu.yaml"],
        ["config file rnu.yaml not found", "did you mean run.yaml?"],
    ),
    "unknown agent_name in a row": (
        ["train", "run.yaml", "data.train_files=[bad_rows.jsonl]"],
        [
            "bad_rows.jsonl line 2: unknown agent_name 'singel_turn'",
            "did you mean single_turn?",
            "registered: ",
        ],
    ),
    "unknown plugin path": (
        ["rollout", "run.yaml", "plugins=[my_loop.py]"],
        [
            "plugins (config file run.yaml): plugin file my_loop.py does not exist",
            "did you mean my_loops.py?",
        ],
    ),
    "override without =": (
        ["train", "run.yaml", "rollout.agent_nmae"],
        ["override 'rollout.agent_nmae' has no `=`", "did you mean rollout.agent_name?"],
    ),
    "unknown algorithm": (
        ["train", "run.yaml", "algorithm.adv_estimator=grop"],
        ["algorithm.adv_estimator: unknown advantage estimator 'grop'", "did you mean grpo?"],
    ),
    "unknown verb": (["trian", "run.yaml"], ["unknown command 'trian'; did you mean train?"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_short_block_naming_where_exit_2_before_anything_heavy(case, workspace):
    argv, expected = BAD_INPUTS[case]
    code, out, err, heavy = _agentrl(workspace, *argv)
    assert code == 2, err
    assert heavy == []  # nor Ray started: it was not even imported
    assert out == ""
    for text in expected:
        assert text in err, (text, err)
    assert "Traceback" not in err and "pydantic" not in err
    assert len(err.splitlines()) <= 4, err
    assert not (workspace / "runs").exists()
