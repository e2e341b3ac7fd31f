"""The library's serving entry points, as the README shows them, on real Ray Serve.

The README's "From Python" snippet runs as written (its config's model and engine are
swapped for the tiny checkpoint on HFEngine replicas by ``load_config``, so the test
takes seconds; ``builtin:tiny-qwen2`` keeps the library's ``builtin:`` resolution in the
path). A model path that does not load fails ``start_rollout_servers`` with the
replica's own error in the driver's exception.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import ray
from ray import serve

import agentrl.config
from agentrl.server.launch import DeploymentError, init_ray, start_rollout_servers
from agentrl.testing.serving import tiny_serving_config

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parents[2]
PORT = 18791
TINY_HF = [
    "model.path=builtin:tiny-qwen2",
    "server.engine.backend=hf",
    "server.engine.max_model_len=1024",
    f"server.http_port={PORT}",
]


def _readme_serving_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Serving") :]
    section = section[section.index("From Python") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.fixture(scope="module")
def ray_local(tiny_checkpoint):
    init_ray(tiny_serving_config(tiny_checkpoint, PORT).ray)
    yield
    serve.shutdown()
    ray.shutdown()


async def test_readme_from_python_snippet_runs(ray_local, monkeypatch):
    real_load_config = agentrl.config.load_config
    loaded = []

    def tiny_load_config(path, overrides=()):
        assert (ROOT / path).exists(), f"the README's config {path} does not exist"
        cfg = real_load_config(ROOT / path, [*overrides, *TINY_HF])
        loaded.append(cfg)
        return cfg

    monkeypatch.setattr(agentrl.config, "load_config", tiny_load_config)
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    code = compile(
        _readme_serving_snippet(), "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    )
    result = eval(code, namespace)
    if inspect.iscoroutine(result):
        await result
    (cfg,) = loaded
    assert cfg.model.path == "builtin:tiny-qwen2", "the caller's config is not rewritten"
    assert cfg.server.num_replicas == 2
    out = namespace["out"]
    assert 0 < len(out.token_ids) <= 64
    assert len(out.logprobs) == len(out.token_ids)
    assert out.token_versions == [0] * len(out.token_ids)
    assert cfg.server.name not in serve.status().applications  # stopped at the end


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
