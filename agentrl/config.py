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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from agentrl.agent_loops.config import RolloutConfig
from agentrl.algos.config import AlgorithmConfig
from agentrl.config_help import (
    close_files,
    config_fields,
    did_you_mean,
    field_choices,
    is_section,
    type_name,
)
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
    "describe_validation_error",
    "load_config",
    "parse_override",
    "resolve_user_config",
]

logger = logging.getLogger(__name__)


class AgentRLConfig(Section):
    """Root of the configuration tree."""

    plugins: list[str] = Field(
        default_factory=list,
        description="User modules imported in every process that runs user code. Dotted "
        "module names (my_pkg.loops) or .py file paths; the driver, agent-loop workers, "
        "reward process pools, gateway and rollout replicas import them before any row is "
        "read, so that their registrations (@register_agent_loop, @register_tool_parser, "
        "@register_scorer, @register_receiver) work by name everywhere.",
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="The policy checkpoint, its tokenizer and dtype.",
    )
    data: DataConfig = Field(
        default_factory=DataConfig,
        description="Train and validation data, batching, length filter.",
    )
    server: ServerConfig = Field(
        default_factory=ServerConfig,
        description="Rollout servers: replicas, engine, router.",
    )
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig,
        description="OpenAI-compatible HTTP gateway for external agents.",
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="Agent loops: sampling, turns, tools, workers.",
    )
    reward: RewardConfig = Field(
        default_factory=RewardConfig,
        description="The reward function and how calls to it run.",
    )
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig,
        description="Advantages, policy loss, KL, DAPO, rollout IS.",
    )
    workers: WorkersConfig = Field(
        default_factory=WorkersConfig,
        description="FSDP2 actor, reference and critic ranks.",
    )
    trainer: TrainerConfig = Field(
        default_factory=TrainerConfig,
        description="Steps, run directory, validation, checkpoints.",
    )
    weight_sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig,
        description="How new weights reach the rollout replicas.",
    )
    logging: TrackingConfig = Field(
        default_factory=TrackingConfig,
        description="Metric sinks besides metrics.jsonl.",
    )
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig,
        description="Which nodes take trainer ranks and rollout replicas.",
    )
    ray: RayConfig = Field(
        default_factory=RayConfig,
        description="The Ray cluster to join, or the local one to start.",
    )

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
    def _partial_groups_fit_a_group(self) -> AgentRLConfig:
        size = self.trainer.min_group_size
        if size is not None and size > self.rollout.n:
            raise ValueError(
                f"trainer.min_group_size ({size}) must be at most rollout.n "
                f"({self.rollout.n}), the episodes of a group"
            )
        return self

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
    """A config file or override is malformed; the message names the file (or the
    override), the key and what is allowed there."""


