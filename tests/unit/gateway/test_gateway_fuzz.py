"""Hypothesis fuzz of every gateway endpoint: any body gets a non-5xx answer, never a hang."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from agentrl.server.gateway.app import build_app
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.service import GatewayService
from agentrl.server.gateway.sink import InMemorySink
from agentrl.testing.scripted import ScriptedClient

ENDPOINTS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/sessions/fuzz/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/generate"),
    ("POST", "/v1/sessions/fuzz/reward"),
    ("POST", "/v1/sessions/fuzz/finish"),
    ("GET", "/v1/sessions/fuzz"),
    ("GET", "/v1/models/tiny"),
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "x", 3, None])
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles},
        optional={
            "content": st.none() | st.text(max_size=30) | json_values,
            "tool_calls": json_values,
            "tool_call_id": st.text(max_size=5) | json_values,
        },
    ),
    max_size=4,
)
chat_like = st.fixed_dictionaries(
    {"model": st.sampled_from(["tiny", "other"]) | json_values, "messages": messages},
    optional={
        "tools": json_values,
        "tool_choice": json_values,
        "temperature": json_values,
        "top_p": json_values,
        "max_tokens": st.integers(-5, 5000) | json_values,
        "n": st.integers(-1, 12),
        "stop": json_values,
        "stream": st.booleans(),
        "logprobs": json_values,
        "seed": json_values,
    },
)
generate_like = st.fixed_dictionaries(
    {"prompt_ids": st.lists(st.integers(-10, 5000), max_size=8) | json_values},
    optional={
        "max_tokens": json_values,
        "temperature": json_values,
        "top_k": json_values,
        "stop_token_ids": json_values,
    },
)
completion_like = st.fixed_dictionaries(
    {"model": st.just("tiny") | json_values, "prompt": st.text(max_size=20) | json_values},
    optional={"max_tokens": json_values, "logprobs": json_values, "echo": json_values},
)
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
plausible_chat = st.fixed_dictionaries(
    {
        "model": st.just("tiny"),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["system", "user", "assistant", "tool"]),
                    "content": st.text(max_size=30),
                }
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "tools": st.just([ADD]),
        "tool_choice": st.sampled_from(["none", "auto", "required"]),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "max_tokens": st.integers(1, 50),
        "n": st.integers(1, 4),
        "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
        "stream": st.booleans(),
        "logprobs": st.booleans(),
    },
)
bodies = (
    plausible_chat.map(json.dumps)
    | json_values.map(json.dumps)
    | chat_like.map(json.dumps)
    | generate_like.map(json.dumps)
    | completion_like.map(json.dumps)
    | st.binary(max_size=64)
)


@pytest.fixture(scope="module")
def http(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    engine = ScriptedClient(lambda sid, turn, prompt: [5, 6, tokenizer.eos_token_id])
    config = GatewayConfig(served_model_name="tiny", max_sessions=50, max_n=4)
    service = GatewayService(engine, tokenizer, config, "tiny", 512, InMemorySink())
    return TestClient(build_app(service), raise_server_exceptions=False)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(endpoint=st.sampled_from(ENDPOINTS), body=bodies, session=st.none() | st.text(max_size=8))
def test_no_body_gets_a_server_error(http, endpoint, body, session):
    method, path = endpoint
    headers = {"content-type": "application/json"}
    if session is not None and session.isprintable() and session.isascii():
        headers["x-session-id"] = session
    reply = http.request(method, path, content=body, headers=headers)
    assert reply.status_code < 500, (path, body, reply.text)
    if reply.status_code >= 400:
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
