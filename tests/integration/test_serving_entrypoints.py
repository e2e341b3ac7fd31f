"""The library's serving entry points, as the README shows them, on real Ray Serve.

The README's "From Python" snippet runs as written, in a script (its config's model and
engine are swapped for the tiny checkpoint on HFEngine replicas by ``load_config``, so
the test takes seconds; ``builtin:tiny-qwen2`` keeps the library's ``builtin:``
resolution in the path). A model path that does not load fails ``start_rollout_servers`` with the
replica's own error in the driver's exception.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from ray import serve

from agentrl.server.launch import DeploymentError, init_ray, start_rollout_servers
from agentrl.testing.serving import tiny_serving_config

# The async tests share the module's event loop (pyproject: asyncio_mode auto, loop scope
# module); an asyncio mark on the module would also land on the one synchronous test.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PORT = 18791
TINY_HF = [
    "model.path=builtin:tiny-qwen2",
    "server.engine.backend=hf",
    "server.engine.max_model_len=1024",
    f"server.http_port={PORT}",
]


def _readme_serving_snippet() -> str:
    """The "From Python" block of docs/concepts/serving.md (its not-run marker dropped)."""
    text = (ROOT / "docs" / "concepts" / "serving.md").read_text()
    section = text[text.index("From Python, `start_rollout_servers`") :]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    return "".join(line for line in block.splitlines(True) if "not run in tests" not in line)


@pytest.fixture(scope="module")
def ray_local(tiny_checkpoint):
    init_ray(tiny_serving_config(tiny_checkpoint, PORT).ray)
    yield
    serve.shutdown()
    ray.shutdown()


SCRIPT = """
import asyncio, json, textwrap, time

import agentrl.config
from ray import serve

real_load_config = agentrl.config.load_config
loaded = []


def tiny_load_config(path, overrides=()):
    cfg = real_load_config(path, [*overrides, *{tiny}])
    loaded.append(cfg)
    return cfg


agentrl.config.load_config = tiny_load_config
namespace = {{}}
exec("async def main():\\n" + textwrap.indent({snippet!r}, "    ") + "\\n    return out", namespace)
out = asyncio.run(namespace["main"]())
(cfg,) = loaded
time.sleep(3)  # time for Serve's last updates to reach this process
print("RESULT", json.dumps({{
    "path": cfg.model.path,
    "replicas": cfg.server.num_replicas,
    "tokens": len(out.token_ids),
    "logprobs": len(out.logprobs),
    "versions": sorted(set(out.token_versions)),
    "still_up": cfg.server.name in serve.status().applications,
}}))
"""


def test_readme_from_python_snippet_runs_as_a_script(tmp_path):
    """As the README says to run it in a script: inside an ``async def``, ``asyncio.run``.
    Before ``ray_local`` (a Ray of its own in the subprocess, same ports)."""
    script = tmp_path / "snippet.py"
    # Workers' output on this console too: the check below reads the controller's.
    overrides = [*TINY_HF, "ray.log_to_driver=true"]
    script.write_text(SCRIPT.format(tiny=overrides, snippet=_readme_serving_snippet()))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    result = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    assert result["path"] == "builtin:tiny-qwen2", "the caller's config is not rewritten"
    assert result["replicas"] == 2
    assert 0 < result["tokens"] <= 64 and result["logprobs"] == result["tokens"]
    assert result["versions"] == [0]
    assert not result["still_up"]
    # The client's routing on the script's loop was stopped before the loop ended: Serve
    # logged no listener left on a closed loop (in the driver or the controller).
    assert "Bound asyncio event loop is not running" not in output, output[-3000:]


async def test_model_path_that_does_not_load_names_path_and_cause(ray_local, tiny_checkpoint):
    cfg = tiny_serving_config(
        tiny_checkpoint,
        PORT,
        ["model.path=/no/such/checkpoint", "server.engine.backend=hf", "server.name=bad"],
        replicas=1,
    )
    with pytest.raises(DeploymentError) as raised:
        start_rollout_servers(cfg.model, cfg.server)
    error = raised.value
    assert "'bad'" in str(error)
    assert "/no/such/checkpoint" in error.cause
    assert re.match(r"\w+(Error|Exception)", error.cause), error.cause
    assert "Traceback" in error.details  # the replica's own traceback reached the driver
    serve.delete("bad")


async def test_unknown_builtin_model_fails_before_deploying(ray_local, tiny_checkpoint):
    cfg = tiny_serving_config(tiny_checkpoint, PORT, ["model.path=builtin:no-such-model"])
    with pytest.raises(ValueError, match="unknown built-in model 'builtin:no-such-model'"):
        start_rollout_servers(cfg.model, cfg.server)
