"""Layer contracts, checked on what a process *loads*, not only on direct imports.

Each entry point is imported in a fresh interpreter, its light entry points are called
(``Contract.exercise``: building a config, an engine without a model, a weight receiver,
a queue, ...), and only then are the ``agentrl`` modules in ``sys.modules`` compared with
the allow-list of its layer (docs/architecture.md, "Layers"): every module it loaded must
belong to its own layer or to one below. The core must load nothing of the project and no
heavy package (torch, Ray, transformers, ...); an FSDP rank loads no Ray Serve; no entry
point loads FSDP, except where transformers itself does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

# Records every module whose import statements name torch.distributed.fsdp (or its
# composable alias), loaded already or not, by wrapping builtins.__import__; then imports
# the entry point, runs its exercise and reports what the process loaded.
_PROBE = """
import builtins, json, sys

_FSDP = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")
_importers = set()
_import = builtins.__import__

def _witness(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0:
        names = [name] + [name + "." + item for item in fromlist or ()]
        if any(n == p or n.startswith(p + ".") for n in names for p in _FSDP):
            importer = (globals or {{}}).get("__name__", "?")
            if not importer.startswith("torch."):
                _importers.add(importer)
    return _import(name, globals, locals, fromlist, level)

builtins.__import__ = _witness
import {module}
{exercise}
print(json.dumps({{
    "modules": sorted(sys.modules),
    "fsdp_importers": sorted(_importers),
}}))
"""

# transformers >= 5 imports FSDP itself as soon as AutoTokenizer or AutoModel is imported
# (transformers.distributed.fsdp, from its generation utils): every process that
# tokenizes loads it, and no layering of ours can avoid that. Any other importer, above
# all one of our modules, breaks the contract.
_TOLERATED_FSDP_IMPORTERS = ("transformers.",)


def _matches(name: str, pattern: str) -> bool:
    """A pattern ``pkg.*`` matches ``pkg`` and everything under it; any other pattern
    matches that one module."""
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return name == package or name.startswith(package + ".")
    return name == pattern


# -- the layers, bottom up: what a process of each may load of the project ---------------

# The core, and the package-root helpers and models that count as core.
CORE = ("agentrl", "agentrl.core.*", "agentrl.chat_template", "agentrl.plugins", "agentrl.models.*")
ALGORITHMS = (*CORE, "agentrl.algos.*")
TOOLS = (*CORE, "agentrl.tools.*")
SERVER = (*TOOLS, "agentrl.server.*")
# Agent loops see the server only through its client (and the config it is made from).
SERVER_CLIENT = (
    "agentrl.server",
    "agentrl.server.affinity",
    "agentrl.server.client",
    "agentrl.server.config",
    "agentrl.server.ray_compat",
)
# The text environments (agentrl.envs) and their loop belong to the agent-loop layer.
AGENT_LOOPS = (*TOOLS, *SERVER_CLIENT, "agentrl.agent_loops.*", "agentrl.envs.*")
ROLLOUT = (*SERVER, *AGENT_LOOPS, "agentrl.rollout.*")
# The trainer may load every layer below it, and the data and reward packages beside them;
# never the test helpers.
TRAINER = (*ALGORITHMS, *ROLLOUT, "agentrl.data.*", "agentrl.reward.*", "agentrl.trainer.*")

# What an FSDP rank may not load: Ray Serve (the rollout deployment's client and router).
_SERVE = ("ray.serve.*", "agentrl.server.client", "server.client")


@dataclass(frozen=True)
class Contract:
    """``module``, once imported and ``exercise``d, loads only modules matching
    ``allowed`` of the project, and none matching ``forbidden`` at all (any package)."""

    module: str
    allowed: tuple[str, ...]
    exercise: str = ""
    forbidden: tuple[str, ...] = ()


def _contract_id(contract: Contract) -> str:
    return contract.module


def _violations(contract: Contract, loaded: list[str]) -> list[str]:
    """The modules of ``loaded`` that ``contract`` does not allow."""
    ours = [n for n in loaded if _matches(n, "agentrl.*")]
    return [n for n in ours if not any(_matches(n, p) for p in contract.allowed)] + [
        n for n in loaded if any(_matches(n, p) for p in contract.forbidden)
    ]


_NULL_ENGINE = """
import asyncio
from agentrl.core.config import ModelConfig
from agentrl.core.types import PauseMode, SamplingParams
from agentrl.server.config import EngineConfig
from agentrl.server.factory import create_engine
from agentrl.server.weight_transport import receiver_class

async def exercise():
    engine = create_engine(
        ModelConfig(path="unused"), EngineConfig(backend="null", null_token_ids=[7])
    )
    await engine.generate("r", [1, 2], SamplingParams(max_tokens=2))

    async def bucket():
        return []

    await receiver_class("object_store")(engine, "r-0").swap([bucket()], 1, PauseMode.KEEP)
    await engine.shutdown()

asyncio.run(exercise())
"""

# A replica of the simulated engine: it answers and takes a pushed version.
_SIM_ENGINE = """
import asyncio
from agentrl.core.config import ModelConfig
from agentrl.core.types import PauseMode, SamplingParams
from agentrl.server.config import EngineConfig
from agentrl.server.factory import create_engine
from agentrl.server.weight_transport import receiver_class

async def exercise():
    sim = {"time_scale": 1e-4, "token_ids": [11], "eos_token_id": 99}
    engine = create_engine(
        ModelConfig(path="unused"), EngineConfig(backend="sim", sim=sim, max_model_len=4096)
    )
    await engine.generate("r", [1, 2], SamplingParams(max_tokens=4))

    async def bucket():
        return []

    await receiver_class("object_store")(engine, "r-0").swap([bucket()], 1, PauseMode.KEEP)
    await engine.shutdown()

asyncio.run(exercise())
"""

# What a modeled replica (sim, null) may not load: the simulated cluster holds a hundred of
# them on one machine, and torch alone is most of a replica's memory.
_TORCH = ("torch", "torch.*", "transformers", "transformers.*")

CONTRACTS = [
    # A rollout replica: its engine answers and takes a weight push through a receiver.
    Contract("agentrl.server.deployment", SERVER, _NULL_ENGINE, forbidden=_TORCH),
    Contract("agentrl.server.sim_engine", SERVER, _SIM_ENGINE, forbidden=_TORCH),
    Contract(
        "agentrl.server.vllm_engine",
        SERVER,
        """
from agentrl.core.types import SamplingParams
from agentrl.server.vllm_args import sampling_params
from agentrl.server.vllm_weights import TESTED_VLLM_VERSIONS, weight_swap_for
sampling_params(SamplingParams(max_tokens=4), 3, 16, None)
weight_swap_for("staged", TESTED_VLLM_VERSIONS[0])
""",
    ),
    # What vLLM loads in every worker process (worker_extension_cls), with the worker
    # half of a transport: light, no Ray Serve.
    Contract(
        "agentrl.server.vllm_worker_ext",
        SERVER,
        """
import torch
from agentrl.server.vllm_worker_ext import decode_tensor, encode_tensor
from agentrl.server.weight_transport import receiver_class
decode_tensor(encode_tensor("w", torch.ones(2)))
receiver_class("broadcast").on_worker
""",
        forbidden=_SERVE,
    ),
    Contract(
        "agentrl.server.gateway.deployment",
        SERVER,
        """
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.deployment import served_model_names
served_model_names(GatewayConfig(), "builtin:tiny-qwen2")
""",
    ),
    Contract(
        "agentrl.agent_loops.tool_agent",
        AGENT_LOOPS,
        """
from agentrl.agent_loops.registry import get_agent_loop
get_agent_loop("tool_agent")
""",
    ),
    Contract(
        "agentrl.agent_loops.external",
        AGENT_LOOPS,
        """
from agentrl.agent_loops.registry import get_agent_loop
get_agent_loop("external")
""",
    ),
    Contract(
        "agentrl.tools",
        TOOLS,
        """
from agentrl.tools.parsers import get_tool_parser
get_tool_parser("hermes").parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
""",
    ),
    # The agent-loop worker reads its own sections of the config (AgentLoopWorkerConfig),
    # so not even the trainer's or the algorithms' config sections are loaded.
    Contract(
        "agentrl.rollout.worker",
        ROLLOUT,
        """
from agentrl.rollout.worker import AgentLoopWorkerConfig
AgentLoopWorkerConfig.of({"rollout": {"n": 2}, "model": {"path": "unused"}}).resolved()
""",
    ),
    # The manager resolves the workers' sections (as it does before starting them) and
    # plans episodes; it starts no Ray here.
    Contract(
        "agentrl.rollout.manager",
        ROLLOUT,
        """
from agentrl.core.types import SamplingParams
from agentrl.rollout.episode import make_requests
from agentrl.rollout.worker import AgentLoopWorkerConfig
AgentLoopWorkerConfig.of({"rollout": {"n": 2}, "model": {"path": "unused"}}).resolved()
make_requests([{"prompt": "p"}], 2, SamplingParams())
""",
    ),
    Contract(
        "agentrl.rollout.queue",
        ROLLOUT,
        """
import asyncio
from agentrl.rollout.queue import TrajectoryQueue

async def exercise():
    queue = TrajectoryQueue(batch_groups=1, group_size=2, max_staleness=1, max_concurrency=2)
    await queue.set_version(1)
    await queue.close()
    assert await queue.get_batch(timeout_s=1.0) is None

asyncio.run(exercise())
""",
    ),
    # Nothing of the project but the algorithms themselves and the core.
    Contract(
        "agentrl.algos",
        ALGORITHMS,
        """
import torch
from agentrl.algos.advantages import AdvantageInputs, compute_advantages
from agentrl.algos.config import AlgorithmConfig
mask = torch.ones(2, 3)
inputs = AdvantageInputs(token_level_rewards=mask, response_mask=mask, index=["a", "a"])
compute_advantages(inputs, AlgorithmConfig(adv_estimator="grpo"))
""",
    ),
    # An FSDP rank: the trainer's roles and the broadcast root they hold; no Ray Serve.
    Contract(
        "agentrl.trainer.fsdp_worker",
        TRAINER,
        """
import torch
from agentrl.server.weight_transport.base import bucketize
from agentrl.server.weight_transport.broadcast import BroadcastRoot
BroadcastRoot().stage(bucketize([("model.layers.0.w", torch.ones(2))], 1024), "float32")
""",
        forbidden=_SERVE,
    ),
]


def _loaded_by(module: str, exercise: str = "") -> dict[str, list[str]]:
    code = _PROBE.format(module=module, exercise=textwrap.dedent(exercise))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"importing {module} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("contract", CONTRACTS, ids=_contract_id)
def test_entry_point_loads_only_its_layer_and_those_below(contract: Contract) -> None:
    loaded = _loaded_by(contract.module, contract.exercise)
    leaked = _violations(contract, loaded["modules"])
    assert not leaked, (
        f"{contract.module} (imported and exercised) loads modules its layer may not "
        f"depend on: {leaked}"
    )
    fsdp_importers = [
        m for m in loaded["fsdp_importers"] if not m.startswith(_TOLERATED_FSDP_IMPORTERS)
    ]
    assert not fsdp_importers or contract.module.startswith("agentrl.trainer."), (
        f"importing {contract.module} loads torch.distributed.fsdp, imported by {fsdp_importers}"
    )


# Every module of the core package, found in its folder (a new one is checked too).
_CORE_MODULES = tuple(
    f"agentrl.core.{path.stem}"
    for path in sorted((Path(__file__).parents[2] / "agentrl" / "core").glob("*.py"))
    if path.stem != "__init__"
)
# What the core may not load: every process loads it, a rollout worker without a GPU too.
_HEAVY_PACKAGES = ("torch", "ray", "transformers", "vllm", "numpy", "tokenizers", "fastapi")


@pytest.mark.parametrize("module", _CORE_MODULES)
def test_core_loads_nothing_of_the_project_and_no_heavy_package(module: str) -> None:
    loaded = _loaded_by(module)["modules"]
    ours = [n for n in loaded if _matches(n, "agentrl.*")]
    outside_core = [n for n in ours if not _matches(n, "agentrl.core.*")]
    assert outside_core == ["agentrl"], f"{module} loads {outside_core}"
    heavy = sorted({n.partition(".")[0] for n in loaded} & set(_HEAVY_PACKAGES))
    assert not heavy, f"{module} loads {heavy}"


def test_violations_name_modules_outside_the_allow_list_and_forbidden_ones() -> None:
    contract = Contract("x", ("agentrl", "agentrl.core.*"), forbidden=("ray.serve.*",))
    loaded = ["agentrl", "agentrl.core.types", "agentrl.trainer.group", "ray", "ray.serve.api"]
    assert _violations(contract, loaded) == ["agentrl.trainer.group", "ray.serve.api"]


def test_probe_names_our_module_that_imports_fsdp() -> None:
    # The trainer's model builder imports FSDP after transformers already has: the probe
    # must still name it, or the FSDP check above could never fail.
    assert "agentrl.trainer.model" in _loaded_by("agentrl.trainer.model")["fsdp_importers"]


# An agent-loop worker that parses with vLLM's parsers loads vLLM's parser modules (and
# the model registry they reach for), never its engine, executor, workers or models.
_WORKER_WITH_VLLM_PARSERS = """
import json, sys, tempfile
from agentrl.models.tiny import build_tokenizer
from agentrl.rollout.worker import AgentLoopWorker

path = tempfile.mkdtemp()
tokenizer = build_tokenizer(path)
tokenizer.add_tokens(["<think>", "</think>"])
config = {
    "model": {"path": path},
    "rollout": {"tool_parser": "vllm:hermes", "reasoning_parser": "qwen3"},
}
worker = AgentLoopWorker(config, client=object(), tools={}, tokenizer=tokenizer)
parsed = worker._context("episode").tool_parser.parse(
    '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
)
assert [c.name for c in parsed.calls] == ["f"], parsed
assert worker._reasoning_parser.split("<think>r</think>c").content == "c"
print(json.dumps(sorted(n for n in sys.modules if n.startswith(("vllm", "agentrl")))))
"""
_VLLM_ENGINE = (
    "vllm.engine.*",
    "vllm.v1.engine.*",
    "vllm.v1.executor.*",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.model_loader.*",
)
_VLLM_MODEL_PLUMBING = ("interfaces", "interfaces_base", "registry")


def test_worker_with_vllm_parsers_loads_no_engine() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _WORKER_WITH_VLLM_PARSERS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "agentrl.tools.vllm_parsers" in loaded
    engine = [n for n in loaded if any(_matches(n, p) for p in _VLLM_ENGINE)]
    models = [
        n
        for n in loaded
        if n.startswith("vllm.model_executor.models.")
        and n.rsplit(".", 1)[1] not in _VLLM_MODEL_PLUMBING
    ]
    assert not engine and not models, f"the worker loads vLLM's engine: {engine + models}"
    leaked = _violations(Contract("worker", ROLLOUT), loaded)
    assert not leaked, leaked
