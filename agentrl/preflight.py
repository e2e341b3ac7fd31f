"""Check, before anything starts, that a run can train: the files it reads exist, and
its algorithm is one the trainer can run.

A recipe whose data or cold-start model a script prepares (``recipes/retool/run_cpu.sh``)
fails here, naming each missing file, instead of deep inside a tokenizer or a worker.
Hub ids (``Org/Model``), ``hf:`` data sources and module names are not checked. An
advantage estimator or policy loss that no plugin registered, or one whose inputs the
trainer does not produce, fails here too rather than at the first step, after the servers
and workers have started.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentrl.algos.advantages import get_adv_estimator
from agentrl.algos.policy_losses import get_policy_loss
from agentrl.config import AgentRLConfig, ConfigError
from agentrl.data.readers import HF_PREFIX

__all__ = [
    "TRAINER_LACKS",
    "MissingInputs",
    "UnsupportedAlgorithm",
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
    """Raise ``MissingInputs`` naming every input of ``cfg`` that does not exist."""
    missing = missing_inputs(cfg, data_files)
    if missing:
        raise MissingInputs(
            f"missing input files (cwd: {Path.cwd()}): {'; '.join(missing)}. Create them "
            "first: a recipe's data and cold-start model come from its script"
        )


def check_algorithm(cfg: AgentRLConfig) -> None:
    """Raise ``UnsupportedAlgorithm`` if ``cfg`` (resolved: its plugins imported) names
    an advantage estimator or policy loss that is not registered, or an estimator in
    ``TRAINER_LACKS``."""
    algorithm = cfg.algorithm
    try:
        get_adv_estimator(algorithm.adv_estimator)
        get_policy_loss(algorithm.policy_loss.loss_mode)
    except ValueError as unknown:
        raise UnsupportedAlgorithm(f"{unknown} (a plugin registers its own)") from None
    lacking = TRAINER_LACKS.get(algorithm.adv_estimator)
    if lacking:
        raise UnsupportedAlgorithm(
            f"algorithm.adv_estimator={algorithm.adv_estimator} cannot run in the trainer: "
            f"{lacking}"
        )
