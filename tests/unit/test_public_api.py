"""The flat public namespace: ``agentrl`` and ``agentrl.testing`` export lazily what users
write against, load nothing heavy on import, and hand out the very objects of the old
import paths; ``agentrl.rollout`` is callable whatever was imported before it."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

import agentrl
import agentrl.testing

HEAVY = ("torch", "ray", "vllm", "transformers")

# Each exported name at the import path code used before the flat namespace existed
# (``module:name`` where it is called otherwise there).
OLD_PATHS = {
    "AgentLoopBase": "agentrl.agent_loops.base",
    "register_agent_loop": "agentrl.agent_loops.registry",
    "Conversation": "agentrl.agent_loops.conversation",
    "AgentLoopOutput": "agentrl.core.trajectory",
    "TrajectoryBuilder": "agentrl.core.trajectory",
    "SamplingParams": "agentrl.core.types",
    "tool": "agentrl.tools",
    "BaseTool": "agentrl.tools",
    "ToolResponse": "agentrl.tools",
    "OpenAIFunctionToolSchema": "agentrl.tools",
    "load_config": "agentrl.config",
    "AgentRLConfig": "agentrl.config",
    "ConfigError": "agentrl.config",
    "RewardFunction": "agentrl.reward.function",
    "arollout": "agentrl.rollout",
    "init_ray": "agentrl.server.launch",
    "start_rollout_servers": "agentrl.server.launch",
    "stop_rollout_servers": "agentrl.server.launch",
    "resolve_model_config": "agentrl.models",
    "ObjectStoreSync": "agentrl.server.weight_transport.object_store",
    "ToolAgentLoop": "agentrl.agent_loops.tool_agent",
    "ExternalAgentLoop": "agentrl.agent_loops.external",
    "ExternalAgentConfig": "agentrl.agent_loops.external_config",
    "RolloutConfig": "agentrl.config",
    "load_tools": "agentrl.tools",
    "get_tool_parser": "agentrl.tools.parsers",
    "get_reasoning_parser": "agentrl.tools.reasoning",
    "register_env": "agentrl.envs",
    "env_factory": "agentrl.envs",
    "StepResult": "agentrl.envs",
    "EnvAgentLoop": "agentrl.envs",
    "reasoning_gym_rows": "agentrl.envs.reasoning_gym",
    "verifiers_tools": "agentrl.envs.verifiers",
    "load_reward_fn": "agentrl.reward",
    "RewardManager": "agentrl.reward",
    "RewardRequest": "agentrl.reward",
    "RewardJudge": "agentrl.reward.judge",
    "JudgeConfig": "agentrl.reward.config",
    "episode_info": "agentrl.rollout.metrics",
    "MetricsLogger": "agentrl.tracking",
    "plot_run": "agentrl.plot",
    "AdvantageInputs": "agentrl.algos",
    "compute_advantages": "agentrl.algos",
    "scores_to_token_rewards": "agentrl.algos",
    "AlgorithmConfig": "agentrl.algos",
    "get_policy_loss": "agentrl.algos",
    "agg_loss": "agentrl.algos",
    "compute_rollout_is_weights": "agentrl.algos",
    "AgentLoopWorker": "agentrl.rollout.worker",
    "make_requests": "agentrl.rollout.episode",
    "TrajectoryQueue": "agentrl.rollout.queue",
    "GatewayConfig": "agentrl.server.gateway",
    "GatewayService": "agentrl.server.gateway.service",
    "gateway_app": "agentrl.server.gateway.app:build_app",
    "InMemorySink": "agentrl.server.gateway.sink",
    "QueueSink": "agentrl.server.gateway.sink",
}
TESTING_OLD_PATHS = {
    "ScriptedClient": "agentrl.testing.scripted",
    "ScriptedCall": "agentrl.testing.scripted",
    "loop_context": "agentrl.testing.context",
    "MultiTurnChatLoop": "agentrl.testing.loops",
    "ADD_TOOL_SCHEMA": "agentrl.testing.tools",
    "family": "agentrl.testing.families",
    "ModelFamily": "agentrl.testing.families",
    "FAMILIES": "agentrl.testing.families",
    "FidelityHarness": "agentrl.testing.fidelity",
    "random_conversation": "agentrl.testing.fidelity",
}


def run_fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object, returned here."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["agentrl", "agentrl.testing"])
def test_importing_the_namespace_loads_no_heavy_package(module):
    loaded = run_fresh(f"""
        import json, sys
        import {module} as namespace
        dir(namespace), namespace.__all__
        print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]))
    """)
    assert loaded == [], f"import {module} loaded {loaded}"


def test_the_contract_names_are_exported():
    assert sorted(agentrl.__all__) == sorted([*OLD_PATHS, "rollout", "__version__"])
    assert sorted(agentrl.testing.__all__) == sorted(
        [*TESTING_OLD_PATHS, "default_tiny_checkpoint"]
    )


@pytest.mark.parametrize(
    ("namespace", "paths"), [(agentrl, OLD_PATHS), (agentrl.testing, TESTING_OLD_PATHS)]
)
def test_every_name_is_the_object_of_its_old_import_path(namespace, paths):
    for name, path in paths.items():
        module, _, attribute = path.partition(":")
        old = getattr(importlib.import_module(module), attribute or name)
        assert getattr(namespace, name) is old, name


@pytest.mark.parametrize("namespace", [agentrl, agentrl.testing])
def test_no_export_is_shadowed_by_a_submodule_of_the_same_name(namespace):
    """Importing ``pkg.name`` rebinds ``pkg.name`` to that module; only ``rollout`` is
    such a name, and its package is callable (below)."""
    clashes = [
        name
        for name in namespace.__all__
        if importlib.util.find_spec(f"{namespace.__name__}.{name}") is not None
    ]
    assert clashes == (["rollout"] if namespace is agentrl else [])


def test_dir_lists_every_export():
    assert set(agentrl.__all__) <= set(dir(agentrl))
    assert set(agentrl.testing.__all__) <= set(dir(agentrl.testing))


@pytest.mark.parametrize("namespace", [agentrl, agentrl.testing])
def test_an_unknown_name_is_an_attribute_error_naming_the_module(namespace):
    with pytest.raises(AttributeError, match=rf"module '{namespace.__name__}' has no attribute"):
        namespace.no_such_name  # noqa: B018
    with pytest.raises(ImportError, match="no_such_name"):
        exec(f"from {namespace.__name__} import no_such_name", {})


def test_the_reward_function_protocol_names_the_arguments_the_loader_passes():
    from agentrl.reward.loader import _ARGS

    parameters = list(inspect.signature(agentrl.RewardFunction.__call__).parameters)
    assert tuple(parameters[1:]) == _ARGS  # after self


# Calls agentrl.rollout for real: limit=0 is refused by arollout (a ConfigError) before
# anything starts, which shows the call reached the function with its arguments.
_ROLLOUT_PROBE = """
    import inspect, json, sys

    def call(rollout):
        try:
            rollout(agentrl.load_config(None), rows=[{{"prompt": []}}], limit=0)
        except agentrl.ConfigError as exc:
            return str(exc)

    {first}
    {second}
    from agentrl import rollout
    from agentrl.rollout import rollout as function
    from agentrl.rollout.run import rollout as documented
    print(json.dumps({{
        "error": call(agentrl.rollout),
        "imported_error": call(rollout),
        "same": rollout is agentrl.rollout is sys.modules["agentrl.rollout"],
        "old_path_is_function": function is documented and inspect.isfunction(function),
        "signature": str(inspect.signature(rollout)) == str(inspect.signature(documented)),
        "doc": rollout.__doc__ == documented.__doc__,
        "queue": agentrl.rollout.queue.TrajectoryQueue.__name__,
    }}))
"""


@pytest.mark.parametrize(
    "submodule_first", [False, True], ids=["attribute-first", "submodule-first"]
)
def test_rollout_is_callable_before_and_after_a_rollout_submodule_is_imported(submodule_first):
    steps = ["import agentrl; call(agentrl.rollout)", "import agentrl.rollout.queue"]
    first, second = reversed(steps) if submodule_first else steps
    result = run_fresh(_ROLLOUT_PROBE.format(first=first, second=second))
    assert result == {
        "error": "limit must be at least 1, got 0",
        "imported_error": "limit must be at least 1, got 0",
        "same": True,
        "old_path_is_function": True,
        "signature": True,
        "doc": True,
        "queue": "TrajectoryQueue",
    }
