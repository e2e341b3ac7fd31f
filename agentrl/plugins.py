"""Load a user object (reward function, dataset class) from a file path or module + a name.

    fn = load_object("recipes/retool/reward.py", "compute_score")
    cls = load_object("my_pkg.datasets", "MyDataset")

A ``.py`` path is imported under a private module name derived from its absolute path, so
two files with the same stem do not collide and loading the same file twice reuses it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["PluginError", "load_object"]


class PluginError(ImportError):
    """A plugin file, module or attribute could not be loaded."""


def _module_from_file(path: Path) -> ModuleType:
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    module_name = f"agentrl_plugin_{resolved.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, resolved)
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


def load_object(path: str | Path, name: str) -> Any:
    """Return attribute ``name`` of the module at ``path`` (a ``.py`` file or a dotted module).

    Raises ``PluginError`` naming the file and the attributes it does define when ``name``
    is missing.
    """
    text = str(path)
    if text.endswith(".py") or "/" in text or Path(text).is_file():
        file = Path(text).expanduser()
        if not file.is_file():
            raise PluginError(f"plugin file {file} does not exist (cwd: {Path.cwd()})")
        module = _module_from_file(file)
    else:
        try:
            module = importlib.import_module(text)
        except ImportError as exc:
            raise PluginError(f"cannot import module {text!r}: {exc}") from exc
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise PluginError(f"{text} has no attribute {name!r}; it defines {public}")
    return getattr(module, name)
