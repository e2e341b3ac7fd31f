"""OpenAI function-calling schema and parsed tool calls, as pydantic models.

The tool schema is what a chat template's ``tools=`` argument takes
(``{"type": "function", "function": {"name", "description", "parameters"}}``);
``parameters`` is a JSON Schema object, checked when the schema is built so a
broken tool definition fails at load time, not during a rollout.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "FunctionCall",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
]


class OpenAIFunctionParametersSchema(BaseModel):
    """The JSON Schema of a function's arguments: always an object.

    ``properties`` maps each argument name to its own JSON Schema (``type``,
    ``description``, ``enum``, ``items``, ...). Extra JSON Schema keywords such
    as ``additionalProperties`` are kept.
    """

    model_config = ConfigDict(extra="allow")

    type: Literal["object"] = "object"
    properties: dict[str, dict[str, Any]] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> OpenAIFunctionParametersSchema:
        unknown = [name for name in self.required if name not in self.properties]
        if unknown:
            raise ValueError(
                f"required arguments {unknown} are not in properties "
                f"{sorted(self.properties)}; add them to properties or drop them from required"
            )
        try:
            jsonschema.Draft202012Validator.check_schema(self.to_json_schema())
        except jsonschema.SchemaError as exc:
            raise ValueError(f"parameters is not a valid JSON Schema: {exc.message}") from None
        return self

    def to_json_schema(self) -> dict[str, Any]:
        """The plain JSON Schema dict (what validators and chat templates consume)."""
        return self.model_dump(mode="json")


class OpenAIFunctionSchema(BaseModel):
    """Name, description and argument schema of one callable function."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(
        default_factory=OpenAIFunctionParametersSchema
    )
    strict: bool | None = None


class OpenAIFunctionToolSchema(BaseModel):
    """One entry of the OpenAI ``tools`` list: ``{"type": "function", "function": {...}}``."""

    type: Literal["function"] = "function"
    function: OpenAIFunctionSchema

    @property
    def name(self) -> str:
        """The function's name, as the model must spell it in a tool call."""
        return self.function.name

    def to_dict(self) -> dict[str, Any]:
        """The plain dict form (for ``apply_chat_template(tools=...)`` and JSON prompts)."""
        return self.model_dump(mode="json", exclude_none=True)


class FunctionCall(BaseModel):
    """A tool call parsed from model output: the function name and its arguments.

    ``arguments`` may be given as a dict or as a JSON string encoding an object
    (the OpenAI wire format); either way it is stored as a dict. ``id``: the call's id
    when the model wrote one into its turn (Kimi K2's ``functions.NAME:INDEX``), which
    its result must then name; None when the format has none.
    """

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None

    @field_validator("arguments", mode="before")
    @classmethod
    def _parse_json_arguments(cls, value: Any) -> Any:
        if value is None:
            return {}
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"arguments are not valid JSON ({exc}): {value!r}") from None
            if not isinstance(value, dict):
                raise ValueError(f"arguments must be a JSON object, got {value!r}")
        return value
