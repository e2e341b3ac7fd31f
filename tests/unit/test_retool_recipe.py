"""The ReTool recipe's reward and tool config."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.reward.loader import load_reward_fn
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.tools import load_tools

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "retool"


def _calls(ran: int, failed: int) -> dict:
    return {"rollout_metrics": {"tool_calls": ran + failed, "tool_calls/ok": ran}}


def test_reward_is_plus_minus_one_with_tool_bonus_on_wrong_answers():
    score = load_reward_fn(str(RECIPE / "reward.py"), "compute_score")
    right = score("m", "so it is \\boxed{4}", "4", _calls(1, 0))
    wrong = score("m", "so it is \\boxed{5}", "4", _calls(0, 0))
    wrong_with_tool = score("m", "<tool_call>{}</tool_call>\n5\n \\boxed{5}", "4", _calls(1, 0))
    no_bonus = score("m", "\\boxed{5}", "4", _calls(1, 0) | {"tool_bonus": 0})
    assert (right["score"], right["acc"], right["tool_used"]) == (1.0, 1.0, 1.0)
    assert (wrong["score"], wrong["acc"], wrong["tool_used"]) == (-1.0, 0.0, 0.0)
    assert wrong_with_tool["score"] == -0.9 and wrong_with_tool["tool_used"] == 1.0
    assert no_bonus["score"] == -1.0


def test_a_failed_call_ranks_between_a_call_that_ran_and_no_call():
    score = load_reward_fn(str(RECIPE / "reward.py"), "compute_score")
    right_after_a_failed_call = score("m", "\\boxed{4}", "4", _calls(1, 1))
    ran = score("m", "\\boxed{5}", "4", _calls(1, 0))["score"]
    only_failed_calls = score("m", "\\boxed{5}", "4", _calls(0, 2))
    no_call = score("m", "\\boxed{5}", "4", _calls(0, 0))["score"]
    no_penalty = score("m", "\\boxed{5}", "4", _calls(0, 1) | {"failed_call_penalty": 0})
    assert right_after_a_failed_call["score"] == 0.95
    assert ran > only_failed_calls["score"] > no_call
    assert only_failed_calls["score"] == pytest.approx(-0.95)
    assert only_failed_calls["tool_used"] == 1.0
    assert only_failed_calls["failed_calls"] == 1.0
    assert no_penalty["score"] == -0.9


def test_without_the_loops_call_counts_a_tool_call_tag_counts_as_a_call_that_ran():
    score = load_reward_fn(str(RECIPE / "reward.py"), "compute_score")
    assert score("m", "<tool_call>{}</tool_call> \\boxed{5}", "4", {})["score"] == -0.9
    assert score("m", "\\boxed{5}", "4", None)["score"] == -1.0


def test_tool_config_loads_the_sandboxed_code_interpreter():
    tools = load_tools(RECIPE / "tools.yaml")
    assert list(tools) == ["code_interpreter"]


@pytest.fixture(scope="module")
def warm_start(load_script):
    return load_script("recipes/retool/warm_start.py")


ROW = {
    "prompt": [{"role": "user", "content": "Calculate 3 * (4 + 5).\n\nUse the tool."}],
    "reward_model": {"ground_truth": "27"},
    "extra_info": {"question": "Calculate 3 * (4 + 5)."},
}


def test_warm_start_demonstration_trains_only_the_assistant_turns(tiny_checkpoint, warm_start):
    cfg = load_config(
        RECIPE / "cpu.yaml", [f"model.path={tiny_checkpoint}", "rollout.num_workers=1"]
    )
    worker = AgentLoopWorker(cfg, client=object())
    ids, mask = asyncio.run(warm_start._tokenize(worker, ROW))
    assert len(ids) == len(mask)
    prompt = asyncio.run(worker.renderer.encode_prompt(ROW["prompt"]))
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
    decode = worker.tokenizer.decode
    trained = decode([t for t, m in zip(ids, mask, strict=True) if m])
    response = zip(ids[len(prompt) :], mask[len(prompt) :], strict=True)
    not_trained = decode([t for t, m in response if not m])
    assert '"code": "print(3 * (4 + 5))"' in trained
    assert trained.endswith("The answer is \\boxed{27}." + worker.tokenizer.eos_token)
    assert "27" in not_trained  # the real interpreter's output, as a tool turn (mask 0)
    assert (
        asyncio.run(
            warm_start._tokenize(worker, {**ROW, "extra_info": {"question": "What is love?"}})
        )
        is None
    )


def test_direct_warm_start_demonstration_answers_without_the_tool(tiny_checkpoint, warm_start):
    cfg = load_config(
        RECIPE / "cpu.yaml", [f"model.path={tiny_checkpoint}", "rollout.num_workers=1"]
    )
    worker = AgentLoopWorker(cfg, client=object())
    ids, mask = asyncio.run(warm_start._tokenize(worker, ROW, direct=True))
    prompt = asyncio.run(worker.renderer.encode_prompt(ROW["prompt"]))
    answer = worker.tokenizer.decode(ids[len(prompt) :])
    assert ids[: len(prompt)] == prompt
    assert answer == "The answer is \\boxed{27}." + worker.tokenizer.eos_token
    assert mask == [0] * len(prompt) + [1] * (len(ids) - len(prompt))


def test_demonstrations_are_the_first_calculate_rows_the_first_share_direct(warm_start):
    select = warm_start.select_demonstrations
    rows = [{**ROW, "extra_info": {"question": f"Calculate {100 + i} * 200."}} for i in range(20)]
    rows.insert(1, {**ROW, "extra_info": {"question": "What is love?"}})
    chosen = select(rows, 8, 0.25)
    assert [direct for _, direct in chosen] == [True, True] + [False] * 6
    assert [row["extra_info"]["question"] for row, _ in chosen] == [
        f"Calculate {100 + i} * 200." for i in range(8)
    ]


def test_no_tool_control_rows_report_their_own_accuracy():
    score = load_reward_fn(str(RECIPE / "reward.py"), "compute_score")
    control = {"control": "no_tool"}
    assert score("m", "\\boxed{4}", "4", control) == {"score": 1.0, "no_tool_acc": 1.0}
    assert score("m", "\\boxed{5}", "4", control) == {"score": -1.0, "no_tool_acc": 0.0}


def test_the_one_gpu_recipe_places_its_replica_and_rank_on_one_gpu():
    """gpu-1.yaml: one vLLM replica and one FSDP rank whose Ray GPU fractions add up to
    one card (the rank's placement-group bundle fits what the replica leaves), a vLLM
    memory share that does not grow with the card, and no NCCL between two processes
    on one device."""
    from agentrl.placement import group_sizes, node_capacities, rank_bundle

    cfg = load_config(RECIPE / "gpu-1.yaml")
    server, actor = cfg.server, cfg.workers.actor
    assert (server.num_replicas, server.engine.tensor_parallel_size, actor.world_size) == (1, 1, 1)
    assert server.num_gpus_per_replica + actor.num_gpus_per_worker <= 1.0
    assert 0 < server.num_gpus_per_replica < 1 and 0 < actor.num_gpus_per_worker < 1
    # A 16-CPU, 1-GPU node after the replica took its share holds the rank's bundle.
    bundle = rank_bundle(actor.num_cpus_per_worker, actor.num_gpus_per_worker)
    free = {"CPU": 16.0, "GPU": 1.0 - server.num_gpus_per_replica}
    assert node_capacities(bundle, [free]) == [1]
    assert group_sizes(1, None, node_capacities(bundle, [free])) == [1]
    engine = server.engine
    assert engine.backend == "vllm" and engine.kv_cache_memory_bytes is not None
    assert engine.gpu_memory_utilization <= 0.25
    assert engine.max_model_len >= cfg.data.max_prompt_length + cfg.rollout.max_response_length
    assert cfg.weight_sync.kind == "object_store"
    # Neither a reference nor a critic asks for a GPU of its own.
    assert not (cfg.algorithm.kl.use_kl_loss or cfg.algorithm.kl.use_kl_in_reward)
    assert cfg.algorithm.adv_estimator != "gae"
    assert actor.fsdp.gradient_checkpointing and actor.fsdp.param_dtype == "bfloat16"
