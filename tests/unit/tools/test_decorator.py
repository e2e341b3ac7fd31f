"""@tool: schema generation from annotations and docstrings, and execution."""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any, Literal, Optional

import pytest

from agentrl.tools import FunctionTool, ToolArgumentError, ToolResponse, tool


@tool
def search(
    query: str,
    k: int = 5,
    mode: Literal["fast", "exact"] = "fast",
    tags: list[str] | None = None,
    weight: Optional[float] = None,  # noqa: UP045 - Optional must work too
    meta: dict[str, int] | None = None,
    verbose: bool = False,
    note: Annotated[str, "Free text."] = "",
) -> list[str]:
    """Search the corpus.

    Results are ranked.

    Args:
        query: What to look for,
            possibly over several lines.
        k (int): How many results.
        mode: Matching mode.

    Returns:
        The matching lines.
    """
    return [query] * k


def test_schema_is_generated_from_annotations_and_docstring() -> None:
    function = search.tool_schema.to_dict()["function"]
    assert function["name"] == "search"
    assert function["description"] == "Search the corpus.\n\nResults are ranked."
    params = function["parameters"]
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {
        "type": "string",
        "description": "What to look for, possibly over several lines.",
    }
    assert props["k"] == {"type": "integer", "description": "How many results.", "default": 5}
    assert props["mode"] == {
        "type": "string",
        "enum": ["fast", "exact"],
        "description": "Matching mode.",
        "default": "fast",
    }
    assert props["tags"] == {"type": ["array", "null"], "items": {"type": "string"}}
    assert props["weight"] == {"type": ["number", "null"]}
    assert props["meta"] == {
        "type": ["object", "null"],
        "additionalProperties": {"type": "integer"},
    }
    assert props["verbose"] == {"type": "boolean", "default": False}
    assert props["note"] == {"type": "string", "description": "Free text.", "default": ""}


def test_generated_schema_validates_arguments() -> None:
    search.validate_arguments({"query": "x", "tags": None, "mode": "exact"})
    with pytest.raises(ToolArgumentError, match="mode: 'slow' is not one of"):
        search.validate_arguments({"query": "x", "mode": "slow"})
    with pytest.raises(ToolArgumentError, match="Additional properties are not allowed"):
        search.validate_arguments({"query": "x", "limit": 3})


async def test_sync_function_runs_off_the_event_loop_thread() -> None:
    seen: list[int] = []

    @tool
    def where() -> str:
        """Report the thread."""
        seen.append(threading.get_ident())
        return "ok"

    response, reward, _ = await where.execute("id", {})
    assert response.text == "ok" and reward == 0.0
    assert seen and seen[0] != threading.get_ident()


async def test_async_function_is_awaited_and_values_become_text() -> None:
    @tool(name="adder", description="Adds.")
    async def add(a: int, b: int) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"sum": a + b}

    assert isinstance(add, FunctionTool) and add.name == "adder"
    assert add.tool_schema.function.description == "Adds."
    response, _, _ = await add.execute("id", {"a": 2, "b": 3})
    assert response.text == '{"sum": 5}'
    assert await add(1, 1) == {"sum": 2}  # still callable as the function


async def test_tool_response_is_passed_through() -> None:
    @tool
    def picture() -> ToolResponse:
        """Return an image."""
        return ToolResponse(text="see image", image="IMG")

    response, _, _ = await picture.execute("id", {})
    assert response.image == "IMG"


def test_unannotated_parameter_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"parameter 'x' .* has no type annotation"):

        @tool
        def bad(x):  # type: ignore[no-untyped-def]
            """Bad."""


def test_unsupported_annotation_is_an_error() -> None:
    with pytest.raises(TypeError, match="unsupported annotation"):

        @tool
        def bad(x: set[int]) -> None:
            """Bad."""


def test_variadic_parameters_are_an_error() -> None:
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):

        @tool
        def bad(*items: Any) -> None:
            """Bad."""
