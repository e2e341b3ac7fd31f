"""Tool lists rendered for chat templates and as a Hermes-style system prompt."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.tools import tools_for_chat_template, tools_system_prompt
from agentrl.tools.calculator import CalculatorTool
from tests.unit.tools.sample_tools import shout


def test_chat_template_list_is_the_openai_dicts() -> None:
    calc = CalculatorTool()
    expected = [calc.tool_schema.to_dict(), shout.tool_schema.to_dict()]
    assert tools_for_chat_template([calc, shout]) == expected
    assert tools_for_chat_template({"calculator": calc, "shout": shout}) == expected
    assert tools_for_chat_template([calc.tool_schema]) == expected[:1]


def test_system_prompt_lists_each_schema_as_one_json_line_and_the_call_format() -> None:
    prompt = tools_system_prompt([CalculatorTool(), shout])
    inside = prompt.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in inside] == ["calculator", "shout"]
    call_format = '{"name": <function-name>, "arguments": <args-json-object>}'
    assert f"<tool_call>\n{call_format}\n</tool_call>" in prompt


def test_system_prompt_template_replaces_the_hermes_instructions() -> None:
    prompt = tools_system_prompt([shout], "Tools:\n{tools}\nCall: <tool_call>{{...}}</tool_call>")
    lines = prompt.splitlines()
    assert lines[0] == "Tools:" and json.loads(lines[1])["function"]["name"] == "shout"
    assert lines[2] == "Call: <tool_call>{...}</tool_call>"
    assert "<tools>" not in prompt


def test_chat_template_renders_the_tools(tiny_checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tools=tools_for_chat_template([shout]),
        tokenize=False,
    )
    assert '"name": "shout"' in text
