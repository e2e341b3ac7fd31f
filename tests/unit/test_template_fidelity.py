"""Every model family, token-exact through the tool loop and the gateway (a sample of the
property ``bench/template_fidelity.py`` runs 10,000 times per family).

Real tokenizers (``agentrl.testing.families``), vLLM's own parsers, a scripted engine that
emits each turn as the family's template writes it; ``agentrl.testing.fidelity`` checks
drift, the mask, every call parsed, and the gateway's sample.
"""

from __future__ import annotations

import functools
import json
import random

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.agent_loops.base import AgentLoopContext
from agentrl.agent_loops.config import RolloutConfig
from agentrl.agent_loops.tool_agent import ToolAgentLoop
from agentrl.core.types import SamplingParams
from agentrl.server.gateway.app import build_app
from agentrl.testing.families import FAMILIES, family
from agentrl.testing.fidelity import (
    TOOL_SCHEMAS,
    AssistantTurn,
    Conversation,
    FidelityHarness,
    ToolCallSpec,
    random_conversation,
)
from agentrl.tools.parsers import get_tool_parser

NAMES = sorted(FAMILIES)


@functools.cache
def harness(name: str, tool_parser: str | None = None) -> FidelityHarness:
    return FidelityHarness.of(family(name), tool_parser)


def specials(name: str) -> list[str]:
    return list(family(name).tokenizer().all_special_tokens)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
async def test_random_conversations_are_token_exact_in_the_loop_and_the_gateway(name, rng):
    model = family(name)
    conversation = random_conversation(
        rng,
        specials(name),
        model.reasoning_parser is not None,
        max_calls_per_turn=3 if model.parallel_calls else 1,
    )
    report = await harness(name).check(conversation)
    assert report.ok, report


async def test_a_parser_of_another_format_is_caught_as_unparsed_calls():
    # The negative control: Hermes JSON cannot read Qwen3-Coder's XML calls.
    wrong = harness("qwen3_coder", tool_parser="hermes")
    rng = random.Random(0)
    unparsed = 0
    for _ in range(10):
        conversation = random_conversation(rng, specials("qwen3_coder"), reasoning=False)
        unparsed += (await wrong.check_tool_loop(conversation)).unparsed_calls
    assert unparsed > 0


def _broken_call_turn(h: FidelityHarness, reasoning: str | None) -> list[list[int]]:
    """Engine outputs: a call cut off mid-arguments (then end of turn), then an answer."""
    conversation = Conversation(
        [{"role": "user", "content": "look it up"}],
        [
            AssistantTurn("", reasoning, [ToolCallSpec("search", {"query": "abc"}, "r")]),
            AssistantTurn("done"),
        ],
    )
    _, outputs = h.rendering.reference(conversation)
    tokenizer = h.rendering.tokenizer
    text = tokenizer.decode(outputs[0], skip_special_tokens=False)
    cut = text[: text.index('"abc"') if '"abc"' in text else text.index("abc")]
    outputs[0] = [*tokenizer.encode(cut, add_special_tokens=False), tokenizer.eos_token_id]
    return outputs


def _loop_context(h: FidelityHarness, session: str, config: RolloutConfig) -> AgentLoopContext:
    """A tool loop's context on the harness's scripted engine, tools and parsers."""
    return AgentLoopContext(
        client=h.engine,
        tokenizer=h.rendering.tokenizer,
        renderer=h.renderer,
        tools=h.tools,
        tool_parser=h.tool_parser,
        config=config,
        session_id=session,
        reasoning_parser=h.reasoning_parser,
    )


@pytest.mark.parametrize("name", NAMES)
async def test_a_malformed_call_is_answered_with_an_error_and_counted(name):
    model = family(name)
    h = harness(name)
    outputs = _broken_call_turn(h, "think" if model.reasoning_parser else None)
    h._outputs = outputs
    h.executed = []
    out = await ToolAgentLoop(_loop_context(h, f"malformed-{name}", RolloutConfig())).run(
        {"prompt": [{"role": "user", "content": "look it up"}]}, SamplingParams(max_tokens=512)
    )
    assert out.metrics["tool_calls/malformed"] == 1
    assert out.metrics["assistant_turns"] == 2  # the episode went on after the error
    assert h.executed == []
    response = h.rendering.tokenizer.decode(out.response_ids)
    assert "Error: tool call 1" in response


def test_vllm_hermes_parses_as_the_built_in_parser():
    tokenizer = family("smollm2").tokenizer()
    built_in = get_tool_parser("hermes")
    vllm_hermes = get_tool_parser("vllm:hermes", tokenizer)
    call = (
        '<tool_call>\n{"name": "search", "arguments": {"query": "x ü", "limit": 3}}\n</tool_call>'
    )
    for text in [call, f"let me check\n{call}\n{call}", "no call here"]:
        ours, theirs = built_in.parse(text), vllm_hermes.parse(text)
        assert ours.calls == theirs.calls and ours.content == theirs.content


def test_an_unknown_parser_name_lists_the_built_in_and_the_vllm_ones():
    # Other test modules may register parsers of their own, so the built-in list is not exact.
    with pytest.raises(ValueError, match=r"'nope'.*llama3_json.*built in: \[.*'harmony', 'hermes'"):
        get_tool_parser("nope", family("smollm2").tokenizer())


# --- the gateway and reasoning -----------------------------------------------------------


def _qwen3_gateway() -> tuple[FidelityHarness, TestClient, list[list[int]], Conversation]:
    h = harness("qwen3")
    conversation = Conversation(
        [{"role": "user", "content": "find it"}],
        [
            AssistantTurn("", "I should search.", [ToolCallSpec("search", {"query": "q"}, "hit")]),
            AssistantTurn("It is q.", "The search found it."),
        ],
    )
    _, outputs = h.rendering.reference(conversation)
    h._outputs = outputs
    return h, TestClient(build_app(h.gateway)), outputs, conversation


