"""Layer contracts, checked on what a process *loads*, not only on direct imports.

Each entry point is imported in a fresh interpreter and the ``agentrl`` modules that
ended up in ``sys.modules`` are compared with what its layer may depend on
(docs/architecture.md, "Layers"): a rollout replica loads no trainer, algorithm or
agent-loop code; an agent loop or an agent-loop worker no trainer or algorithm code; a
tool no agent-loop or trainer code; the algorithms nothing of the project but the core;
the core nothing of the project and no heavy package (torch, Ray, transformers, ...).
No entry point loads FSDP, except where transformers itself does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Records every module whose import statements name torch.distributed.fsdp (or its
# composable alias), loaded already or not, by wrapping builtins.__import__.
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
print(json.dumps({{
    "agentrl": sorted(n for n in sys.modules if n == "agentrl" or n.startswith("agentrl.")),
    "top_level": sorted({{n.partition(".")[0] for n in sys.modules}}),
    "fsdp_importers": sorted(_importers),
}}))
"""

# transformers >= 5 imports FSDP itself as soon as AutoTokenizer or AutoModel is imported
# (transformers.distributed.fsdp, from its generation utils): every process that
# tokenizes loads it, and no layering of ours can avoid that. Any other importer, above
# all one of our modules, breaks the contract.
_TOLERATED_FSDP_IMPORTERS = ("transformers.",)


@dataclass(frozen=True)
class Contract:
    """``module`` may load no module matching ``forbidden`` unless it matches ``allowed``.

    A pattern ``pkg.*`` matches ``pkg`` and everything under it; any other pattern
    matches that one module.
    """

    module: str
    forbidden: tuple[str, ...]
    allowed: tuple[str, ...] = ()


def _contract_id(contract: Contract) -> str:
    return contract.module


def _matches(name: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return name == package or name.startswith(package + ".")
    return name == pattern


def _violations(contract: Contract, loaded: list[str]) -> list[str]:
    return [
        name
        for name in loaded
        if any(_matches(name, p) for p in contract.forbidden)
        and not any(_matches(name, p) for p in contract.allowed)
    ]


# No production entry point loads the test helpers (agentrl.testing).
_SERVER_FORBIDS = (
    "agentrl.trainer.*",
    "agentrl.algos.*",
    "agentrl.agent_loops.*",
    "agentrl.testing.*",
)
_LOOPS_FORBID = ("agentrl.trainer.*", "agentrl.algos.*", "agentrl.testing.*")

CONTRACTS = [
    Contract("agentrl.server.deployment", _SERVER_FORBIDS),
    Contract("agentrl.server.vllm_engine", _SERVER_FORBIDS),
    Contract("agentrl.server.gateway.deployment", _SERVER_FORBIDS),
    Contract("agentrl.agent_loops.tool_agent", _LOOPS_FORBID),
    Contract("agentrl.agent_loops.external", _LOOPS_FORBID),
    Contract("agentrl.tools", ("agentrl.agent_loops.*", "agentrl.trainer.*", "agentrl.testing.*")),
    # The agent-loop worker reads its own sections of the config (AgentLoopWorkerConfig),
    # so not even the trainer's or the algorithms' config sections are loaded.
    Contract("agentrl.rollout.worker", _LOOPS_FORBID),
    # Nothing of the project but the algorithms themselves and the core.
    Contract(
        "agentrl.algos",
        ("agentrl.*",),
        allowed=("agentrl", "agentrl.algos.*", "agentrl.core.*"),
    ),
]


def _loaded_by(module: str) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"importing {module} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("contract", CONTRACTS, ids=_contract_id)
def test_entry_point_loads_only_the_layers_below_it(contract: Contract) -> None:
    loaded = _loaded_by(contract.module)
    leaked = _violations(contract, loaded["agentrl"])
    assert not leaked, (
        f"importing {contract.module} loads modules its layer may not depend on: {leaked}"
    )
    fsdp_importers = [
        m for m in loaded["fsdp_importers"] if not m.startswith(_TOLERATED_FSDP_IMPORTERS)
    ]
    assert not fsdp_importers, (
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
    loaded = _loaded_by(module)
    outside_core = [n for n in loaded["agentrl"] if not _matches(n, "agentrl.core.*")]
    assert outside_core == ["agentrl"], f"{module} loads {outside_core}"
    heavy = sorted(set(loaded["top_level"]) & set(_HEAVY_PACKAGES))
    assert not heavy, f"{module} loads {heavy}"


def test_violations_names_forbidden_modules_and_spares_allowed_ones() -> None:
    contract = Contract("x", ("agentrl.trainer.*",), allowed=("agentrl.trainer.config",))
    loaded = ["agentrl.trainer.config", "agentrl.trainer.group", "agentrl.trainers_extra"]
    assert _violations(contract, loaded) == ["agentrl.trainer.group"]


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
    leaked = _violations(Contract("worker", _LOOPS_FORBID), loaded)
    assert not leaked, leaked
