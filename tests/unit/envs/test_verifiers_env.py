"""``verifiers:TASKSET`` against the real verifiers 0.4 package: tasksets defined in the
test modules ``vf_arith`` (a single-turn taskset with a boxed-answer reward and an adder
toolset) and ``vf_guess`` (an ``Env`` whose ``run`` answers guesses with hints), run
through ``EnvAgentLoop`` with a scripted model."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.agent_loops.chat import first_drift
from agentrl.config import RolloutConfig, load_config
from agentrl.core.types import SamplingParams
from agentrl.envs import EnvAgentLoop, EnvError, UnknownEnvError, env_factory
from agentrl.envs.rows import env_rows
from agentrl.envs.verifiers import available_ids, verifiers_tools
from agentrl.rollout.episode import make_requests
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.testing.context import loop_context
from agentrl.testing.scripted import ScriptedClient

SAMPLING = SamplingParams(max_tokens=64)


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture
def vf_loop(tokenizer, scripted_turns):
    """``vf_loop(turns, source, tools=..., **env)``: an ``EnvAgentLoop`` on ``source``
    whose model says ``turns``, with ``tools`` in its chat template."""

    def make(turns, source, tools=None, **env):
        config = RolloutConfig(
            keep_messages=True, drift_check_rate=1.0, env={"source": source, **env}
        )
        client = ScriptedClient(scripted_turns(turns))
        return EnvAgentLoop(loop_context(tokenizer, client, config=config, tools=tools))

    return make


def _row(seed: int) -> dict:
    return {"prompt": [], "extra_info": {"env_seed": seed}}


def _model_texts(out) -> list[str]:
    return [m["content"] for m in out.extra["messages"] if m["role"] == "assistant"]


async def test_the_tasks_prompt_opens_and_the_tasks_rewards_score_the_answer(vf_loop):
    out = await vf_loop([r"It is \boxed{3}."], "verifiers:vf_arith").run(_row(1), SAMPLING)
    messages = out.extra["messages"]
    assert messages[:2] == [
        {"role": "system", "content": r"Answer in \boxed{}."},
        {"role": "user", "content": "What is 1 + 2?"},
    ]
    # correct (weight 1) scored 1, used_tool (weight 0.5) 0: the weighted sum.
    assert out.extra["turn_rewards"] == [1.0] and out.reward == 1.0
    assert out.extra["stop_reason"] == "terminated"
    assert set(out.response_mask) == {1}

    wrong = await vf_loop([r"\boxed{4}"], "verifiers:vf_arith").run(_row(1), SAMPLING)
    assert wrong.reward == 0.0


def test_seeds_pick_the_tasks_and_the_rows_command_writes_their_openings():
    rows = env_rows("verifiers:vf_arith", [0, 2, 3])
    assert [row["prompt"][-1]["content"] for row in rows] == [
        "What is 0 + 2?",
        "What is 2 + 2?",
        "What is 0 + 2?",  # seed 3 of 3 tasks wraps around
    ]
    assert rows[0]["extra_info"] == {"env_source": "verifiers:vf_arith", "env_seed": 0}
    sized = env_rows("verifiers:vf_arith", [4], {"env": {"taskset": {"size": 5}}})
    assert sized[0]["prompt"][-1]["content"] == "What is 4 + 2?"


async def test_toolset_tools_are_agentrl_tools_called_by_the_models_tool_calls(vf_loop, tokenizer):
    tools = verifiers_tools("vf_arith")
    assert list(tools) == ["adder_add"]
    schema = tools["adder_add"].tool_schema.to_dict()["function"]
    assert schema["description"] == "Add two integers."
    assert schema["parameters"]["required"] == ["a", "b"]

    loop = vf_loop([_call("adder_add", a=2, b=2), r"\boxed{4}"], "verifiers:vf_arith", tools)
    out = await loop.run(_row(2), SAMPLING)
    # The schema is in the prompt the model saw.
    assert "adder_add" in tokenizer.decode(out.prompt_ids)
    messages = out.extra["messages"]
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "name": "adder_add",
        "content": "4",
    }
    # correct 1.0 + used_tool 0.5 * 1.0, at the end; the tool turn earned 0.
    assert out.extra["turn_rewards"] == [0.0, 1.5] and out.reward == 1.5
    # Model turns mask 1, the tool message's delta mask 0, and one render of it all.
    first_end = out.extra["turn_ends"][0]
    delta = await loop.renderer.encode_delta([messages[3]], True)
    assert out.response_mask[:first_end] == [1] * first_end
    assert out.response_mask[first_end : first_end + len(delta)] == [0] * len(delta)
    assert out.response_ids[first_end : first_end + len(delta)] == delta
    assert out.response_mask[first_end + len(delta) :] == [1] * (
        len(out.response_ids) - first_end - len(delta)
    )
    assert out.metrics["tokenization_drift"] == 0


async def test_bad_unknown_and_malformed_tool_calls_are_answered_with_the_error(vf_loop):
    tools = verifiers_tools("vf_arith")
    turns = [
        _call("adder_add", a="two", b=2),
        _call("adder_mul", a=1, b=2),
        "<tool_call>\nnot json\n</tool_call>",
        r"\boxed{2}",
    ]
    out = await vf_loop(turns, "verifiers:vf_arith", tools).run(_row(0), SAMPLING)
    answers = [m["content"] for m in out.extra["messages"] if m["role"] == "tool"]
    assert len(answers) == 3
    assert answers[0].startswith("Error: invalid arguments for tool 'adder_add': a: 'two'")
    assert answers[1] == "Error: unknown tool 'adder_mul'. Available tools: adder_add."
    assert answers[2].startswith("Error: ")
    assert out.extra["turn_rewards"] == [0.0, 0.0, 0.0, 1.5]  # right, and a tool was called


async def test_a_multi_turn_envs_run_answers_each_reply_until_it_returns(vf_loop):
    loop = vf_loop(["5", "8", "7"], "verifiers:vf_guess")
    out = await loop.run(_row(0), SAMPLING)
    messages = out.extra["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        "Guess my number (1-9); say only the number.",
        "Higher.",
        "Lower.",
    ]
    assert out.extra["turn_rewards"] == [0.0, 0.0, 1.0]
    assert out.extra["stop_reason"] == "terminated" and out.num_turns == 5
    # The hints come in as mask-0 deltas between the model turns.
    ends = out.extra["turn_ends"]
    for end in ends[:-1]:
        assert out.response_mask[end] == 0
    renderer = loop.renderer
    rendered = renderer.encode_messages(messages, False)
    ids = out.prompt_ids + out.response_ids
    assert first_drift(ids, rendered, renderer.stop_token_ids) is None


async def test_an_env_config_knob_and_a_run_that_ends_without_the_answer(vf_loop):
    out = await vf_loop(["1"], "verifiers:vf_guess", kwargs={"env": {"max_guesses": 2}}).run(
        _row(0), SAMPLING
    )
    assert out.extra["turn_rewards"] == [0.0, 0.0] and out.extra["stop_reason"] == "terminated"
    # The loop's own limit stops an env that would go on: its run is cancelled.
    out = await vf_loop(["1"], "verifiers:vf_guess", max_turns=2).run(_row(0), SAMPLING)
    assert out.extra["stop_reason"] == "max_turns" and out.reward == 0.0


@pytest.fixture(scope="module")
def worker(tiny_checkpoint, tokenizer, scripted_turns):
    cfg = load_config(
        None,
        [f"model.path={tiny_checkpoint}", "rollout.agent_name=env", "rollout.loop_timeout_s=60"],
    )
    client = ScriptedClient(scripted_turns(["5", "8", "7"]))
    return AgentLoopWorker(cfg, client=client, tools={}, tokenizer=tokenizer)


async def test_an_env_that_raises_is_a_recorded_failed_episode(worker):
    def row(**env):
        extra = {"env_source": "verifiers:vf_guess", "env_seed": 0, "env_kwargs": {"env": env}}
        return {"prompt": [{"role": "user", "content": "x"}], "extra_info": extra}

    requests = make_requests([row(fail_after=2), row()], n=1, sampling=SAMPLING)
    failed, fine = await asyncio.gather(*(worker.run_episode(r) for r in requests))
    assert not failed.ok and failed.outputs == []
    assert failed.error == (
        "EnvError: env verifiers:vf_guess step 2 raised RuntimeError: the hint machine broke"
    )
    assert fine.ok and fine.outputs[0].reward == 1.0


def test_an_unknown_taskset_lists_the_bundled_ones():
    assert {"textarena", "openenv"} <= set(available_ids())
    with pytest.raises(UnknownEnvError) as info:
        env_factory("verifiers:no_such_taskset")
    message = str(info.value)
    assert "unknown verifiers taskset 'no_such_taskset'" in message
    assert f"Bundled: {', '.join(available_ids())}" in message


def test_a_hub_id_says_hub_environments_are_not_downloaded():
    with pytest.raises(UnknownEnvError, match="hub environments cannot be downloaded here"):
        env_factory("verifiers:primeintellect/gsm8k@0.1")


def test_a_taskset_that_needs_the_network_names_it():
    with pytest.raises(EnvError) as info:
        env_factory("verifiers:vf_arith")(env={"taskset": {"url": "http://127.0.0.1:9/data"}})
    message = str(info.value)
    assert message.startswith("verifiers:vf_arith needs the network: loading its tasks failed")
    assert "ConnectError" in message


def test_a_seat_the_model_does_not_play_is_a_clear_error():
    with pytest.raises(EnvError, match=r"no seat 'user'; seats: \['player'\]"):
        env_factory("verifiers:vf_guess")(seat="user")


async def test_a_task_with_judges_says_they_need_the_network():
    env = env_factory("verifiers:vf_arith")(
        env={"taskset": {"task": {"judges": [{"id": "reference"}]}}}
    )
    with pytest.raises(
        EnvError, match=r"needs the network: its judges \['reference'\] call a model"
    ):
        await env.reset(None, 0)