def _post(client: TestClient, session: str, messages: list[dict]) -> dict:
    response = client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": messages, "tools": TOOL_SCHEMAS},
        headers={"x-session-id": session},
    )
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]


# How the client's second request repeats the first call, and whether that is still the
# conversation the model saw (True: one sample continues; False: a divergence).
HISTORY_CHANGES = {
    "echoed as returned": True,
    "arguments re-serialized": True,  # same JSON object, other spacing: same conversation
    "reasoning dropped": False,
    "user message rewritten": False,
    "system prompt added": False,
}


def _second_request(change: str, prompt: list[dict], reply: dict, tool: dict) -> list[dict]:
    echoed = {k: v for k, v in reply.items() if k != "reasoning" and v is not None}
    if change == "arguments re-serialized":
        [call] = echoed["tool_calls"] = [dict(c) for c in echoed["tool_calls"]]
        arguments = json.loads(call["function"]["arguments"])
        call["function"] = {**call["function"], "arguments": json.dumps(arguments, indent=2)}
    if change == "reasoning dropped":
        echoed.pop("reasoning_content")
    if change == "user message rewritten":
        prompt = [{**prompt[0], "content": prompt[0]["content"].upper()}]
    if change == "system prompt added":
        prompt = [{"role": "system", "content": "Be brief."}, *prompt]
    return [*prompt, echoed, tool]


@pytest.mark.parametrize("change", sorted(HISTORY_CHANGES))
def test_gateway_continues_only_the_history_the_model_saw(change):
    h, client, outputs, conversation = _qwen3_gateway()
    session = "history-" + change.replace(" ", "-")
    first = _post(client, session, conversation.prompt)
    assert first["reasoning_content"] == "I should search."
    assert first["reasoning"] == "I should search."
    [call] = first["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"query": "q"}
    tool = {"role": "tool", "tool_call_id": call["id"], "content": "hit"}
    second = _post(client, session, _second_request(change, conversation.prompt, first, tool))
    assert second["content"] == "It is q."
    assert second["reasoning_content"] == "The search found it."

    stats = client.post(f"/v1/sessions/{session}/finish", json={}).json()
    [(_, samples, _)] = h.sink.drain()
    engine_saw = h.engine.calls[-1].prompt_ids + outputs[-1]
    if HISTORY_CHANGES[change]:
        # One token-exact sample: the first reply's ids (reasoning included) reused.
        assert len(samples) == 1
        assert stats["metrics"]["gateway/divergences"] == 0
        assert samples[0].prompt_ids + samples[0].response_ids == engine_saw
    else:
        # Not the history the model saw: a divergence; each sample is what the engine saw
        # for its call (the second one's prompt re-rendered from the client's messages).
        assert len(samples) == 2
        assert stats["metrics"]["gateway/divergences"] == 1
        assert samples[1].prompt_ids + samples[1].response_ids == engine_saw
        first_sample = samples[0].prompt_ids + samples[0].response_ids
        assert first_sample == h.engine.calls[-2].prompt_ids + outputs[0]


# --- call ids the model writes (Kimi K2) ---------------------------------------------------


def _kimi_conversation() -> Conversation:
    calls = [ToolCallSpec("search", {"query": "q"}, "hit"), ToolCallSpec("now", {}, "noon")]
    return Conversation(
        [{"role": "user", "content": "find it"}],
        [
            AssistantTurn("Looking.", "Two calls.", calls),
            AssistantTurn("", "One more.", [ToolCallSpec("search", {"query": "r"}, "miss")]),
            AssistantTurn("It is q at noon.", "Done."),
        ],
    )


async def test_the_loop_answers_each_call_under_the_id_the_model_wrote():
    h = harness("kimi_k2")
    conversation = _kimi_conversation()
    session, _, _ = h._start(conversation)  # the scripted turns and tool results
    context = _loop_context(h, session, RolloutConfig(keep_messages=True))
    out = await ToolAgentLoop(context).run(
        {"prompt": conversation.prompt}, SamplingParams(max_tokens=512)
    )
    results = [m for m in out.extra["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [
        "functions.search:0",
        "functions.now:1",
        "functions.search:2",
    ]
    response = h.rendering.tokenizer.decode(out.response_ids)
    assert "## Return of functions.now:1\nnoon" in response


def test_the_gateway_hands_the_client_the_ids_the_model_wrote():
    """A client that echoes the reply's ids continues the one sample, token for token (a
    gateway id of its own would render a call the model never wrote)."""
    h = harness("kimi_k2")
    conversation = _kimi_conversation()
    _, h._outputs = h.rendering.reference(conversation)
    client = TestClient(build_app(h.gateway))
    messages = list(conversation.prompt)
    ids = []
    for turn in conversation.turns:
        reply = _post(client, "kimi-gateway", messages)
        messages.append({k: v for k, v in reply.items() if k != "reasoning" and v is not None})
        for call, spec in zip(reply.get("tool_calls") or [], turn.calls, strict=True):
            ids.append(call["id"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": spec.result})
    assert ids == ["functions.search:0", "functions.now:1", "functions.search:2"]
    stats = client.post("/v1/sessions/kimi-gateway/finish", json={}).json()
    [(_, samples, _)] = h.sink.drain()
    assert len(samples) == 1 and stats["metrics"]["gateway/divergences"] == 0
    reference, _ = h.rendering.reference(conversation)
    rendered = h.rendering.encode(h.rendering.render(reference, add_generation_prompt=False))
    assert samples[0].prompt_ids + samples[0].response_ids == rendered
