"""``BaseTool``: the lifecycle every tool follows, and ``ToolResponse``.

An agent loop calls ``create`` once per trajectory (getting an instance id),
``execute`` for every call the model makes, ``calc_reward`` at the end if it
wants a tool-side reward, and ``release`` to free per-trajectory state.
Stateless tools only implement ``execute``.
"""

from __future__ import annotations

import contextlib
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonschema

from agentrl.tools.schema import OpenAIFunctionToolSchema

__all__ = ["BaseTool", "ToolArgumentError", "ToolResponse"]


@dataclass
class ToolResponse:
    """What a tool hands back to the model: text, and optionally an image or video."""

    text: str | None = None
    image: Any = None
    video: Any = None


class ToolArgumentError(ValueError):
    """The model called a tool with arguments that do not match its JSON schema.

    ``str(error)`` is written for the model to read; ``errors`` lists each
    problem as ``"<path>: <message>"``.
    """

    def __init__(self, tool_name: str, errors: list[str]) -> None:
        self.tool_name = tool_name
        self.errors = errors
        super().__init__(f"invalid arguments for tool {tool_name!r}: " + "; ".join(errors))


class BaseTool(ABC):
    """A tool the model can call: schema plus the ``create/execute/calc_reward/release`` lifecycle.

    Args:
        config: tool-specific settings (from the YAML ``config`` block).
        tool_schema: the OpenAI function schema shown to the model; may be a
            plain dict. ``None`` uses ``default_tool_schema()`` of the class.
    """

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        tool_schema: OpenAIFunctionToolSchema | dict[str, Any] | None = None,
    ) -> None:
        self.config: dict[str, Any] = dict(config or {})
        if tool_schema is None:
            tool_schema = self.default_tool_schema()
        if tool_schema is None:
            raise ValueError(
                f"{type(self).__name__} needs a tool_schema: pass one or override "
                "default_tool_schema()"
            )
        self.tool_schema: OpenAIFunctionToolSchema = OpenAIFunctionToolSchema.model_validate(
            tool_schema
        )

    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema | None:
        """The schema used when none is configured; ``None`` means one must be given."""
        return None

    @property
    def name(self) -> str:
        """The function name the model calls this tool by."""
        return self.tool_schema.function.name

    @cached_property
    def _validator(self) -> jsonschema.Draft202012Validator:
        schema = self.tool_schema.function.parameters.to_json_schema()
        return jsonschema.Draft202012Validator(schema)

    def validate_arguments(self, parameters: dict[str, Any]) -> None:
        """Check call arguments against the tool's JSON schema.

        Raises:
            ToolArgumentError: listing every mismatch, with the offending value.
        """
        if not isinstance(parameters, dict):
            raise ToolArgumentError(
                self.name, [f"arguments must be a JSON object, got {parameters!r}"]
            )
        errors = sorted(self._validator.iter_errors(parameters), key=lambda e: list(e.path))
        if errors:
            raise ToolArgumentError(self.name, [_describe(error) for error in errors])

    def admission(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """What a call waits for before it starts, such as a slot in a pool the tool shares
        with other episodes. The agent loop's per-call time limit starts once it is held,
        so queueing behind other episodes' calls is not counted as this call being slow.
        Default: nothing to wait for.
        """
        return contextlib.nullcontext()

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Start per-trajectory state; returns the instance id (a new random id if none given)."""
        return instance_id or uuid.uuid4().hex

    @abstractmethod
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run one call; returns ``(response for the model, step reward, metrics)``."""

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """A tool-side reward for the whole trajectory (0.0 unless overridden)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free per-trajectory state (nothing to free unless overridden)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(part) for part in error.path) or "<arguments>"
    return f"{where}: {error.message}"
