"""Load tools from YAML: ``tools: [{class_name, config, tool_schema}]``.

``class_name`` is an import path (``pkg.module.Class`` or ``pkg.module:Class``)
to a ``BaseTool`` subclass, or to a ready tool object such as a ``@tool``
function. ``tool_schema`` may be left out when the class has a default.

    tools:
      - class_name: agentrl.tools.code_interpreter.CodeInterpreterTool
        config: {wall_time_s: 5}
      - class_name: agentrl.tools.calculator.CalculatorTool
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.tools.base import BaseTool

__all__ = ["ToolSpec", "import_object", "load_tools"]


class ToolSpec(BaseModel):
    """One entry of the ``tools`` list."""

    model_config = ConfigDict(extra="forbid")

    class_name: str = Field(description="Import path of a BaseTool subclass or tool object.")
    config: dict[str, Any] = Field(default_factory=dict, description="Passed to the tool.")
    tool_schema: dict[str, Any] | None = Field(
        None, description="OpenAI function schema; omit to use the class default."
    )


ToolSource = str | Path | Mapping[str, Any] | Iterable[Mapping[str, Any] | ToolSpec | BaseTool]


def load_tools(source: ToolSource) -> dict[str, BaseTool]:
    """Build tools from a YAML file path, a ``{"tools": [...]}`` mapping, or a list of entries.

    List entries may be dicts, ``ToolSpec``s or ready ``BaseTool`` objects.
    Returns the tools by name.

    Raises:
        ValueError: a malformed file or entry, a bad schema, or a duplicate name;
            the message names the entry.
        ImportError: ``class_name`` cannot be imported.
        TypeError: ``class_name`` is not a tool.
    """
    entries = _entries(source)
    tools: dict[str, BaseTool] = {}
    for index, entry in enumerate(entries):
        tool = entry if isinstance(entry, BaseTool) else _build(index, entry)
        if tool.name in tools:
            raise ValueError(
                f"tools[{index}]: a second tool named {tool.name!r}; tool names must be unique"
            )
        tools[tool.name] = tool
    return tools


def import_object(path: str) -> Any:
    """Import ``pkg.module.Name`` or ``pkg.module:Name``.

    Raises:
        ImportError: the module or the name does not exist, with the path.
    """
    module_name, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not sep or not module_name or not attr:
        raise ImportError(f"{path!r} is not an import path like 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None


def _entries(source: ToolSource) -> list[Any]:
    if isinstance(source, str | Path):
        path = Path(source)
        try:
            source = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read tool config {str(path)!r}: {exc}") from exc
        if source is None:
            return []
    if isinstance(source, Mapping):
        if "tools" not in source:
            raise ValueError(
                f"a tool config needs a top-level 'tools' list, got keys {list(source)}"
            )
        source = source["tools"] or []
    if isinstance(source, str | bytes | Mapping) or not isinstance(source, Iterable):
        raise ValueError(f"'tools' must be a list of entries, got {type(source).__name__}")
    return list(source)


def _build(index: int, entry: Any) -> BaseTool:
    where = f"tools[{index}]"
    try:
        spec = entry if isinstance(entry, ToolSpec) else ToolSpec.model_validate(entry)
    except ValidationError as exc:
        raise ValueError(f"{where}: invalid tool entry: {exc}") from None
    where += f" ({spec.class_name})"
    target = import_object(spec.class_name)
    if isinstance(target, BaseTool):
        if spec.config or spec.tool_schema:
            raise ValueError(
                f"{where} is a ready tool object; config and tool_schema apply only to classes"
            )
        return target
    if not (isinstance(target, type) and issubclass(target, BaseTool)):
        raise TypeError(f"{where} is {target!r}, not a BaseTool subclass or tool object")
    try:
        return target(spec.config, spec.tool_schema)
    except ValueError as exc:  # pydantic's ValidationError included
        raise ValueError(f"{where}: invalid config or tool_schema: {exc}") from exc
