"""Check, before anything starts, that the files a run reads exist.

A recipe whose data or cold-start model a script prepares (``recipes/retool/run_cpu.sh``)
fails here, naming each missing file, instead of deep inside a tokenizer or a worker.
Hub ids (``Org/Model``), ``hf:`` data sources and module names are not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentrl.config import AgentRLConfig, ConfigError
from agentrl.data.readers import HF_PREFIX

__all__ = ["MissingInputs", "check_inputs", "missing_inputs"]


class MissingInputs(ConfigError):
    """Files the config names (data, model directory, tool or reward file) do not exist."""


def _local_path(text: str) -> bool:
    """Whether ``model.path`` is written as a path (not a hub id such as ``Org/Model``)."""
    return text.startswith((".", "/", "~"))


def _is_file_spec(text: str) -> bool:
    return text.endswith((".py", ".yaml", ".yml")) or "/" in text


def missing_inputs(cfg: AgentRLConfig, data_files: Sequence[str]) -> list[str]:
    """``key path`` of every input of ``cfg`` that does not exist: ``data_files`` (the
    data the command reads), a model directory given by path, the tool file and a
    reward file."""
    missing = (
        []
        if cfg.data.custom_cls_path  # a custom dataset reads its sources its own way
        else [
            f"data {source}"
            for source in data_files
            if not source.startswith(HF_PREFIX) and not Path(source).expanduser().is_file()
        ]
    )
    model = cfg.model.path
    if model and _local_path(model) and not Path(model).expanduser().exists():
        missing.append(f"model.path {model}")
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