@functools.cache
def _leaf_keys() -> tuple[str, ...]:
    return tuple(field.key for field in config_fields(AgentRLConfig))


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and YAML-parsed value."""
    if "=" not in item:
        hint = "" if item in _leaf_keys() else did_you_mean(item, _leaf_keys())
        raise ConfigError(
            f"override {item!r} has no `=`: write {item}=VALUE (a dotted key, `=`, then a "
            f"YAML value){f'; {hint}' if hint else ''}"
        )
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


def _read_tree(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """The mapping a YAML config file holds, and the line of each key in it."""
    if not path.is_file():
        hint = close_files(path)
        if not hint and path.suffix not in (".yaml", ".yml") and "." in path.name:
            hint = f"an override needs `=`: {path}=VALUE"
        raise ConfigError(
            f"config file {path} not found (cwd: {Path.cwd()}){f'; {hint}' if hint else ''}"
        )
    text = path.read_text()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
    return loaded or {}, _key_lines(node, ())


def _key_lines(node: Any, path: tuple[str, ...]) -> dict[tuple[str, ...], int]:
    lines: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = (*path, str(key.value))
            lines[here] = key.start_mark.line + 1
            lines.update(_key_lines(value, here))
    return lines


def _where(
    loc: tuple[str, ...], lines: dict[tuple[str, ...], int], overrides: list[str]
) -> tuple[str, int | None]:
    """Where the value at ``loc`` was set: the last override that sets it, else its line
    in the file (also returned as a number)."""
    for item in reversed(overrides):
        keys = tuple(k for k in item.split("=", 1)[0].strip().split(".") if k)
        if loc[: len(keys)] == keys or keys[: len(loc)] == loc:
            return f"override {item}", None
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return f"line {lines[loc[:end]]}", lines[loc[:end]]
    return "", None


def _locate(
    loc: tuple[Any, ...], root: type[BaseModel]
) -> tuple[list[str], Any, type[BaseModel] | None]:
    """The known key path at the start of a pydantic error ``loc`` of ``root``, the field
    there (None when the path is a section) and the section it ends in."""
    model: type[BaseModel] | None = root
    parts: list[str] = []
    field = None
    for part in loc:
        if model is not None and isinstance(part, str) and part in model.model_fields:
            field = model.model_fields[part]
            parts.append(part)
            model = field.annotation if is_section(field.annotation) else None
        elif isinstance(part, int) and parts:
            parts[-1] += f"[{part}]"
        else:
            break
    return parts, None if model is not None else field, model


def key_problem(
    error: dict[str, Any], root: type[BaseModel] = AgentRLConfig, at: str = ""
) -> tuple[str, str]:
    """The dotted key and the one-line problem of one pydantic error of ``root``: by
    default the whole tree, else the section at key path ``at`` (a key of another
    section is then not suggested)."""
    loc = tuple(error["loc"])
    parts, field, section = _locate(loc, root)
    key = ".".join([at, *parts] if at else parts)
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden" and section is not None:
        name = str(loc[len(parts)])
        prefix = f"{key}." if key else ""
        where = f"{prefix}{name}"
        moved = [k for k in _leaf_keys() if k.rsplit(".", 1)[-1] == name] if not at else []
        if moved:  # the key of another section
            return where, f"unknown key; did you mean {' or '.join(moved[:3])}?"
        hint = did_you_mean(name, section.model_fields, prefix)
        if hint:
            return where, f"unknown key; {hint}"
        if at:
            return where, "unknown key"
        return where, (
            f"unknown key; `agentrl config --help {key or 'all'}` lists the keys"
            + (f" of {key}" if key else "")
        )
    if field is None and section is not None and kind in ("model_type", "model_attributes_type"):
        return key, f"is a section: expected a mapping of its keys, got {value!r}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "missing":
        return key, "is required"
    if field is None:
        return key or "(top level)", message
    choices = field_choices(field.annotation)
    if choices and kind in ("literal_error", "enum"):
        hint = did_you_mean(str(value), choices)
        return key, f"{value!r} is not allowed; {hint + ' ' if hint else ''}one of: " + ", ".join(
            choices
        )
    if kind.endswith(("_type", "_parsing")) or kind == "int_from_float":
        return key, f"expected {type_name(field.annotation)}, got {value!r}"
    return key, f"{message.replace('Input should be', 'must be')}, got {value!r}"


def describe_validation_error(
    exc: ValidationError,
    source: str | Path | None = None,
    overrides: Sequence[str] = (),
    lines: dict[tuple[str, ...], int] | None = None,
) -> str:
    """``exc`` as one short block: a heading naming ``source`` (the config file), then one
    line per key: the key path, where it was set (its line or its override), what is
    wrong, a "did you mean" and the allowed values or the expected type; in the order of
    the file's lines, then the overrides'."""
    seen: dict[str, tuple[float, str]] = {}
    for error in exc.errors(include_url=False):
        key, problem = key_problem(error)
        if key in seen:
            continue  # one line per key (a union reports each of its types)
        loc = tuple(str(part) for part in error["loc"])
        where, line = _where(loc, lines or {}, list(overrides))
        order = line if line is not None else float("inf")
        seen[key] = (order, f"  {key}{f' ({where})' if where else ''}: {problem}")
    count = f"{len(seen)} error{'s' if len(seen) != 1 else ''}"
    origin = f"config file {source}" if source is not None else "config"
    via = " with overrides" if overrides else ""
    ordered = [text for _, text in sorted(seen.values(), key=lambda entry: entry[0])]
    return f"invalid {origin}{via} ({count}):\n" + "\n".join(ordered)


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> AgentRLConfig:
    """Load ``path`` (YAML; None = all defaults), apply dotted overrides, validate.

    A config loaded from a file that sets no ``trainer.run_dir`` runs in
    ``runs/<file name without .yaml>``, so runs of different config files never share a
    run directory (nor resume each other's checkpoints).

    Raises:
        ConfigError: the file is missing or is not a YAML mapping, an override is
            malformed, or a key or value is invalid (the message names the file, the key,
            its line or override, and what is allowed there).
    """
    tree: dict[str, Any] = {}
    lines: dict[tuple[str, ...], int] = {}
    if path is not None:
        tree, lines = _read_tree(Path(path))
    overrides = list(overrides or [])
    tree = apply_overrides(tree, overrides)
    try:
        cfg = AgentRLConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, path, overrides, lines)) from exc
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
    """One line per leaf field: ``dotted.name (default): description`` (``None`` for a
    field without one); ``config_help.config_fields`` gives the same as tuples."""
    return [
        f"{prefix}{field.key} (default {field.default!r}): {field.description or None}"
        for field in config_fields(model)
    ]
