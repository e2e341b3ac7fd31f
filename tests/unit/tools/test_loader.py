"""load_tools: YAML config by import path, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.tools import load_tools
from agentrl.tools.calculator import CalculatorTool
from tests.unit.tools.sample_tools import shout

MODULE = "tests.unit.tools.sample_tools"

YAML = f"""
tools:
  - class_name: {MODULE}.NeedsSchemaTool
    config: {{prefix: ">"}}
    tool_schema:
      type: function
      function:
        name: echo
        description: Echo the arguments.
        parameters:
          type: object
          properties:
            text: {{type: string, description: What to echo.}}
          required: [text]
  - class_name: {MODULE}.DefaultSchemaTool
  - class_name: "{MODULE}:shout"
  - class_name: agentrl.tools.calculator.CalculatorTool
"""


async def test_yaml_file_loads_classes_defaults_and_tool_objects(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(YAML)
    tools = load_tools(path)
    assert list(tools) == ["echo", "default_tool", "shout", "calculator"]
    assert tools["shout"] is shout
    assert isinstance(tools["calculator"], CalculatorTool)
    response, _, _ = await tools["echo"].execute("id", {"text": "hi"})
    assert response.text == ">{'text': 'hi'}"
    tools["echo"].validate_arguments({"text": "hi"})


def test_mapping_list_and_ready_objects_are_accepted() -> None:
    assert list(load_tools({"tools": [{"class_name": f"{MODULE}.DefaultSchemaTool"}]})) == [
        "default_tool"
    ]
    assert list(load_tools([shout])) == ["shout"]
    assert load_tools({"tools": None}) == {}


@pytest.mark.parametrize(
    ("entry", "error", "message"),
    [
        ({"class_name": "no_such_pkg.Tool"}, ImportError, "cannot import module 'no_such_pkg'"),
        ({"class_name": f"{MODULE}.Missing"}, ImportError, "has no attribute 'Missing'"),
        ({"class_name": "NoDots"}, ImportError, "is not an import path"),
        ({"class_name": f"{MODULE}.NOT_A_TOOL"}, TypeError, "not a BaseTool subclass"),
        ({"class_name": f"{MODULE}.NeedsSchemaTool"}, ValueError, "needs a tool_schema"),
        ({"class_nme": "x.Y"}, ValueError, r"tools\[0\]: invalid tool entry"),
        (
            {"class_name": f"{MODULE}.shout", "config": {"a": 1}},
            ValueError,
            "ready tool object",
        ),
        (
            {
                "class_name": f"{MODULE}.NeedsSchemaTool",
                "tool_schema": {"function": {"name": "f", "parameters": {"required": ["x"]}}},
            },
            ValueError,
            r"(?s)tools\[0\] \(.*NeedsSchemaTool\): invalid config or tool_schema"
            r".*not in properties",
        ),
        (
            {
                "class_name": "agentrl.tools.code_interpreter.CodeInterpreterTool",
                "config": {"wall_time": 3},
            },
            ValueError,
            "wall_time",
        ),
    ],
)
def test_bad_entries_fail_with_a_clear_error(
    entry: dict, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        load_tools([entry])


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"tools\[1\]: a second tool named 'shout'"):
        load_tools([shout, shout])


def test_bad_files_are_reported_with_their_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read tool config"):
        load_tools(tmp_path / "missing.yaml")
    path = tmp_path / "bad.yaml"
    path.write_text("tool: []\n")
    with pytest.raises(ValueError, match="top-level 'tools' list"):
        load_tools(path)
    path.write_text("tools: {class_name: x.Y}\n")
    with pytest.raises(ValueError, match="must be a list"):
        load_tools(path)
