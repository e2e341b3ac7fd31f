"""Load user code: plugin modules imported in every process, and single objects by name.

Plugins are the modules a config lists under ``plugins:`` (dotted module names or ``.py``
file paths). Importing them runs their registrations (``@register_agent_loop``,
``@register_tool_parser``, ``@register_scorer``, ...), so a registered name works in
every process that imports them: the driver, the agent-loop workers, reward process
pools and the gateway.

    import_plugins(["my_pkg.loops", "tools/my_tools.py"])   # driver: fails with the cause
    fn = load_object("recipes/retool/reward.py", "compute_score")
    cls = load_object("my_pkg.datasets", "MyDataset")

A ``.py`` file whose folder is on ``sys.path`` is imported under its own module name, so
a later ``import`` of it finds the same module (and its registrations run once). Any
other file is imported under a private name derived from its absolute path, so two files
with the same stem do not collide and loading the same file twice reuses it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "PLUGINS_ENV",
    "PluginError",
    "import_plugin",
    "import_plugins",
    "import_plugins_from_env",
    "load_object",
    "plugin_runtime_env",
]

PLUGINS_ENV = "AGENTRL_PLUGINS"
"""Environment variable (a JSON list of plugin specs) through which processes started
later (reward process pools, the gateway replica) learn which plugins to import."""


class PluginError(ImportError):
    """A plugin file, module or attribute could not be loaded."""


def _is_file_spec(text: str) -> bool:
    return text.endswith(".py") or "/" in text or os.sep in text


def _same_file(module: ModuleType | None, path: Path) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve() == path


def _own_module_name(path: Path) -> str | None:
    """The name ``import`` would give ``path`` (its folder is on ``sys.path``), if any."""
    name = path.stem
    if not name.isidentifier():
        return None
    folders = {Path(p or ".").resolve() for p in sys.path}
    if path.parent not in folders:
        return None
    existing = sys.modules.get(name)
    if existing is not None:
        return name if _same_file(existing, path) else None
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    return name if origin and Path(origin).resolve() == path else None


def _exec_file(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise PluginError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _module_from_file(path: Path) -> ModuleType:
    resolved = path.resolve()
    own_name = _own_module_name(resolved)
    if own_name is not None:
        return _import_module(own_name, str(path))
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    module_name = f"agentrl_plugin_{resolved.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    return _exec_file(resolved, module_name)


def _import_module(name: str, shown: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if name == missing or name.startswith(missing + "."):
            raise PluginError(
                f"cannot import module {shown!r}: {exc} (is it installed, or is its folder "
                f"on PYTHONPATH? cwd: {Path.cwd()}; a file can also be given by path, "
                "e.g. my_loops.py)"
            ) from exc
        raise PluginError(f"importing {shown} failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise PluginError(f"importing {shown} failed: {type(exc).__name__}: {exc}") from exc


def _file(text: str) -> Path:
    file = Path(text).expanduser()
    if not file.is_file():
        from agentrl.config_help import close_files  # the CLI's layer: only on this error

        hint = close_files(file)
        raise PluginError(
            f"plugin file {file} does not exist (cwd: {Path.cwd()}){f'; {hint}' if hint else ''}"
        )
    return file


def import_plugin(spec: str) -> str:
    """Import one plugin (a dotted module name or a ``.py`` file path).

    Returns the spec as other processes should see it: the module name, or the file's
    absolute path. Raises ``PluginError`` naming the plugin and the cause (the
    exception its import raised, or the missing file or module).
    """
    text = str(spec).strip()
    if not text:
        raise PluginError("empty plugin name in `plugins`")
    if _is_file_spec(text):
        file = _file(text)
        _module_from_file(file)
        return str(file.resolve())
    _import_module(text, text)
    return text


def _recorded() -> list[str]:
    raw = os.environ.get(PLUGINS_ENV)
    if not raw:
        return []
    try:
        specs = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PluginError(f"${PLUGINS_ENV} is not a JSON list of plugin names: {raw!r}") from exc
    if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
        raise PluginError(f"${PLUGINS_ENV} is not a JSON list of plugin names: {raw!r}")
    return specs


def import_plugins(specs: Sequence[str]) -> list[str]:
    """Import every plugin of ``specs`` in order; return their resolved specs.

    The resolved specs (file paths made absolute) are what worker processes should be
    given. They are also recorded in ``$AGENTRL_PLUGINS``, so processes this one starts
    later (a reward process pool, a local Ray cluster) can ``import_plugins_from_env``:
    the record is this call's plugins, so a second config in one process (a notebook)
    hands its processes its own plugins, not the first one's too. Importing a plugin
    twice is a no-op. Raises ``PluginError`` on the first failure.
    """
    resolved = [import_plugin(spec) for spec in specs]
    if resolved:
        os.environ[PLUGINS_ENV] = json.dumps(resolved)
    else:
        os.environ.pop(PLUGINS_ENV, None)
    return resolved


def import_plugins_from_env() -> list[str]:
    """Import the plugins recorded in ``$AGENTRL_PLUGINS`` (by a parent or the driver)."""
    return [import_plugin(spec) for spec in _recorded()]


def plugin_runtime_env() -> dict[str, Any]:
    """A Ray ``runtime_env`` that hands this process's plugins to an actor (which then
    calls ``import_plugins_from_env``); empty when no plugins were imported."""
    specs = _recorded()
    return {"env_vars": {PLUGINS_ENV: json.dumps(specs)}} if specs else {}


def load_object(path: str | Path, name: str) -> Any:
    """Return attribute ``name`` of the module at ``path`` (a ``.py`` file or a dotted module).

    Raises ``PluginError`` naming the file and the attributes it does define when ``name``
    is missing.
    """
    text = str(path)
    if _is_file_spec(text) or Path(text).is_file():
        module = _module_from_file(_file(text))
    else:
        module = _import_module(text, text)
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise PluginError(f"{text} has no attribute {name!r}; it defines {public}")
    return getattr(module, name)
