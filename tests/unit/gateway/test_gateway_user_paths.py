"""What a new user of the gateway hits first: the model name, tools on a template without
tool support, and a ``max_tokens`` that cannot fit."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from agentrl.config import load_config
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.server.gateway.app import build_app
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.deployment import served_model_names
from agentrl.server.gateway.service import GatewayService
from agentrl.server.gateway.sink import InMemorySink
from agentrl.testing.scripted import ScriptedClient
from agentrl.testing.tools import ADD_TOOL_SCHEMA
from agentrl.tools import BaseTool, ToolResponse
from agentrl.tools.render import template_supports_tools

ROOT = Path(__file__).resolve().parents[3]
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 40}}\n</tool_call>'
# ChatML without any `tools` branch, as SmolLM2-Instruct's template (the demo model).
CHATML_WITHOUT_TOOLS = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class AddTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters["a"] + parameters["b"])), 0.0, {}


def _client(http: TestClient, session_id: str | None = None) -> openai.OpenAI:
    headers = {"x-session-id": session_id} if session_id else None
    return openai.OpenAI(
        base_url="http://gateway/v1", api_key="-", http_client=http, default_headers=headers
    )


def _gateway(tokenizer, model_path: str, script=None, **config):
    def answer(session_id, turn, prompt_ids):
        text = CALL_TEXT if turn == 0 else "The answer is 42."
        return [*tokenizer.encode(text), tokenizer.eos_token_id]

    gateway = GatewayConfig(**config)
    name, aliases = served_model_names(gateway, model_path, f"/cache/{model_path}")
    engine = ScriptedClient(script or answer)
    service = GatewayService(
        engine, tokenizer, gateway, name, 1024, InMemorySink(), model_aliases=aliases
    )
    return engine, TestClient(build_app(service))


@pytest.mark.parametrize(
    ("path", "short"),
    [
        ("builtin:smollm2-135m-instruct", "smollm2-135m-instruct"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
        ("/ckpt/run-3/step_100/", "step_100"),
    ],
)
def test_gateway_lists_the_short_model_name_and_accepts_the_path_too(tokenizer, path, short):
    _, http = _gateway(tokenizer, path)
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [short]
    client = _client(http)
    for name in (short, path, f"/cache/{path}"):
        reply = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.model == short
    wrong = http.post(
        "/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user"}]}
    )
    assert wrong.status_code == 404
    assert repr(short) in wrong.json()["error"]["message"]


def test_served_model_name_replaces_the_listed_name_and_the_short_name_still_works(tokenizer):
    _, http = _gateway(tokenizer, "builtin:smollm2-135m-instruct", served_model_name="policy")
    assert http.get("/v1/models").json()["data"][0]["id"] == "policy"
    assert http.get("/v1/models/smollm2-135m-instruct").status_code == 200
    assert http.get("/v1/models/any").status_code == 404


def test_tools_on_a_template_without_tool_support_go_to_the_system_prompt_as_in_agent_loops(
    tokenizer, tiny_checkpoint
):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = CHATML_WITHOUT_TOOLS
    assert not template_supports_tools(plain)
    engine, http = _gateway(plain, "tiny")
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 + 40?"},
    ]
    client = _client(http, "plain-tools")
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL_SCHEMA])
    (call,) = first.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"a": 2, "b": 40}

    cfg = load_config(None, [f"model.path={tiny_checkpoint}"])
    worker = AgentLoopWorker(
        cfg,
        client=ScriptedClient(lambda *_: [0]),
        tools={"add": AddTool(tool_schema=ADD_TOOL_SCHEMA)},
        tokenizer=plain,
    )
    expected = worker.renderer.encode_messages(messages, True)
    assert engine.calls[0].prompt_ids == expected
    prompt = plain.decode(engine.calls[0].prompt_ids)
    assert prompt.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert '"name": "add"' in prompt

    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = client.chat.completions.create(
        model="tiny", messages=messages, tools=[ADD_TOOL_SCHEMA]
    )
    assert second.choices[0].message.content == "The answer is 42."
    (sample,) = http.get("/v1/sessions/plain-tools").json()["samples"]
    assert sample["prompt_ids"] == expected  # the second call continued the first's ids


@pytest.mark.parametrize(
    ("plain_template", "overrides", "expected_text"),
    [
        (True, ['rollout.tools_prompt_template="Use these:\\n{tools}"'], "\n\nUse these:\n{"),
        (False, ["rollout.tools_in_system_prompt=true"], "\n\n# Tools\n"),
        (True, ["rollout.tools_in_system_prompt=false"], None),
    ],
)
def test_the_gateway_follows_the_rollout_tool_prompt_settings_as_the_agent_loops_do(
    tokenizer, tiny_checkpoint, plain_template, overrides, expected_text
):
    chat = copy.deepcopy(tokenizer)
    if plain_template:
        chat.chat_template = CHATML_WITHOUT_TOOLS
    cfg = load_config(None, [f"model.path={tiny_checkpoint}", *overrides])
    engine, http = _gateway(chat, "tiny", **cfg.gateway.model_dump())
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 + 40?"},
    ]
    _client(http).chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL_SCHEMA])

    worker = AgentLoopWorker(
        cfg,
        client=ScriptedClient(lambda *_: [0]),
        tools={"add": AddTool(tool_schema=ADD_TOOL_SCHEMA)},
        tokenizer=chat,
    )
    assert engine.calls[0].prompt_ids == worker.renderer.encode_messages(messages, True)
    prompt = chat.decode(engine.calls[0].prompt_ids)
    if expected_text is None:
        assert '"name": "add"' not in prompt
    else:
        assert prompt.startswith(f"<|im_start|>system\nYou are terse.{expected_text}")
        assert prompt.count('"name": "add"') == 1


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_beyond_the_context_window_is_an_openai_400(tokenizer, field):
    engine, http = _gateway(tokenizer, "tiny")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], field: 10**9}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == field
    assert "maximum context length is 1024 tokens" in error["message"]
    assert engine.calls == []
    with pytest.raises(openai.BadRequestError, match="context length"):
        _client(http).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2000
        )


def test_max_tokens_that_fits_is_kept_and_no_max_tokens_is_capped_to_the_window(tokenizer):
    engine, http = _gateway(tokenizer, "tiny", default_max_tokens=5000)
    fits = http.post("/v1/generate", json={"prompt_ids": [5] * 1000, "max_tokens": 24})
    assert fits.status_code == 200
    default = http.post("/v1/generate", json={"prompt_ids": [5] * 1000})
    assert default.status_code == 200
    assert [c.sampling.max_tokens for c in engine.calls] == [24, 24]
    over = http.post("/v1/generate", json={"prompt_ids": [5] * 1000, "max_tokens": 25})
    assert over.status_code == 400
    assert over.json()["error"]["code"] == "context_length_exceeded"
    completion = http.post(
        "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 10**9}
    )
    assert completion.status_code == 400
    assert completion.json()["error"]["param"] == "max_tokens"


def _documented_chat_curls() -> list[tuple[dict[str, str], dict]]:
    """(headers, JSON body) of every ``curl .../v1/chat/completions`` in the guide."""
    text = (ROOT / "docs" / "guides" / "external-agents.md").read_text()
    calls = []
    for command in re.findall(r"^curl .*?(?<!\\)$", text.replace("\\\n", "\\ "), re.M | re.S):
        words = shlex.split(command.replace("\\ ", " "))
        if not words[words.index("-s") + 1].endswith("/v1/chat/completions"):
            continue
        headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
        calls.append((headers, json.loads(words[words.index("-d") + 1])))
    return calls


def test_the_guides_curl_examples_work_against_the_documented_model(tokenizer):
    calls = _documented_chat_curls()
    assert len(calls) == 2
    _, http = _gateway(tokenizer, "builtin:smollm2-135m-instruct")  # the guide's model.path
    for headers, body in calls:
        headers.pop("Authorization", None)  # the guide's server sets gateway.api_key
        reply = http.post("/v1/chat/completions", json=body, headers=headers)
        assert reply.status_code == 200, reply.json()
