"""EnvAgentLoop against a scripted engine and small test environments: token-exactness,
per-turn rewards, limits, and every way an environment can misbehave."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest

from agentrl.agent_loops.chat import first_drift
from agentrl.agent_loops.registry import get_agent_loop
from agentrl.config import load_config
from agentrl.core.trajectory import ENV_TOKEN_VERSION
from agentrl.core.types import SamplingParams
from agentrl.envs import EnvAgentLoop, StepResult, aggregate_rewards, register_env
from agentrl.envs.reward import compute_score as env_reward
from agentrl.rollout.episode import make_requests
from agentrl.rollout.metrics import episode_info
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.testing.scripted import ScriptedClient

SAMPLING = SamplingParams(max_tokens=64)
CLOSED: list[str] = []
RELEASE = threading.Event()  # lets the hung thread of the sync-hang test finish


@register_env("test_counter")
class CounterEnv:
    """Async env: ``turns`` steps, rewards ``rewards[i]``, then terminated. Records the
    messages it was given."""

    def __init__(self, turns: int = 3, rewards: list[float] | None = None) -> None:
        self.turns = turns
        self.rewards = rewards or [0.1 * (i + 1) for i in range(turns)]
        self.seen: list[dict] = []
        self.seed = None

    async def reset(self, row=None, seed=None):
        self.seed = seed
        return [{"role": "user", "content": f"Count with me (seed {seed})."}], {}

    async def step(self, message):
        self.seen.append(message)
        i = len(self.seen)
        done = i >= self.turns
        answer = [] if done else [{"role": "user", "content": f"That was turn {i}."}]
        return StepResult(answer, self.rewards[i - 1], terminated=done)

    async def close(self):
        CLOSED.append("counter")


@register_env("test_endless")
class EndlessEnv:
    """Sync env that never ends an episode (answers every turn with a tool message)."""

    def reset(self, row=None, seed=None):
        return [{"role": "user", "content": "Go."}], {}

    def step(self, message):
        return [{"role": "tool", "content": "more " * 8}], 1.0, False, False, {}


def _faulty(step_result=None, *, raises=None, hang=None, reset_result=None):
    class FaultyEnv:
        async def reset(self, row=None, seed=None):
            if reset_result is not None:
                return reset_result
            return [{"role": "user", "content": "Go."}], {}

        async def step(self, message):
            if raises:
                raise raises
            if hang == "async":
                await asyncio.sleep(30)
            return step_result

        def close(self):
            CLOSED.append("faulty")

    return FaultyEnv


class SyncHangEnv:
    def reset(self, row=None, seed=None):
        return [{"role": "user", "content": "Go."}], {}

    def step(self, message):
        RELEASE.wait(10)
        return [], 0.0, True, False, {}


FAULTS = {
    "raises": (
        _faulty(raises=ValueError("board on fire")),
        "step 1 raised ValueError: board on fire",
    ),
    "async_hang": (_faulty(hang="async"), "step 1 timed out after 0.3 s"),
    "sync_hang": (SyncHangEnv, "step 1 timed out after 0.3 s"),
    "malformed": (_faulty("not a step"), "step 1 returned 'not a step'; expected a StepResult"),
    "short_tuple": (_faulty(([], 1.0, True)), "expected a StepResult or a (messages, reward"),
    "text_reward": (
        _faulty(StepResult([], "1.0", terminated=True)),  # type: ignore[arg-type]
        "step 1 returned a non-numeric reward '1.0' (str)",
    ),
    "none_reward": (
        _faulty(StepResult([], None, terminated=True)),  # type: ignore[arg-type]
        "non-numeric reward None (NoneType)",
    ),
    "bool_reward": (
        _faulty(StepResult([], True, terminated=True)),
        "non-numeric reward True (bool)",
    ),
    "nan_reward": (_faulty(StepResult([], math.nan, terminated=True)), "non-finite reward nan"),
    "flag": (_faulty(([], 1.0, "yes", False, {})), "terminated='yes'; expected a bool"),
    "no_messages": (
        _faulty(StepResult([], 1.0)),
        "step 1 returned no messages (the model would have nothing to answer)",
    ),
    "assistant_role": (
        _faulty(StepResult([{"role": "assistant", "content": "x"}], 1.0)),
        "message 0 has role 'assistant'",
    ),
    "bad_reset": (_faulty(reset_result=["just one"]), "reset returned ['just one']; expected a"),
    "empty_reset": (_faulty(reset_result=([], {})), "reset returned no messages"),
    "no_step_method": (lambda: object(), "which has no reset() method"),
}
for _name, (_factory, _) in FAULTS.items():
    register_env(f"test_fault_{_name}")(_factory)


def _row(**extra_info):
    return {"prompt": [{"role": "user", "content": "unused"}], "extra_info": extra_info}


def test_the_env_loop_is_the_built_in_env_agent():
    assert get_agent_loop("env") is EnvAgentLoop


async def test_ids_are_the_conversation_rendered_once_with_model_tokens_masked_in(
    tokenizer, make_loop
):
    loop = make_loop(["one", "two", "three"], source="test_counter")
    out = await loop.run(_row(env_seed=7), SAMPLING)
    renderer = loop.renderer
    messages = out.extra["messages"]
    assert messages[0] == {"role": "user", "content": "Count with me (seed 7)."}
    assert [m["role"] for m in messages] == ["user", *["assistant", "user"] * 2, "assistant"]

    assert out.prompt_ids == renderer.encode_messages(messages[:1], True)
    rendered = renderer.encode_messages(messages, False)
    ids = out.prompt_ids + out.response_ids
    assert first_drift(ids, rendered, renderer.stop_token_ids) is None
    assert out.metrics["drift_checked"] == 1 and out.metrics["tokenization_drift"] == 0

    # Each model turn saw the conversation so far, rendered with the assistant header.
    calls = loop.context.client.calls
    for k, call in enumerate(calls):
        assert call.prompt_ids == renderer.encode_messages(messages[: 2 * k + 1], True)
    # Mask layout: each model turn (mask 1) is exactly what the engine sent; each user turn
    # (mask 0) is the template's delta for that message.
    eos = tokenizer.eos_token_id
    expected_ids, expected_mask = [], []
    for i, text in enumerate(["one", "two", "three"]):
        turn = [*tokenizer.encode(text, add_special_tokens=False), eos]
        expected_ids += turn
        expected_mask += [1] * len(turn)
        if i < 2:
            delta = await renderer.encode_delta([messages[2 * i + 2]], True)
            expected_ids += delta
            expected_mask += [0] * len(delta)
    assert out.response_ids == expected_ids
    assert out.response_mask == expected_mask
    masked = [v for v, m in zip(out.response_versions, out.response_mask, strict=True) if not m]
    assert set(masked) == {ENV_TOKEN_VERSION}
    assert out.num_turns == 5


async def test_per_turn_rewards_are_kept_with_where_each_model_turn_ends(tokenizer, make_loop):
    loop = make_loop(["a", "bb", "ccc"], source="test_counter")
    out = await loop.run(_row(env_kwargs={"rewards": [0.5, -1.0, 2.0]}), SAMPLING)
    assert out.extra["turn_rewards"] == [0.5, -1.0, 2.0]
    assert out.extra["stop_reason"] == "terminated"
    assert out.reward == pytest.approx(1.5) and out.metrics["env/reward"] == pytest.approx(1.5)
    assert out.metrics["env/steps"] == 3 and out.metrics["env/terminated"] == 1
    # A turn's end is the response position right after its last model token.
    ends = out.extra["turn_ends"]
    assert len(ends) == 3 and ends[-1] == len(out.response_ids)
    for end in ends:
        assert out.response_mask[end - 1] == 1
        assert end == len(out.response_ids) or out.response_mask[end] == 0
    assert out.response_ids[ends[0] - 1] == tokenizer.eos_token_id
    # The reward function of env episodes hands the aggregate to training.
    assert env_reward("test_counter", "", None, episode_info(out)) == pytest.approx(1.5)


@pytest.mark.parametrize(("how", "expected"), [("sum", 1.5), ("last", 2.0), ("mean", 0.5)])
async def test_the_episode_reward_is_the_configured_aggregate(tokenizer, how, expected, make_loop):
    loop = make_loop(["x"], source="test_counter", reward_aggregate=how)
    out = await loop.run(_row(env_kwargs={"rewards": [0.5, -1.0, 2.0]}), SAMPLING)
    assert out.reward == pytest.approx(expected)
    assert aggregate_rewards([], how) == 0.0


def test_env_reward_refuses_an_episode_without_an_env_reward():
    with pytest.raises(ValueError, match="scores episodes of the `env` agent loop only"):
        env_reward("gsm8k", "42", "42", {"num_turns": 1, "rollout_metrics": {}})


async def test_the_step_gets_the_assistant_message_with_its_parsed_tool_calls(tokenizer, make_loop):
    call = '<tool_call>\n{"name": "move", "arguments": {"to": "left"}}\n</tool_call>'
    broken = "<tool_call>\n{not json}\n</tool_call>"
    env = CounterEnv(turns=3)
    register_env("test_recording")(lambda: env)
    loop = make_loop([f"I move. {call}", broken, "done"], source="test_recording")
    await loop.run(_row(), SAMPLING)
    first, second, third = env.seen
    assert first["role"] == "assistant" and first["content"] == f"I move. {call}"
    assert first["tool_calls"] == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "move", "arguments": {"to": "left"}},
        }
    ]
    assert second["tool_calls"] == [] and len(second["tool_call_errors"]) == 1
    assert third == {"role": "assistant", "content": "done", "tool_calls": []}


async def test_max_turns_ends_the_episode_truncated_without_the_unanswered_message(
    tokenizer, make_loop
):
    loop = make_loop(["again"], source="test_endless", max_turns=3)
    out = await loop.run(_row(), SAMPLING)
    assert out.extra["stop_reason"] == "max_turns"
    assert out.extra["turn_rewards"] == [1.0, 1.0, 1.0] and out.metrics["env/terminated"] == 0
    # Three model turns, two tool answers in between; the last answer is not tokenized.
    assert out.num_turns == 5 and out.response_mask[-1] == 1
    assert out.extra["messages"][-1]["role"] == "tool"


async def test_the_response_budget_ends_the_episode(tokenizer, make_loop):
    loop = make_loop(
        ["a few words here"], source="test_endless", rollout={"max_response_length": 40}
    )
    out = await loop.run(_row(), SAMPLING)
    assert out.extra["stop_reason"] == "response_budget"
    assert len(out.response_ids) == 40
    # Every model turn made was stepped; none started after the budget ran out.
    assert len(out.extra["turn_rewards"]) == len(loop.context.client.calls) >= 2


async def test_a_sync_env_gives_the_same_ids_inline_and_in_a_thread(tokenizer, make_loop):
    outputs = []
    for in_thread in (True, False):
        loop = make_loop(["go"], source="test_endless", max_turns=2, sync_in_thread=in_thread)
        outputs.append(await loop.run(_row(), SAMPLING))
    assert outputs[0].response_ids == outputs[1].response_ids
    assert outputs[0].response_mask == outputs[1].response_mask


async def test_the_env_is_closed_when_the_episode_ends(tokenizer, make_loop):
    CLOSED.clear()
    await make_loop(["x"], source="test_counter").run(_row(), SAMPLING)
    assert CLOSED == ["counter"]


@pytest.fixture(scope="module")
def worker(tiny_checkpoint, tokenizer, scripted_turns):
    cfg = load_config(
        None,
        [
            f"model.path={tiny_checkpoint}",
            "rollout.agent_name=env",
            "rollout.env.step_timeout_s=0.3",
            "rollout.loop_timeout_s=20",
        ],
    )
    client = ScriptedClient(scripted_turns(["my move"]))
    yield AgentLoopWorker(cfg, client=client, tools={}, tokenizer=tokenizer)
    RELEASE.set()


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_misbehaving_env_is_a_recorded_failed_episode(worker, fault):
    CLOSED.clear()
    rows = [
        {
            "prompt": [{"role": "user", "content": "x"}],
            "extra_info": {"env_source": f"test_fault_{fault}"},
        },
        {
            "prompt": [{"role": "user", "content": "x"}],
            "extra_info": {"env_source": "test_counter"},
        },
    ]
    results = await asyncio.gather(
        *(worker.run_episode(r) for r in make_requests(rows, n=1, sampling=SAMPLING))
    )
    failed, fine = results
    assert not failed.ok and failed.outputs == []
    assert failed.error.startswith(f"EnvError: env test_fault_{fault} ")
    assert FAULTS[fault][1] in failed.error
    # The worker goes on: the other episode of the batch is whole.
    assert fine.ok and fine.outputs[0].extra["stop_reason"] == "terminated"
    if fault in ("raises", "malformed", "text_reward", "async_hang"):
        assert "faulty" in CLOSED  # the failed episode's env was closed too


async def test_a_missing_source_is_a_recorded_failure_that_says_what_to_set(worker):
    (request,) = make_requests([{"prompt": [{"role": "user", "content": "x"}]}], 1, SAMPLING)
    result = await worker.run_episode(request)
    assert result.error == (
        "EnvError: no environment: set rollout.env.source (or the row's extra_info.env_source)"
    )


async def test_an_unknown_source_fails_the_episode_listing_the_close_ones(worker):
    row = {
        "prompt": [{"role": "user", "content": "x"}],
        "extra_info": {"env_source": "gymnasium:FrozenLake-v9"},
    }
    (request,) = make_requests([row], 1, SAMPLING)
    result = await worker.run_episode(request)
    assert result.error.startswith("UnknownEnvError: unknown gymnasium environment 'FrozenLake-v9'")
    assert "closest: FrozenLake-v1" in result.error


def test_env_config_has_a_default_and_a_description_for_every_field():
    config = load_config(None, ["rollout.env.source=gymnasium:Taxi-v4", "rollout.env.kwargs={}"])
    assert config.rollout.env.source == "gymnasium:Taxi-v4"
    for name, field in type(config.rollout.env).model_fields.items():
        assert field.description, name
    json.dumps(config.rollout.env.model_dump())
