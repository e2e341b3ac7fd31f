"""The README's code examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import AutoTokenizer

from agentrl.core.types import SamplingParams
from agentrl.testing.context import loop_context
from agentrl.testing.scripted import ScriptedClient

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


async def test_custom_agent_loop_example_runs(tiny_checkpoint):
    namespace: dict = {}
    exec(compile(_python_block_after("## Agent loops"), "README.md", "exec"), namespace)
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    eos = tokenizer.eos_token_id
    client = ScriptedClient(lambda session, turn, prompt: [10 + turn, 20, eos])
    context = loop_context(tokenizer, client, session_id="readme")
    loop = namespace["TwoDrafts"](context)
    out = await loop.run({"prompt": [{"role": "user", "content": "2+2?"}]}, SamplingParams())
    assert len(client.calls) == 2
    assert out.response_ids[:3] == [10, 20, eos]
    assert out.response_ids[-3:] == [11, 20, eos]
    nudge = tokenizer.decode(out.response_ids[3:-3])
    assert (
        nudge
        == "\n<|im_start|>user\nPlease double-check your answer.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out.response_mask == [1, 1, 1] + [0] * (len(out.response_ids) - 6) + [1, 1, 1]


async def test_tool_decorator_example_runs():
    namespace: dict = {}
    exec(compile(_python_block_after("## Tools"), "README.md", "exec"), namespace)
    lookup = namespace["lookup"]
    schema = lookup.tool_schema.to_dict()["function"]
    assert schema["name"] == "lookup"
    assert schema["parameters"]["properties"]["unit"]["enum"] == ["c", "f"]
    assert schema["parameters"]["required"] == ["city"]
    response, _, _ = await lookup.execute("i", {"city": "Paris", "unit": "f"})
    assert response.text == "21 degrees f in Paris"
