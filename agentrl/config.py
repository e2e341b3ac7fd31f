"""Typed configuration: one pydantic tree, loaded from YAML with dotted overrides.

This module only composes the tree: each subsystem owns its section next to its code
(``server`` in ``agentrl.server.config``, ``rollout`` in ``agentrl.agent_loops.config``,
``trainer``/``workers`` in ``agentrl.trainer.config``, ...), and the sections several
layers share (``model``, ``ray``) and the section base live in ``agentrl.core.config``.
Only the CLI and the launchers import it; a rollout replica or an agent loop imports
just the sections it reads. Every section is re-exported here.

Every field has a default and a description, so ``agentrl <cmd> --help`` and
``describe_config()`` can list every knob. Overrides use dotted paths, e.g.
``server.num_replicas=2`` or ``model.path=/ckpt``; values are parsed as YAML
scalars/lists (``true``, ``3``, ``0.5``, ``[1, 2]``).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, model_validator

from agentrl.agent_loops.config import RolloutConfig
from agentrl.algos.config import AlgorithmConfig
from agentrl.core.config import (
    LEGACY_WEIGHT_SYNC_KEYS,
    ModelConfig,
    RayConfig,
    Section,
    WeightSyncConfig,
)
from agentrl.data.config import DataConfig
from agentrl.models import resolve_model_config
from agentrl.placement import PlacementConfig
from agentrl.plugins import import_plugins
from agentrl.reward.config import RewardConfig
from agentrl.server.config import EngineConfig, RouterConfig, ServerConfig
from agentrl.server.gateway.config import GatewayConfig
from agentrl.tracking import TrackingConfig
from agentrl.trainer.config import TrainerConfig, WorkersConfig

__all__ = [
    "AgentRLConfig",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "EngineConfig",
    "GatewayConfig",
    "ModelConfig",
    "PlacementConfig",
    "RayConfig",
    "RewardConfig",
    "RolloutConfig",
    "RouterConfig",
    "ServerConfig",
    "TrackingConfig",
    "TrainerConfig",
    "WeightSyncConfig",
    "WorkersConfig",
    "apply_overrides",
    "describe_config",
    "load_config",
    "parse_override",
    "resolve_user_config",
]

logger = logging.getLogger(__name__)


class AgentRLConfig(Section):
    """Root of the configuration tree."""

    plugins: list[str] = Field(
        default_factory=list,
        description="User modules imported in every process that runs user code (driver, "
        "agent-loop workers, reward process pools, gateway, rollout replicas) before any row "
        "is read, so that their registrations (@register_agent_loop, @register_tool_parser, "
        "@register_scorer, @register_receiver) work by name everywhere: dotted module names "
        "(my_pkg.loops) or .py file paths.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    logging: TrackingConfig = Field(default_factory=TrackingConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @model_validator(mode="before")
    @classmethod
    def _weight_sync_keys_moved_out_of_trainer(cls, data: Any) -> Any:
        """``trainer.weight_sync*`` (the old keys) still work: they go to ``weight_sync``."""
        trainer = data.get("trainer") if isinstance(data, dict) else None
        if not isinstance(trainer, dict):
            return data
        legacy = [key for key in LEGACY_WEIGHT_SYNC_KEYS if key in trainer]
        if not legacy:
            return data
        data, trainer = dict(data), dict(trainer)
        section = data.get("weight_sync") or {}
        if not isinstance(section, dict):
            return data  # the section's own validation reports it
        section = dict(section)
        for key in legacy:
            new = LEGACY_WEIGHT_SYNC_KEYS[key]
            if new in section:
                raise ValueError(
                    f"both trainer.{key} and weight_sync.{new} are set; keep weight_sync.{new}"
                )
            section[new] = trainer.pop(key)
        data["trainer"], data["weight_sync"] = trainer, section
        _warn_moved(
            ", ".join(
                f"trainer.{key} → weight_sync.{LEGACY_WEIGHT_SYNC_KEYS[key]}" for key in legacy
            )
        )
        return data

    @model_validator(mode="before")
    @classmethod
    def _actor_gather_bucket_knob_is_gone(cls, data: Any) -> Any:
        """``workers.actor.weight_sync_bucket_mb`` (removed) is ignored with a warning:
        ``weight_sync.bucket_mb`` sizes the gathered buckets too."""
        workers = data.get("workers") if isinstance(data, dict) else None
        actor = workers.get("actor") if isinstance(workers, dict) else None
        if not isinstance(actor, dict) or "weight_sync_bucket_mb" not in actor:
            return data
        actor = {k: v for k, v in actor.items() if k != "weight_sync_bucket_mb"}
        logger.warning(
            "workers.actor.weight_sync_bucket_mb is ignored: weight_sync.bucket_mb sizes the "
            "buckets rank 0 gathers as well as those it pushes"
        )
        return {**data, "workers": {**workers, "actor": actor}}

    @model_validator(mode="after")
    def _gateway_renders_tools_as_the_agent_loops_do(self) -> AgentRLConfig:
        """Gateway tool and parser settings left unset take the rollout's (one setting,
        one rule)."""
        for name in (
            "tools_in_system_prompt",
            "tools_prompt_template",
            "tool_parser",
            "reasoning_parser",
        ):
            if name not in self.gateway.model_fields_set:
                setattr(self.gateway, name, getattr(self.rollout, name))
        return self


@functools.cache
def _warn_moved(renames: str) -> None:
    logger.warning("deprecated config keys (they moved to the weight_sync section): %s", renames)


class ConfigError(ValueError):
    """A config file or override is malformed."""


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and YAML-parsed value."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like `section.key=value`")
    key, raw = item.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
    return keys, value


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``tree`` with each dotted override written into it."""
    result = yaml.safe_load(yaml.safe_dump(tree)) or {}
    for item in overrides:
        keys, value = parse_override(item)
        node = result
        for k in keys[:-1]:
            child = node.setdefault(k, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: `{k}` is a value, not a section")
            node = child
        node[keys[-1]] = value
    return result


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> AgentRLConfig:
    """Load ``path`` (YAML; None = all defaults), apply dotted overrides, validate.

    A config loaded from a file that sets no ``trainer.run_dir`` runs in
    ``runs/<file name without .yaml>``, so runs of different config files never share a
    run directory (nor resume each other's checkpoints).
    """
    tree: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"config file {path} not found")
        text = Path(path).read_text()
        loaded = yaml.safe_load(text)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
        tree = loaded or {}
    tree = apply_overrides(tree, overrides or [])
    cfg = AgentRLConfig.model_validate(tree)
    if path is not None and "run_dir" not in cfg.trainer.model_fields_set:
        cfg.trainer.run_dir = f"runs/{Path(path).stem}"
    return cfg


def resolve_user_config(cfg: AgentRLConfig) -> AgentRLConfig:
    """A copy of ``cfg`` ready to run in any process: ``builtin:`` model names resolved to
    checkpoint directories, and the plugins imported (their specs resolved, file paths
    made absolute). The CLI, ``rollout()``, ``Trainer`` and ``AgentLoopManager`` all start
    with it, so user modules are imported before any row or registered name is read,
    from Python as from the command line. Idempotent; raises ``PluginError`` naming a
    plugin that fails to import."""
    return cfg.model_copy(
        update={"model": resolve_model_config(cfg.model), "plugins": import_plugins(cfg.plugins)}
    )


def describe_config(model: type[BaseModel] = AgentRLConfig, prefix: str = "") -> list[str]:
    """One line per leaf field: ``dotted.name (default): description``."""
    lines = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines.extend(describe_config(annotation, f"{prefix}{name}."))
            continue
        default = field.get_default(call_default_factory=True)
        lines.append(f"{prefix}{name} (default {default!r}): {field.description}")
    return lines
