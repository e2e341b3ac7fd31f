"""The OpenAI Agents SDK (unmodified) runs a real tool loop through the gateway.

The engine is scripted to emit a Hermes tool call and then an answer, so the SDK
executes its Python tool between two model turns; the gateway records both turns and
the tool result as one token-exact sample.
"""

from __future__ import annotations

import httpx
import openai
import pytest

agents = pytest.importorskip("agents")


@agents.function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_agents_sdk_tool_loop_is_recorded_as_one_sample(tokenizer, make_gateway):
    agents.set_tracing_disabled(True)
    _, engine, http = make_gateway()
    client = openai.AsyncOpenAI(
        base_url="http://gateway/sessions/sdk-1/v1",
        api_key="unused",
        http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app)),
    )
    agent = agents.Agent(
        name="calculator",
        instructions="Use the add tool, then answer.",
        tools=[add],
        model=agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client),
    )

    result = await agents.Runner.run(agent, "What is 2 + 40?")

    assert result.final_output == "The answer is 43."
    assert len(engine.calls) == 2
    trajectory = http.get("/v1/sessions/sdk-1").json()
    (sample,) = trajectory["samples"]
    assert trajectory["metrics"]["gateway/divergences"] == 0
    pairs = zip(sample["response_ids"], sample["response_mask"], strict=True)
    env_ids = [token for token, mask in pairs if mask == 0]
    assert "<tool_response>\n42\n</tool_response>" in tokenizer.decode(env_ids)
    assert (
        engine.calls[1].prompt_ids
        == sample["prompt_ids"]
        + sample["response_ids"][: len(engine.calls[1].prompt_ids) - len(sample["prompt_ids"])]
    )
