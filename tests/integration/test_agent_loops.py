"""Agent loops through real Ray Serve on the tiny model.

One Ray start and one rollout deployment are shared by the module. Its replica runs the
HF engine (it starts in seconds; prefix cache included): what is tested is the loops'
token bookkeeping against whatever the engine returned, which does not depend on the
engine (the e2e test runs the tool loop on vLLM-CPU).
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentrl.core.trajectory import ENV_TOKEN_VERSION
from agentrl.core.types import SamplingParams
from agentrl.rollout.episode import make_requests
from agentrl.rollout.manager import AgentLoopManager
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.testing.serving import rollout_servers, tiny_serving_config
from agentrl.tools import BaseTool, FunctionCall, ToolResponse
from agentrl.tools.parsers import ParsedTurn, ToolCallParser, register_tool_parser

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@register_tool_parser("test_always_add")
class AlwaysAddParser(ToolCallParser):
    """Treats every turn of the (random) tiny model as a call to `add`."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, calls=[FunctionCall(name="add", arguments={"a": 2})])


class AddTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters["a"] + 40)), 0.0, {}


ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


class RecordingClient:
    """Passes calls to the real DataClient and keeps every engine output."""

    def __init__(self, inner):
        self.inner = inner
        self.outputs = []

    async def generate(self, session_id, prompt_ids, sampling=None):
        out = await self.inner.generate(session_id, prompt_ids, sampling)
        self.outputs.append((list(prompt_ids), out))
        return out


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint):
    return tiny_serving_config(
        tiny_checkpoint,
        18766,
        [
            "server.engine.backend=hf",
            "rollout.num_workers=2",
            "rollout.max_response_length=400",
            "rollout.drift_check_rate=1.0",
        ],
        replicas=1,
        max_model_len=2048,
    )


@pytest.fixture(scope="module")
async def client(cfg):
    with rollout_servers(cfg) as client:
        yield client


async def test_three_turn_tool_episode_lines_up_with_engine_outputs(cfg, client, tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    loop_cfg = cfg.model_copy(deep=True)
    loop_cfg.rollout.agent_name = "tool_agent"
    loop_cfg.rollout.tool_parser = "test_always_add"
    loop_cfg.rollout.max_assistant_turns = 3
    recorder = RecordingClient(client.data)
    worker = AgentLoopWorker(
        loop_cfg, client=recorder, tools={"add": AddTool(tool_schema=ADD)}, tokenizer=tokenizer
    )
    sampling = SamplingParams(max_tokens=24, temperature=1.0)
    row = {"prompt": [{"role": "user", "content": "Add two to forty."}]}
    (request,) = make_requests([row], n=1, sampling=sampling)
    result = await worker.run_episode(request)

    assert result.ok, result.error
    (out,) = result.outputs
    assert out.extra["stop_reason"] == "max_assistant_turns"
    assert len(recorder.outputs) == 3
    full = out.prompt_ids + out.response_ids
    position = len(out.prompt_ids)
    for turn, (prompt, engine_out) in enumerate(recorder.outputs):
        assert prompt == full[:position], f"turn {turn} prompt is not the conversation so far"
        n = len(engine_out.token_ids)
        start = position - len(out.prompt_ids)
        assert out.response_ids[start : start + n] == engine_out.token_ids
        assert out.response_logprobs[start : start + n] == engine_out.logprobs
        assert out.response_versions[start : start + n] == engine_out.token_versions
        assert out.response_mask[start : start + n] == [1] * n
        if turn > 0:
            assert engine_out.num_cached_tokens > 0, "later turns must hit the prefix cache"
        position += n
        if turn + 1 < len(recorder.outputs):
            next_prompt = recorder.outputs[turn + 1][0]
            tool_len = len(next_prompt) - position
            tool_span = slice(
                position - len(out.prompt_ids), len(next_prompt) - len(out.prompt_ids)
            )
            assert out.response_mask[tool_span] == [0] * tool_len
            assert out.response_versions[tool_span] == [ENV_TOKEN_VERSION] * tool_len
            assert "<tool_response>\n42\n</tool_response>" in tokenizer.decode(
                out.response_ids[tool_span]
            )
            position = len(next_prompt)
    assert out.metrics["tool_calls/add/ok"] == 2


async def test_manager_runs_a_batch_on_ray_workers_and_records_failures(cfg, client):
    manager = AgentLoopManager(cfg)
    try:
        assert await manager.event_loop_names() == ["uvloop", "uvloop"]
        rows = [{"prompt": [{"role": "user", "content": f"Question {i}?"}]} for i in range(4)]
        rows.append({"prompt": [{"role": "user", "content": "x"}], "agent_name": "missing"})
        sampling = SamplingParams(max_tokens=8, temperature=1.0)
        streamed = [r async for r in manager.stream(rows, n=2, sampling=sampling)]
        assert len(streamed) == 10
        assert len({r.episode_id for r in streamed}) == 10
        failed = [r for r in streamed if not r.ok]
        assert [(r.row_index, "unknown agent loop 'missing'" in r.error) for r in failed] == [
            (4, True),
            (4, True),
        ]
        for r in streamed:
            if r.ok:
                (out,) = r.outputs
                assert 0 < len(out.response_ids) <= 8
                assert out.response_versions == [0] * len(out.response_ids)
        ordered = await manager.generate(rows[:2], n=3, sampling=sampling)
        assert [(r.row_index, r.sample_index) for r in ordered] == [
            (i, k) for i in range(2) for k in range(3)
        ]
        assert len({r.group_id for r in ordered}) == 2
    finally:
        manager.shutdown()
