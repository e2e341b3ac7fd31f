"""``@tool``: a typed Python function becomes a ``BaseTool`` with a generated schema.

The description is the docstring's text before its first section; each
parameter's description comes from a Google-style ``Args:`` section (or from
``Annotated[T, "description"]``). Supported annotations: ``str``, ``int``,
``float``, ``bool``, ``list[T]``, ``dict[str, T]``, ``Literal[...]`` (an
enum), ``T | None``/``Optional[T]`` and unions of those. Parameters with a
default are optional. Sync functions run in a worker thread, off the loop.

    @tool
    def add(a: int, b: int = 1) -> int:
        '''Add two integers.

        Args:
            a: The first addend.
            b: The second addend.
        '''
        return a + b
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, overload

from agentrl.tools.base import BaseTool, ToolResponse
from agentrl.tools.schema import OpenAIFunctionToolSchema

__all__ = ["FunctionTool", "function_schema", "tool"]

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?|See Also):\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class FunctionTool(BaseTool):
    """A ``BaseTool`` that calls a plain Python function with the model's arguments.

    The function's return value becomes the response: a ``ToolResponse`` as is,
    a ``str`` as its text, anything else as JSON (or ``str()`` if not JSON-able).
    Calling the tool object calls the function directly.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        tool_schema: OpenAIFunctionToolSchema | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(config, tool_schema or function_schema(fn))
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Call the function with ``parameters`` as keyword arguments."""
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(**parameters)
        else:
            value = await asyncio.to_thread(self.fn, **parameters)
        return _to_response(value), 0.0, {}


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed function into a ``FunctionTool``: ``@tool`` or ``@tool(name=..., ...)``.

    Args:
        fn: the function (when used without parentheses).
        name: the tool name (default: the function's name).
        description: the tool description (default: from the docstring).

    Raises:
        TypeError: a parameter is unannotated, variadic, or of an unsupported type.
    """

    def wrap(func: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(func, function_schema(func, name=name, description=description))

    return wrap(fn) if fn is not None else wrap


def function_schema(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
) -> OpenAIFunctionToolSchema:
    """The OpenAI function schema of ``fn``, from its signature and docstring."""
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn, include_extras=True)
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        where = f"parameter {param.name!r} of {fn.__qualname__}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{where}: *args/**kwargs cannot be described in a tool schema")
        if param.name not in hints:
            raise TypeError(f"{where} has no type annotation; annotate it (e.g. `: str`)")
        schema = _json_schema(hints[param.name], where)
        if param.name in arg_docs:
            schema.setdefault("description", arg_docs[param.name])
        if param.default is param.empty:
            required.append(param.name)
        elif param.default is not None and _is_json(param.default):
            schema["default"] = param.default
        properties[param.name] = schema
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name or fn.__name__,
                "description": description if description is not None else summary,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": False,
                },
            },
        }
    )


def _json_schema(annotation: Any, where: str) -> dict[str, Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = _json_schema(args[0], where)
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = notes[0]
        return schema
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if annotation is Any:
        return {}
    if annotation is list or origin is list:
        return {"type": "array", **({"items": _json_schema(args[0], where)} if args else {})}
    if annotation is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: JSON object keys are strings, got {annotation}")
        values = {"additionalProperties": _json_schema(args[1], where)} if args else {}
        return {"type": "object", **values}
    if origin is typing.Literal:
        types_ = sorted({_SCALARS.get(type(v), "null") for v in args})
        return {"type": types_[0] if len(types_) == 1 else types_, "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        schemas = [_json_schema(a, where) for a in members]
        nullable = len(members) < len(args)
        if len(schemas) == 1:
            return _nullable(schemas[0]) if nullable else schemas[0]
        return {"anyOf": schemas + ([{"type": "null"}] if nullable else [])}
    raise TypeError(
        f"{where}: unsupported annotation {annotation!r}; use str, int, float, bool, "
        "list[...], dict[str, ...], Literal[...] or Optional[...]"
    )


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if isinstance(schema.get("type"), str):
        schema = {**schema, "type": [schema["type"], "null"]}
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {argument: description})."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent = 0
    for line in doc.splitlines():
        indent = len(line) - len(line.lstrip())
        header = _SECTION.match(line) if indent == 0 else None
        if header:
            section, current = header.group(1), None
        elif section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            match = _ARG_LINE.match(line.strip())
            if match and (current is None or indent <= arg_indent):
                current, arg_indent = match.group(1).lstrip("*"), indent
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _to_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, str):
        return ToolResponse(text=value)
    try:
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        return ToolResponse(text=str(value))
