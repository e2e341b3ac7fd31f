"""Environment sources: ``reasoning_gym:NAME``, ``gymnasium:ID``, ``textarena:ID``,
``verifiers:TASKSET``, ``openenv:URL`` / ``openenv:pkg.module:app``, names registered with
``@register_env``, and ``pkg.module:factory``.

``env_factory(source)`` resolves a source once and returns a factory; each episode calls
it (with the config's ``kwargs``) for an environment of its own. The package adapters
load their package only when a source names them.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable
from typing import Any

from agentrl.envs.base import EnvError

EnvFactory = Callable[..., Any]
"""Makes one environment: ``factory(**kwargs) -> TextEnv | SyncTextEnv``."""

ADAPTERS: dict[str, tuple[str, str]] = {
    "reasoning_gym": ("agentrl.envs.reasoning_gym", "reasoning-gym==0.1.25"),
    "gymnasium": ("agentrl.envs.gymnasium", "gymnasium==1.4.0"),
    "textarena": ("agentrl.envs.textarena", "textarena==0.7.4"),
    "verifiers": ("agentrl.envs.verifiers", "verifiers==0.4.0"),
    "openenv": ("agentrl.envs.openenv", "openenv-core==0.3.0"),
}
"""Adapter prefix -> (module defining ``available_ids()`` and ``make(env_id, **kwargs)``,
the package it needs). A module whose ids are open-ended (URLs, import paths) defines
``check_id(env_id)`` instead, raising ``UnknownEnvError`` for an id it cannot use."""

LIST_ALL_UP_TO = 30
"""Unknown ids list every available one up to this many; past it, the closest ones."""

_REGISTERED: dict[str, EnvFactory] = {}


class UnknownEnvError(EnvError, LookupError):
    """A source that names no environment; the message lists what there is."""


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Decorator: ``rollout.env.source: name`` makes environments with this factory (a
    class or a function returning a ``TextEnv``). List its module under ``plugins:``."""
    if ":" in name:
        raise ValueError(f"env name {name!r} may not contain ':' (that form is an import path)")

    def decorate(factory: EnvFactory) -> EnvFactory:
        existing = _REGISTERED.get(name)
        if existing is not None and existing is not factory:
            raise ValueError(f"env {name!r} is already registered by {existing!r}")
        _REGISTERED[name] = factory
        return factory

    return decorate


def available_envs(adapter: str | None = None) -> list[str]:
    """The sources there are: every id of ``adapter`` (``"textarena"``, ...) as
    ``adapter:ID``, or, without one, the registered names and the adapter prefixes."""
    if adapter is None:
        return sorted(_REGISTERED) + [f"{prefix}:" for prefix in ADAPTERS]
    return [f"{adapter}:{env_id}" for env_id in _adapter_ids(adapter)]


@functools.cache
def env_factory(source: str) -> EnvFactory:
    """The factory of ``source``; raises ``UnknownEnvError`` (listing what there is) for a
    source that names nothing, ``EnvError`` for an adapter whose package is missing."""
    prefix, sep, rest = source.partition(":")
    if not sep:
        if source in _REGISTERED:
            return _REGISTERED[source]
        raise UnknownEnvError(
            f"unknown env {source!r}; registered: {sorted(_REGISTERED) or 'none'} (register "
            "one with @register_env and list its module under `plugins:`), or name an "
            f"adapter ({', '.join(f'{p}:ID' for p in ADAPTERS)}) or an import path "
            "`pkg.module:factory`"
        )
    if prefix in ADAPTERS:
        adapter = _adapter(prefix)
        if hasattr(adapter, "check_id"):
            adapter.check_id(rest)
            return functools.partial(adapter.make, rest)
        ids = _adapter_ids(prefix)
        if rest not in ids:
            raise UnknownEnvError(
                f"unknown {prefix} environment {rest!r}; {_suggest(prefix, rest, ids)}"
            )
        return functools.partial(_adapter(prefix).make, rest)
    return _import_factory(source, prefix)


def _adapter(prefix: str) -> Any:
    module, requirement = ADAPTERS[prefix]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EnvError(
            f"{prefix}: environments need {requirement.split('==')[0]} ({exc}): pip install "
            f"'agentrl[envs]' (or {requirement})"
        ) from exc


def _adapter_ids(prefix: str) -> list[str]:
    if prefix not in ADAPTERS:
        raise UnknownEnvError(f"unknown env adapter {prefix!r}; adapters: {sorted(ADAPTERS)}")
    return _adapter(prefix).available_ids()


def _suggest(prefix: str, wanted: str, ids: list[str]) -> str:
    if len(ids) <= LIST_ALL_UP_TO:
        return f"available: {', '.join(ids)}"
    close = difflib.get_close_matches(wanted, ids, n=8, cutoff=0.5)
    closest = f"closest: {', '.join(close)}; " if close else ""
    return f"{closest}{len(ids)} available (agentrl.envs.available_envs({prefix!r}) lists them)"


def import_callable(spec: str | Callable[..., Any], what: str) -> Callable[..., Any]:
    """``spec`` itself when callable, else the object an import path ``pkg.module:name``
    names; raises ``EnvError`` naming ``what`` (``"gymnasium parse"``) when it is neither."""
    if callable(spec):
        return spec
    from agentrl.plugins import PluginError, load_object

    module, sep, attr = str(spec).partition(":")
    if not (sep and module and attr):
        raise EnvError(f"{what} {spec!r} is not an import path `pkg.module:name`")
    try:
        value = load_object(module, attr)
    except PluginError as exc:
        raise EnvError(f"{what} {spec!r} does not import: {exc}") from exc
    if not callable(value):
        raise EnvError(f"{what} {spec!r} is a {type(value).__name__}, not a callable")
    return value


def _import_factory(source: str, prefix: str) -> EnvFactory:
    try:
        return import_callable(source, "env source")
    except EnvError as exc:
        raise UnknownEnvError(
            f"{exc}; and {prefix!r} is no adapter ({', '.join(ADAPTERS)})"
        ) from exc
