"""OpenAIFunctionToolSchema, FunctionCall and BaseTool argument validation."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agentrl.tools import (
    BaseTool,
    FunctionCall,
    OpenAIFunctionToolSchema,
    ToolArgumentError,
    ToolResponse,
)

SCHEMA = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {
            "type": "object",
            "properties": {
                "word": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "lang": {"type": "string", "enum": ["en", "fr"]},
            },
            "required": ["word"],
        },
    },
}


class EchoTool(BaseTool):
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        return ToolResponse(text=str(parameters)), 0.0, {}


def test_schema_round_trips_to_the_openai_dict_without_unset_fields() -> None:
    schema = OpenAIFunctionToolSchema.model_validate(SCHEMA)
    assert schema.name == "lookup"
    assert schema.to_dict() == SCHEMA  # "strict" is left out unless set


def test_required_argument_missing_from_properties_is_rejected() -> None:
    bad = {"function": {"name": "f", "parameters": {"properties": {}, "required": ["x"]}}}
    with pytest.raises(ValidationError, match=r"required arguments \['x'\] are not in properties"):
        OpenAIFunctionToolSchema.model_validate(bad)


def test_invalid_json_schema_is_rejected_at_load_time() -> None:
    bad = {"function": {"name": "f", "parameters": {"properties": {"x": {"type": "strin"}}}}}
    with pytest.raises(ValidationError, match="not a valid JSON Schema"):
        OpenAIFunctionToolSchema.model_validate(bad)


def test_function_name_must_be_openai_compatible() -> None:
    with pytest.raises(ValidationError, match="name"):
        OpenAIFunctionToolSchema.model_validate({"function": {"name": "has space"}})


def test_function_call_parses_json_string_arguments() -> None:
    assert FunctionCall(name="f", arguments='{"a": 1}').arguments == {"a": 1}
    assert FunctionCall(name="f", arguments="").arguments == {}
    assert FunctionCall(name="f", arguments={"b": [2]}).arguments == {"b": [2]}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [('{"a": ', "not valid JSON"), ("[1, 2]", "must be a JSON object")],
)
def test_function_call_rejects_bad_arguments_clearly(arguments: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        FunctionCall(name="f", arguments=arguments)


def test_validate_arguments_lists_every_problem_with_the_offending_value() -> None:
    tool = EchoTool({}, SCHEMA)
    with pytest.raises(ToolArgumentError) as info:
        tool.validate_arguments({"limit": 0, "lang": "de"})
    message = str(info.value)
    assert message.startswith("invalid arguments for tool 'lookup': ")
    assert "'word' is a required property" in message
    assert "limit: 0 is less than the minimum of 1" in message
    assert "lang: 'de' is not one of ['en', 'fr']" in message
    assert info.value.tool_name == "lookup"
    assert len(info.value.errors) == 3


def test_validate_arguments_accepts_valid_and_rejects_non_objects() -> None:
    tool = EchoTool({}, SCHEMA)
    tool.validate_arguments({"word": "cat", "limit": 3})
    with pytest.raises(ToolArgumentError, match="must be a JSON object"):
        tool.validate_arguments(["cat"])  # type: ignore[arg-type]


def test_tool_without_schema_or_default_fails_with_a_hint() -> None:
    with pytest.raises(ValueError, match="EchoTool needs a tool_schema"):
        EchoTool({})


async def test_default_lifecycle_gives_fresh_ids_and_zero_reward() -> None:
    tool = EchoTool({}, SCHEMA)
    first, second = await tool.create(), await tool.create()
    assert first != second
    assert await tool.create("mine") == "mine"
    response, reward, _ = await tool.execute(first, {"word": "x"})
    assert response.text == "{'word': 'x'}" and reward == 0.0
    assert await tool.calc_reward(first) == 0.0
    await tool.release(first)
