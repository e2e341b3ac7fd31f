"""Shared by the environment tests: the tiny tokenizer and an ``EnvAgentLoop`` whose
model says scripted turns."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from transformers import AutoTokenizer

from agentrl.config import RolloutConfig
from agentrl.envs import EnvAgentLoop
from agentrl.testing.context import loop_context
from agentrl.testing.scripted import ScriptedClient


@pytest.fixture(scope="session")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def _scripted_turns(tokenizer, turns: list[str]) -> Callable:
    """A ``ScriptedClient`` script whose model says ``turns[i]`` (then eos) on turn i,
    starting over after the last."""
    eos = tokenizer.eos_token_id
    encoded = [[*tokenizer.encode(t, add_special_tokens=False), eos] for t in turns]

    def script(session_id, turn, prompt_ids):
        return encoded[turn % len(encoded)]

    return script


@pytest.fixture
def make_loop(tokenizer) -> Callable[..., EnvAgentLoop]:
    """``make_loop(turns, rollout={...}, **env)``: an ``EnvAgentLoop`` with ``rollout.env``
    set from ``env``, keeping its messages and checking drift on every episode."""

    def make(turns: list[str], *, rollout: dict | None = None, **env) -> EnvAgentLoop:
        config = RolloutConfig(
            **{"keep_messages": True, "drift_check_rate": 1.0, **(rollout or {})}, env=env
        )
        client = ScriptedClient(_scripted_turns(tokenizer, turns))
        return EnvAgentLoop(loop_context(tokenizer, client, config=config))

    return make


@pytest.fixture(scope="session")
def scripted_turns(tokenizer) -> Callable[[list[str]], Callable]:
    """``scripted_turns(turns)``: the script of a ``ScriptedClient`` that says ``turns``."""
    return lambda turns: _scripted_turns(tokenizer, turns)
