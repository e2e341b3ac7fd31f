"""Agent-loop registry: ``@register_agent_loop("name")`` and lookup by name or import path."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from agentrl.agent_loops.base import AgentLoopBase

_LOOPS: dict[str, type[AgentLoopBase]] = {}
_BUILTIN_MODULES = (
    "agentrl.agent_loops.single_turn",
    "agentrl.agent_loops.tool_agent",
    "agentrl.agent_loops.external",
    "agentrl.envs.loop",
)


def register_agent_loop(name: str) -> Callable[[type[AgentLoopBase]], type[AgentLoopBase]]:
    """Class decorator: dataset rows with ``agent_name: name`` run this loop."""

    def decorate(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
        if not issubclass(cls, AgentLoopBase):
            raise TypeError(f"{cls.__name__} must subclass AgentLoopBase")
        existing = _LOOPS.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"agent loop {name!r} is already registered by {existing!r}")
        _LOOPS[name] = cls
        return cls

    return decorate


def registered_agent_loops() -> list[str]:
    """The names ``get_agent_loop`` finds: the built-in loops' and the plugins'."""
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    return sorted(_LOOPS)


def get_agent_loop(name: str) -> type[AgentLoopBase]:
    """The loop class for a registered ``name`` or an import path ``pkg.module:Class``."""
    if name in _LOOPS:
        return _LOOPS[name]
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    if name in _LOOPS:
        return _LOOPS[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import agent loop {name!r}: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise ValueError(f"{name!r} is not an AgentLoopBase subclass")
        return cls
    raise ValueError(
        f"unknown agent loop {name!r}; registered: {sorted(_LOOPS)} (list the module "
        "that registers it under `plugins:` in the config, or give an import path "
        "`pkg.module:Class`)"
    )
