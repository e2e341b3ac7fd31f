"""``ExternalAgentLoop`` against the gateway app served over real HTTP (scripted engine)."""

from __future__ import annotations

import asyncio
import sys
import threading

import openai
import pytest
import uvicorn

from agentrl.agent_loops.external import AgentEndpoint, ExternalAgentError, ExternalAgentLoop
from agentrl.agent_loops.external_config import ExternalAgentConfig
from agentrl.config import RolloutConfig
from agentrl.core.types import SamplingParams
from agentrl.testing.context import loop_context


@pytest.fixture
def gateway_url(make_gateway):
    """Root URL of the gateway app served by uvicorn on a free local port."""
    _, _, http = make_gateway()
    server = uvicorn.Server(uvicorn.Config(http.app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def sync_agent(row, endpoint: AgentEndpoint) -> str:
    """A synchronous agent: one call with the plain OpenAI client."""
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    client.chat.completions.create(model=endpoint.model, messages=row["prompt"])
    return "done"


async def idle_agent(row, endpoint: AgentEndpoint) -> None:
    return None


async def slow_agent(row, endpoint: AgentEndpoint) -> None:
    await asyncio.sleep(30)


class ScoredLoop(ExternalAgentLoop):
    async def score(self, sample, outputs, agent_result):
        return 0.25 if agent_result == "done" else None


async def run_loop(tokenizer, loop_cls=ExternalAgentLoop, **external):
    rollout = RolloutConfig(external=ExternalAgentConfig(**external))
    context = loop_context(tokenizer, config=rollout)
    row = {"prompt": [{"role": "user", "content": "What is 2 + 40?"}]}
    return await loop_cls(context).run(row, SamplingParams())


async def test_sync_agent_samples_come_back_with_the_score_hook_reward(tokenizer, gateway_url):
    (output,) = await run_loop(
        tokenizer, ScoredLoop, entrypoint=f"{__name__}:sync_agent", gateway_url=gateway_url
    )
    assert output.reward == 0.25
    assert output.response_mask == [1] * len(output.response_ids)
    assert output.metrics["gateway/calls"] == 1


async def test_agent_that_never_calls_the_model_fails_the_episode(tokenizer, gateway_url):
    with pytest.raises(ExternalAgentError, match="no model calls"):
        await run_loop(tokenizer, entrypoint=f"{__name__}:idle_agent", gateway_url=gateway_url)


async def test_agent_past_its_time_limit_is_stopped(tokenizer, gateway_url):
    with pytest.raises(ExternalAgentError, match="timed out"):
        await run_loop(
            tokenizer, entrypoint=f"{__name__}:slow_agent", gateway_url=gateway_url, timeout_s=0.3
        )


async def test_failing_subprocess_agent_reports_its_stderr(tokenizer, gateway_url):
    command = [sys.executable, "-c", "import sys; sys.exit('agent crashed: no tools')"]
    with pytest.raises(ExternalAgentError, match="no tools"):
        await run_loop(tokenizer, command=command, gateway_url=gateway_url)


async def test_config_needs_exactly_one_way_to_start_the_agent(tokenizer, gateway_url):
    with pytest.raises(ExternalAgentError, match="exactly one"):
        await run_loop(tokenizer, gateway_url=gateway_url)
