"""AgentLoopWorker in-process with a scripted engine: dispatch, failures, timeouts, groups."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.registry import register_agent_loop
from agentrl.config import load_config
from agentrl.core.trajectory import TrajectoryBuilder
from agentrl.core.types import SamplingParams
from agentrl.rollout.episode import make_requests
from agentrl.rollout.worker import AgentLoopWorker, AgentLoopWorkerConfig
from agentrl.testing.scripted import ScriptedClient

SAMPLING = SamplingParams(max_tokens=16)


@register_agent_loop("test_crashing")
class CrashingLoop(AgentLoopBase):
    async def run(self, sample, sampling):
        raise RuntimeError("loop bug")


@register_agent_loop("test_hanging")
class HangingLoop(AgentLoopBase):
    async def run(self, sample, sampling):
        await asyncio.sleep(60)


@register_agent_loop("test_stubborn")
class StubbornLoop(AgentLoopBase):
    """Swallows the cancellation of its time limit and returns."""

    async def run(self, sample, sampling):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return []


@register_agent_loop("test_slow_tool")
class SlowToolLoop(AgentLoopBase):
    """Fails with a TimeoutError of its own (a tool's limit), well within the episode's."""

    async def run(self, sample, sampling):
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)


@register_agent_loop("test_two_samples")
class TwoSampleLoop(AgentLoopBase):
    """An episode that emits two training samples (e.g. after context compaction)."""

    async def run(self, sample, sampling):
        outputs = []
        for _ in range(2):
            trajectory = TrajectoryBuilder(await self.apply_chat_template(sample["prompt"]))
            trajectory.add_model_turn(await self.generate(trajectory.ids, sampling))
            outputs.append(trajectory.build())
        return outputs


@pytest.fixture(scope="module")
def worker(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    cfg = load_config(None, [f"model.path={tiny_checkpoint}", "rollout.loop_timeout_s=0.5"])
    client = ScriptedClient(lambda session, turn, prompt: [5, 6, tokenizer.eos_token_id])
    return AgentLoopWorker(cfg, client=client, tools={}, tokenizer=tokenizer)


def _rows(agent_name: str | None, count: int = 2):
    row = {"prompt": [{"role": "user", "content": "hi"}]}
    if agent_name:
        row["agent_name"] = agent_name
    return [dict(row) for _ in range(count)]


async def test_default_loop_runs_every_sample_of_every_row(worker):
    requests = make_requests(_rows(None, 3), n=4, sampling=SAMPLING)
    results = await asyncio.gather(*(worker.run_episode(r) for r in requests))
    assert len(results) == 12 and all(r.ok for r in results)
    assert {r.agent_name for r in results} == {"single_turn"}
    groups = {}
    for r in results:
        groups.setdefault(r.group_id, set()).add((r.row_index, r.sample_index))
    assert sorted(groups.values(), key=min) == [{(i, k) for k in range(4)} for i in range(3)]
    # Each episode is its own session.
    sessions = {c.session_id for c in worker.client.calls[-12:]}
    assert len(sessions) == 12


async def test_crashing_loop_is_a_failed_result_not_a_crash(worker):
    requests = make_requests(_rows("test_crashing") + _rows(None, 1), n=1, sampling=SAMPLING)
    results = await asyncio.gather(*(worker.run_episode(r) for r in requests))
    assert [r.ok for r in results] == [False, False, True]
    assert results[0].error == "RuntimeError: loop bug"
    assert results[0].outputs == []


@pytest.mark.parametrize("agent_name", ["test_hanging", "test_stubborn"])
async def test_a_loop_past_its_time_limit_times_out(worker, agent_name):
    (request,) = make_requests(_rows(agent_name, 1), n=1, sampling=SAMPLING)
    result = await worker.run_episode(request)
    assert result.error == "episode timed out after 0.5 s"
    assert asyncio.current_task().cancelling() == 0


async def test_a_timeout_error_of_the_loop_itself_is_a_failure_not_a_time_out(worker):
    (request,) = make_requests(_rows("test_slow_tool", 1), n=1, sampling=SAMPLING)
    result = await worker.run_episode(request)
    assert result.error == "TimeoutError: "


async def test_unknown_agent_name_is_a_failed_result(worker):
    (request,) = make_requests(_rows("does_not_exist", 1), n=1, sampling=SAMPLING)
    result = await worker.run_episode(request)
    assert not result.ok and "unknown agent loop 'does_not_exist'" in result.error


async def test_loop_may_return_several_samples_for_one_episode(worker):
    (request,) = make_requests(_rows("test_two_samples", 1), n=1, sampling=SAMPLING)
    result = await worker.run_episode(request)
    assert result.ok and len(result.outputs) == 2
    assert all(o.response_ids == [5, 6, worker.tokenizer.eos_token_id] for o in result.outputs)


def test_a_worker_takes_only_its_sections_of_the_full_config(tiny_checkpoint):
    cfg = load_config(
        None, [f"model.path={tiny_checkpoint}", "rollout.n=3", "trainer.total_steps=7"]
    )
    worker_cfg = AgentLoopWorkerConfig.of(cfg.model_dump())
    assert set(worker_cfg.model_dump()) == {"plugins", "model", "server", "rollout"}
    assert worker_cfg.rollout.n == 3
    assert AgentLoopWorkerConfig.of(cfg) == worker_cfg
    assert AgentLoopWorkerConfig.of(worker_cfg) is worker_cfg


def test_a_worker_built_from_python_accepts_builtin_model_names(tiny_checkpoint):
    """As the CLI does: `builtin:tiny-qwen2` is a checkpoint name, not a hub id."""
    cfg = load_config(None, ["model.path=builtin:tiny-qwen2"])
    worker = AgentLoopWorker(cfg, client=ScriptedClient(lambda *_: []), tools={})
    expected = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert worker.tokenizer.get_vocab() == expected.get_vocab()


def test_the_models_generation_config_stop_tokens_end_its_turns(tmp_path):
    """A GLM checkpoint lists `<|user|>` and `<|observation|>` beside eos in its generation
    config (vLLM stops at each); the worker's renderer takes them as turn ends, so a turn
    that stopped at `<|observation|>` is not followed by a second one from the template."""
    from transformers import GenerationConfig

    from agentrl.testing.families import family

    tokenizer = family("glm45").tokenizer()
    tokenizer.save_pretrained(tmp_path)
    cfg = load_config(None, [f"model.path={tmp_path}"])
    plain = AgentLoopWorker(cfg, client=ScriptedClient(lambda *_: []), tools={})
    assert plain.renderer.stop_token_ids == {tokenizer.eos_token_id}

    stops = ["<|endoftext|>", "<|user|>", "<|observation|>"]
    GenerationConfig(eos_token_id=tokenizer.convert_tokens_to_ids(stops)).save_pretrained(tmp_path)
    worker = AgentLoopWorker(cfg, client=ScriptedClient(lambda *_: []), tools={})
    assert worker.renderer.stop_token_ids == set(tokenizer.convert_tokens_to_ids(stops))
    delta = worker.renderer.delta_text([{"role": "tool", "content": "4"}], True)
    assert delta == "\n<tool_response>\n4\n</tool_response><|assistant|>"
