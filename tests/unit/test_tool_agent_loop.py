"""ToolAgentLoop against a scripted engine: token alignment, budgets and every error path."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentrl.agent_loops.registry import get_agent_loop
from agentrl.agent_loops.tool_agent import ToolAgentLoop
from agentrl.agent_loops.tool_calls import TRUNCATION_MARKER, truncate_response
from agentrl.config import RolloutConfig
from agentrl.core.trajectory import ENV_TOKEN_VERSION
from agentrl.core.types import SamplingParams
from agentrl.testing.context import loop_context
from agentrl.testing.scripted import ScriptedClient
from agentrl.testing.tools import ADD_TOOL_SCHEMA
from agentrl.tools import BaseTool, ToolResponse

SAMPLING = SamplingParams(max_tokens=256, temperature=1.0)
ADD_SCHEMA = ADD_TOOL_SCHEMA


class AddTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters["a"] + parameters["b"])), 0.1, {}


class CrashTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("disk on fire")


class SlowTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(10)
        return ToolResponse(text="late"), 0.0, {}


class LongTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="x" * 5000), 0.0, {}


def _schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def _tools() -> dict[str, BaseTool]:
    tools = [
        AddTool(tool_schema=ADD_SCHEMA),
        CrashTool(tool_schema=_schema("crash")),
        SlowTool(tool_schema=_schema("slow")),
        LongTool(tool_schema=_schema("long")),
    ]
    return {t.name: t for t in tools}


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def _call(name: str, args: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def _loop(tokenizer, turns: list[str], *, template: str | None = None, **overrides):
    """A ToolAgentLoop whose model says ``turns[i]`` (then <|im_end|>) on turn i."""
    eos = tokenizer.eos_token_id

    def script(session_id, turn, prompt_ids):
        return [*tokenizer.encode(turns[turn], add_special_tokens=False), eos]

    config = RolloutConfig(
        **{
            "drift_check_rate": 1.0,
            "keep_messages": True,
            "tool_timeout_s": 0.5,
            "max_response_length": 2048,
        }
        | overrides
    )
    if template is not None:
        tokenizer = _with_template(tokenizer, template)
    tools = _tools()
    context = loop_context(
        tokenizer, ScriptedClient(script), tools=tools, config=config, session_id="episode-1"
    )
    return ToolAgentLoop(context)


def _with_template(tokenizer, template: str):
    clone = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    clone.chat_template = template
    return clone


SAMPLE = {"prompt": [{"role": "user", "content": "What is 2 + 3, then plus 4?"}]}


async def test_three_turn_conversation_is_token_exact(tokenizer):
    turns = [_call("add", {"a": 2, "b": 3}), _call("add", {"a": 5, "b": 4}), "The answer is 9."]
    loop = _loop(tokenizer, turns)
    out = await loop.run(SAMPLE, SAMPLING)
    client = loop.context.client

    assert out.num_turns == 5  # 3 model turns + 2 tool turns
    assert out.extra["stop_reason"] == "no_tool_call"
    assert all(c.session_id == "episode-1" for c in client.calls)
    # Each turn's prompt is exactly the previous prompt + everything appended since.
    assert client.calls[0].prompt_ids == out.prompt_ids
    full = out.prompt_ids + out.response_ids
    for call in client.calls:
        assert full[: len(call.prompt_ids)] == call.prompt_ids
    # Model spans carry the engine's ids, logprobs and versions; tool spans are masked.
    eos = tokenizer.eos_token_id
    model_spans = [[*tokenizer.encode(t, add_special_tokens=False), eos] for t in turns]
    position = 0
    for i, span in enumerate(model_spans):
        assert out.response_ids[position : position + len(span)] == span
        assert out.response_mask[position : position + len(span)] == [1] * len(span)
        expected_lp = [-(k + 1) / 100 for k in range(len(span))]
        assert out.response_logprobs[position : position + len(span)] == expected_lp
        assert out.response_versions[position : position + len(span)] == [0] * len(span)
        position += len(span)
        if i + 1 < len(model_spans):
            tool_len = len(client.calls[i + 1].prompt_ids) - len(out.prompt_ids) - position
            assert out.response_mask[position : position + tool_len] == [0] * tool_len
            assert set(out.response_logprobs[position : position + tool_len]) == {0.0}
            assert set(out.response_versions[position : position + tool_len]) == {ENV_TOKEN_VERSION}
            tool_text = tokenizer.decode(out.response_ids[position : position + tool_len])
            assert tool_text.startswith("\n<|im_start|>user\n<tool_response>\n")
            assert tool_text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
            position += tool_len
    assert position == len(out.response_ids)
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(out.response_ids)
    assert out.metrics["tool_calls/add/ok"] == 2
    assert out.metrics["tokenization_drift"] == 0


async def test_messages_are_kept_only_when_asked(tokenizer):
    turns = [_call("add", {"a": 2, "b": 3}), "The answer is 5."]
    kept = await _loop(tokenizer, turns).run(SAMPLE, SAMPLING)
    lean = await _loop(tokenizer, turns, keep_messages=False).run(SAMPLE, SAMPLING)
    roles = [m["role"] for m in kept.extra["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert "messages" not in lean.extra
    # The drift check still sees the conversation; the ids do not depend on the setting.
    assert lean.metrics["drift_checked"] == 1 and lean.metrics["tokenization_drift"] == 0
    assert lean.response_ids == kept.response_ids
    assert lean.metrics["tool_calls/add/ok"] == 1


@pytest.mark.parametrize(
    ("turn", "outcome", "message"),
    [
        ("<tool_call>\n{not json}\n</tool_call>", "malformed", "invalid JSON"),
        (_call("nope", {}), "unknown_tool", "unknown tool 'nope'"),
        (_call("add", {"a": "two", "b": 3}), "invalid_arguments", "'two' is not of type"),
        (_call("add", {"a": 1}), "invalid_arguments", "'b' is a required property"),
        (_call("crash", {}), "error", "disk on fire"),
        (_call("slow", {}), "timeout", "timed out"),
        ('<tool_call>\n{"name": "add"', "malformed", "never closed"),
    ],
)
async def test_bad_tool_calls_get_an_error_response_and_the_loop_goes_on(
    tokenizer, turn, outcome, message
):
    loop = _loop(tokenizer, [turn, "Sorry, done."])
    out = await loop.run(SAMPLE, SAMPLING)
    assert out.extra["stop_reason"] == "no_tool_call"
    assert out.metrics["assistant_turns"] == 2
    assert out.metrics[f"tool_calls/{outcome}"] == 1
    tool_message = out.extra["messages"][2]
    assert tool_message["role"] == "tool"
    assert tool_message["content"].startswith("Error:")
    assert message in tool_message["content"]


async def test_parallel_calls_each_get_a_response(tokenizer):
    turn = _call("add", {"a": 1, "b": 1}) + "\n" + _call("add", {"a": 2, "b": 2})
    loop = _loop(tokenizer, [turn, "done"])
    out = await loop.run(SAMPLE, SAMPLING)
    tool_contents = [m["content"] for m in out.extra["messages"] if m["role"] == "tool"]
    assert tool_contents == ["2", "4"]
    assert out.extra["tool_reward"] == 0.0


async def test_max_assistant_turns_stops_the_episode(tokenizer):
    loop = _loop(tokenizer, [_call("add", {"a": 1, "b": 1})] * 5, max_assistant_turns=3)
    out = await loop.run(SAMPLE, SAMPLING)
    assert out.extra["stop_reason"] == "max_assistant_turns"
    assert out.metrics["assistant_turns"] == 3


async def test_max_user_turns_stops_the_episode(tokenizer):
    loop = _loop(tokenizer, [_call("add", {"a": 1, "b": 1})] * 5, max_user_turns=1)
    out = await loop.run(SAMPLE, SAMPLING)
    assert out.extra["stop_reason"] == "max_user_turns"
    assert out.metrics["user_turns"] == 1


async def test_response_budget_caps_tokens_across_turns(tokenizer):
    loop = _loop(tokenizer, [_call("add", {"a": 1, "b": 1})] * 20, max_response_length=120)
    out = await loop.run(SAMPLE, SAMPLING)
    assert out.extra["stop_reason"] == "response_budget"
    assert len(out.response_ids) <= 120
    # Every model turn was asked for at most the tokens left in the budget.
    for call in loop.context.client.calls:
        assert call.sampling.max_tokens <= 120 - (len(call.prompt_ids) - len(out.prompt_ids))


async def test_long_tool_response_is_truncated_with_marker(tokenizer):
    loop = _loop(tokenizer, [_call("long", {}), "ok"], max_tool_response_length=100)
    out = await loop.run(SAMPLE, SAMPLING)
    content = out.extra["messages"][2]["content"]
    assert len(content) == 100
    assert TRUNCATION_MARKER in content


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_truncate_response_sides(side):
    text = "".join(str(i % 10) for i in range(200))
    cut = truncate_response(text, 50, side)
    assert len(cut) == 50 and TRUNCATION_MARKER in cut
    kept = cut.replace(TRUNCATION_MARKER, "")
    if side == "left":
        assert text.endswith(kept)
    elif side == "right":
        assert text.startswith(kept)
    else:
        assert text.startswith(kept[: len(kept) // 2]) and text.endswith(kept[len(kept) // 2 :])
    assert truncate_response("short", 50, side) == "short"


# Like Qwen3's: earlier assistant turns lose their <think> block when re-rendered.
NOT_APPEND_ONLY_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and not loop.last %}"
    "<|im_start|>assistant\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}"
    "\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_drift_check_flags_templates_that_are_not_append_only(tokenizer, caplog):
    turns = ["<think>hmm</think>" + _call("add", {"a": 1, "b": 2}), "three"]
    loop = _loop(tokenizer, turns, template=NOT_APPEND_ONLY_TEMPLATE)
    with caplog.at_level(logging.DEBUG, logger="agentrl.agent_loops.chat"):
        out = await loop.run(SAMPLE, SAMPLING)
    assert out.metrics["tokenization_drift"] == 1
    assert "tokenization drift at token" in caplog.text
    # The trajectory itself still holds exactly what the model produced.
    assert "<think>hmm</think>" in tokenizer.decode(out.response_ids)


def test_loops_resolve_by_name_and_import_path():
    assert get_agent_loop("tool_agent") is ToolAgentLoop
    assert get_agent_loop("agentrl.agent_loops.tool_agent:ToolAgentLoop") is ToolAgentLoop
    with pytest.raises(ValueError, match="unknown agent loop"):
        get_agent_loop("nope")
    with pytest.raises(ValueError, match="cannot import"):
        get_agent_loop("agentrl.nope:Loop")


async def test_turn_cut_by_per_turn_max_tokens_still_continues(tokenizer):
    # The tool call fits in 40 tokens but the turn's text goes on: the turn is cut
    # ("length") without its end-of-turn token, and the loop still runs the call.
    turns = [_call("add", {"a": 1, "b": 2}) + " and more words " * 20, "three"]
    loop = _loop(tokenizer, turns)
    sampling = SamplingParams(max_tokens=60)
    out = await loop.run(SAMPLE, sampling)
    assert out.metrics["tool_calls/add/ok"] == 1
    assert out.extra["stop_reason"] == "no_tool_call"
    tool_text = tokenizer.decode(out.response_ids[60:])
    assert tool_text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n")
    assert out.metrics["tokenization_drift"] == 0


@pytest.mark.parametrize("template_cache", [True, False])
async def test_template_cache_switch_gives_identical_trajectories(tokenizer, template_cache):
    from agentrl.config import load_config
    from agentrl.rollout.worker import AgentLoopWorker

    cfg = load_config(
        None,
        [
            f"model.path={tokenizer.name_or_path}",
            f"rollout.template_cache={str(template_cache).lower()}",
        ],
    )
    worker = AgentLoopWorker(cfg, client=ScriptedClient([]), tokenizer=tokenizer)
    assert worker.renderer.template.fast_path is template_cache
    messages = [{"role": "user", "content": "Add 1 and 2."}]
    first = await worker.renderer.encode_prompt(messages)
    again = await worker.renderer.encode_prompt(messages)
    delta = await worker.renderer.encode_delta([{"role": "tool", "content": "3"}], True)
    full = worker.renderer.template.render_full(messages, True)
    assert first == again == worker.renderer.encode_text(full)
    assert delta == worker.renderer.encode_text(
        worker.renderer.template.delta_text([{"role": "tool", "content": "3"}], tokenizer.eos_token)
    )
