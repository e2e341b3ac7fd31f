"""Fixtures: the gateway app in-process over a scripted engine and the tiny tokenizer."""

from __future__ import annotations

import copy

import pytest
from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from agentrl.server.gateway.app import build_app
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.service import GatewayService
from agentrl.server.gateway.sink import InMemorySink
from agentrl.testing.scripted import ScriptedClient
from agentrl.testing.tools import ADD_TOOL_SCHEMA

CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 40}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture
def add_tool():
    return copy.deepcopy(ADD_TOOL_SCHEMA)


@pytest.fixture
def make_gateway(tokenizer):
    """``make_gateway(script=None, sink=None, **gateway_config) -> (service, engine, TestClient)``
    (``sink`` None = an ``InMemorySink``).

    The default script alternates a Hermes call ``add(a=2, b=40)`` (even turns) and
    ``The answer is <42 + turn>.`` (odd turns), each ending with the end-of-turn token.
    """

    def default_script(session_id, turn, prompt_ids):
        text = CALL_TEXT if turn % 2 == 0 else f"The answer is {42 + turn}."
        return [*tokenizer.encode(text), tokenizer.eos_token_id]

    def make(script=None, sink=None, **config):
        engine = ScriptedClient(script or default_script)
        cfg = GatewayConfig(**{"served_model_name": "tiny", **config})
        service = GatewayService(engine, tokenizer, cfg, "tiny", 1024, sink or InMemorySink())
        return service, engine, TestClient(build_app(service))

    return make
