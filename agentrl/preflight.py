"""Check, before anything starts, that a run can train: the files it reads exist, its
rows name agent loops that exist, and its algorithm is one the trainer can run.

A recipe whose data or cold-start model a script prepares (``recipes/retool/run_cpu.sh``)
fails here, naming each missing file, instead of deep inside a tokenizer or a worker.
Hub ids (``Org/Model``), ``hf:`` data sources and module names are not checked. A row's
``agent_name`` that no loop registered, an advantage estimator or policy loss that no
plugin registered, or one whose inputs the trainer does not produce, fails here too rather
than at the first step, after Ray, the servers and the workers have started. None of these
checks loads torch or Ray.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from agentrl.algos.config import BUILTIN_ADV_ESTIMATORS, BUILTIN_POLICY_LOSSES
from agentrl.config import AgentRLConfig, ConfigError
from agentrl.config_help import close_files, did_you_mean
from agentrl.data.readers import HF_PREFIX, read_source

__all__ = [
    "TRAINER_LACKS",
    "MissingInputs",
    "UnknownAgentLoop",
    "UnsupportedAlgorithm",
    "agent_loop_rows",
    "check_agent_loops",
    "check_algorithm",
    "check_inputs",
    "missing_inputs",
]

TRAINER_LACKS = {
    "remax": "its baseline is the reward of a greedy response to each prompt "
    "(AdvantageInputs.reward_baselines), which the trainer does not generate; call the "
    "estimator from Python with your own baselines (docs/algorithms.md)",
}
"""Registered advantage estimators whose inputs ``agentrl train`` does not produce."""


class MissingInputs(ConfigError):
    """Files the config names (data, model or critic directory, tool or reward file) do
    not exist."""


class UnsupportedAlgorithm(ConfigError):
    """An advantage estimator or policy loss the trainer cannot run."""


class UnknownAgentLoop(ConfigError):
    """A data row (or ``rollout.agent_name``, the loop of rows that name none) names an
    agent loop that is neither registered nor importable."""


def _local_path(text: str) -> bool:
    """Whether ``model.path`` is written as a path (not a hub id such as ``Org/Model``)."""
    return text.startswith((".", "/", "~"))


def _is_file_spec(text: str) -> bool:
    return text.endswith((".py", ".yaml", ".yml")) or "/" in text


def missing_inputs(cfg: AgentRLConfig, data_files: Sequence[str]) -> list[str]:
    """``key path`` of every input of ``cfg`` that does not exist: ``data_files`` (the
    data the command reads), a model directory given by path (the critic's too, under
    GAE), the tool file and a reward file."""
    missing = (
        []
        if cfg.data.custom_cls_path  # a custom dataset reads its sources its own way
        else [
            f"data {source}"
            for source in data_files
            if not source.startswith(HF_PREFIX) and not Path(source).expanduser().is_file()
        ]
    )
    models = [("model.path", cfg.model.path)]
    if cfg.algorithm.adv_estimator == "gae":  # only GAE starts a critic
        models.append(("workers.critic.model_path", cfg.workers.critic.model_path))
    for key, model in models:
        if model and _local_path(model) and not Path(model).expanduser().exists():
            missing.append(f"{key} {model}")
    for key, value in (
        ("rollout.tool_config_path", cfg.rollout.tool_config_path),
        ("reward.reward_fn_path", cfg.reward.reward_fn_path),
    ):
        if value and _is_file_spec(value) and not Path(value).expanduser().is_file():
            missing.append(f"{key} {value}")
    return missing


def check_inputs(cfg: AgentRLConfig, data_files: Sequence[str]) -> None:
    """Raise ``MissingInputs`` naming every input of ``cfg`` that does not exist (and a
    file next to it whose name is close, if any)."""
    missing = missing_inputs(cfg, data_files)
    if missing:
        named = []
        for entry in missing:
            hint = close_files(entry.split(" ", 1)[1])
            named.append(f"{entry} ({hint})" if hint else entry)
        raise MissingInputs(
            f"missing input files (cwd: {Path.cwd()}): {'; '.join(named)}. Create them "
            "first: a recipe's data and cold-start model come from its script"
        )


def agent_loop_rows(cfg: AgentRLConfig, data_files: Sequence[str]) -> dict[str, tuple[str, int]]:
    """The agent loops the rows of ``data_files`` run, each with where the first row that
    runs it is and how many rows do. A row without ``agent_name`` runs
    ``rollout.agent_name``; ``hf:`` sources and custom datasets are not read."""
    if cfg.data.custom_cls_path:
        return {}
    loops: dict[str, tuple[str, int]] = {}
    for source in data_files:
        if source.startswith(HF_PREFIX):
            continue
        for where, raw in read_source(source):
            name = raw.get("agent_name") if isinstance(raw, dict) else None
            key = name or cfg.rollout.agent_name
            if key not in loops:
                loops[key] = (where if name else f"rollout.agent_name, the loop of {where}", 0)
            first, count = loops[key]
            loops[key] = (first, count + 1)
    return loops


def check_agent_loops(cfg: AgentRLConfig, data_files: Sequence[str]) -> None:
    """Raise ``UnknownAgentLoop`` naming the first row (and the number of rows) of each
    agent loop that ``cfg`` (resolved: its plugins imported) cannot find."""
    from agentrl.agent_loops.registry import get_agent_loop, registered_agent_loops

    problems = []
    for name, (where, count) in agent_loop_rows(cfg, data_files).items():
        try:
            get_agent_loop(name)
        except ValueError as exc:
            more = f" (and {count - 1} more row{'s' if count > 2 else ''})" if count > 1 else ""
            if ":" in name:
                problems.append(f"{where}{more}: {exc}")
                continue
            names = registered_agent_loops()
            hint = did_you_mean(name, names)
            problems.append(
                f"{where}{more}: unknown agent_name {name!r}; {f'{hint} ' if hint else ''}"
                f"registered: {', '.join(names)}"
            )
    if problems:
        raise UnknownAgentLoop(
            "\n  ".join(
                [
                    "data rows name agent loops that do not exist (a module listed under "
                    "`plugins:` registers its own; `pkg.module:Class` imports one):",
                    *problems,
                ]
            )
        )


def _check_registered(
    key: str, name: str, kind: str, builtin: Sequence[str], registry: str
) -> None:
    """Raise ``UnsupportedAlgorithm`` if no ``kind`` is registered as ``name``.
    ``registry`` is ``module:function`` listing the registered names. Registering one
    imports that (torch) module, so while it is not loaded the built-ins are all there is,
    and the check loads no torch."""
    module, _, lister = registry.partition(":")
    loaded = sys.modules.get(module)
    names = list(builtin) if loaded is None else getattr(loaded, lister)()
    if name not in names:
        hint = did_you_mean(name, names)
        raise UnsupportedAlgorithm(
            f"{key}: unknown {kind} {name!r}; {f'{hint} ' if hint else ''}registered: "
            f"{', '.join(sorted(names))} (a plugin registers its own)"
        )


def check_algorithm(cfg: AgentRLConfig) -> None:
    """Raise ``UnsupportedAlgorithm`` if ``cfg`` (resolved: its plugins imported) names
    an advantage estimator or policy loss that is not registered, or an estimator in
    ``TRAINER_LACKS``."""
    algorithm = cfg.algorithm
    _check_registered(
        "algorithm.adv_estimator",
        algorithm.adv_estimator,
        "advantage estimator",
        BUILTIN_ADV_ESTIMATORS,
        "agentrl.algos.advantages:registered_adv_estimators",
    )
    _check_registered(
        "algorithm.policy_loss.loss_mode",
        algorithm.policy_loss.loss_mode,
        "policy loss",
        BUILTIN_POLICY_LOSSES,
        "agentrl.algos.policy_losses:registered_policy_losses",
    )
    lacking = TRAINER_LACKS.get(algorithm.adv_estimator)
    if lacking:
        raise UnsupportedAlgorithm(
            f"algorithm.adv_estimator={algorithm.adv_estimator} cannot run in the trainer: "
            f"{lacking}"
        )
