"""LLM-as-judge rewards (reward.judge) against a scripted model: the real judge, tokenizer
and reward manager; only the rollout servers below them are scripted."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from transformers import AutoTokenizer

from agentrl.config import ConfigError, load_config
from agentrl.core.types import RolloutError
from agentrl.reward import RewardConfig, RewardManager, RewardRequest
from agentrl.reward.config import JudgeConfig
from agentrl.reward.judge import RewardJudge, ServedJudge, default_rubric, parse_verdict
from agentrl.testing import ScriptedClient

ROW = {
    "prompt": [{"role": "user", "content": "What is the capital of France?"}],
    "data_source": "quiz",
    "reward_model": {"ground_truth": "Paris"},
}
OTHER_ROW = {
    "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
    "data_source": "quiz",
    "reward_model": {"ground_truth": "4"},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def judge_model(tokenizer, answer):
    """A scripted judge model: ``answer(judge_prompt_text) -> text`` becomes its tokens."""

    def script(session_id, turn, prompt_ids):
        return tokenizer.encode(answer(tokenizer.decode(prompt_ids)), add_special_tokens=False)

    return ScriptedClient(script)


def grade_by_response(text: str) -> str:
    """10 for a response that says Paris, 2 otherwise; 'garbage' answers with no tag."""
    response = text.split("Response:\n", 1)[1]
    if "garbage" in response:
        return "I cannot decide."
    if "too high" in response:
        return "<score>12</score>"
    return "Good.<score>10</score>" if "Paris" in response else "Wrong. <score>2</score>"


def manager(tokenizer, client, fn=None, **judge):
    config = JudgeConfig(enabled=True, **judge)
    return RewardManager(fn, judge=RewardJudge(config, client, tokenizer))


def requests(row, *responses):
    return [RewardRequest.from_row(row, text) for text in responses]


async def test_pointwise_scores_each_response_from_the_rubric(tokenizer):
    client = judge_model(tokenizer, grade_by_response)
    batch = await manager(tokenizer, client).score_batch(
        requests(ROW, "It is Paris.", "It is Lyon.")
    )
    assert batch.scores == [1.0, 0.2]
    assert [r.error for r in batch.results] == [None, None]
    assert batch.metrics["reward/judge/mean"] == pytest.approx(0.6)
    assert batch.metrics["reward/errors"] == 0
    # The judge read the rubric filled with the row's prompt, ground truth and response,
    # as one user turn of its chat template, greedy and stopping at its eos.
    judged = sorted(tokenizer.decode(call.prompt_ids) for call in client.calls)
    assert "What is the capital of France?" in judged[0]
    assert "Reference answer: Paris" in judged[0]
    assert "Response:\nIt is Lyon." in judged[0] and "Response:\nIt is Paris." in judged[1]
    assert judged[0].startswith("<|im_start|>user\nGrade the response")
    assert judged[0].endswith("<|im_start|>assistant\n")
    sampling = client.calls[0].sampling
    assert sampling.temperature == 0.0 and sampling.stop_token_ids == [tokenizer.eos_token_id]


async def test_yes_no_verdicts_and_a_custom_rubric_and_tag(tokenizer):
    def answer(text):
        return "<verdict>Yes</verdict>" if "Paris" in text.split("ANSWER:")[1] else "<verdict>no"

    rubric = "Q: {prompt}\nANSWER: {response}\nCorrect? <verdict>yes|no</verdict>"
    batch = await manager(
        tokenizer, judge_model(tokenizer, answer), rubric=rubric, verdict="yes_no", tag="verdict"
    ).score_batch(requests(ROW, "Paris", "Rome"))
    assert batch.scores == [1.0, 0.0]
    assert [r.error for r in batch.results] == [None, None]  # an unclosed last tag reads too


async def test_prefill_starts_the_judges_answer(tokenizer):
    def answer(text):
        assert text.endswith("<|im_start|>assistant\n<score>")  # the prompt ends with it
        return "7</score> because it is right"

    batch = await manager(tokenizer, judge_model(tokenizer, answer), prefill="<score>").score_batch(
        requests(ROW, "Paris")
    )
    assert batch.scores == [0.7]


async def test_group_mode_judges_the_responses_of_a_prompt_together(tokenizer):
    def rank(text):
        listed = dict(re.findall(r"Response (\d+):\n(.*?)(?:\n\n|$)", text))
        return " ".join(
            f"<score_{k}>{9 if 'Paris' in r or r == '4' else 3}</score_{k}>"
            for k, r in listed.items()
        )

    client = judge_model(tokenizer, rank)
    batch = await manager(tokenizer, client, mode="group").score_batch(
        [
            *requests(ROW, "Paris", "Lyon"),
            *requests(OTHER_ROW, "4"),
            *requests(ROW, "Paris"),  # the same response again: one entry of the group
        ]
    )
    assert batch.scores == [0.9, 0.3, 0.9, 0.9]
    assert len(client.calls) == 2  # one call per prompt
    by_prompt = {
        "France" in tokenizer.decode(c.prompt_ids): tokenizer.decode(c.prompt_ids)
        for c in client.calls
    }
    assert "Compare 2 responses" in by_prompt[True]
    assert "Response 1:\nParis\n\nResponse 2:\nLyon" in by_prompt[True]
    assert "Response 3" not in by_prompt[True]
    assert "Compare 1 responses" in by_prompt[False]


async def test_group_member_without_a_verdict_fails_alone(tokenizer):
    client = judge_model(tokenizer, lambda text: "<score_1>8</score_1> <score_2>maybe</score_2>")
    batch = await manager(tokenizer, client, mode="group").score_batch(requests(ROW, "a", "b", "c"))
    assert batch.results[0].score == 0.8 and batch.results[0].error is None
    assert batch.results[1].error == "judge: <score_2> holds 'maybe', not a number"
    assert batch.results[2].error == "judge: no <score_3> in the judge's answer"
    assert batch.scores[1:] == [0.0, 0.0]
    assert batch.metrics["reward/errors"] == 2


async def test_single_score_in_group_mode_is_a_group_of_one(tokenizer):
    client = judge_model(tokenizer, lambda text: "<score_1>5</score_1>")
    result = await manager(tokenizer, client, mode="group").score(requests(ROW, "Paris")[0])
    assert result.score == 0.5
    assert "Compare 1 responses" in tokenizer.decode(client.calls[0].prompt_ids)


async def test_identical_pairs_are_judged_once(tokenizer):
    client = judge_model(tokenizer, grade_by_response)
    rewards = manager(tokenizer, client)
    first = await rewards.score_batch(requests(ROW, "Paris", "Paris", "Lyon"))
    assert len(client.calls) == 2  # the two identical requests shared one call in flight
    assert first.scores == [1.0, 1.0, 0.2]
    again = await rewards.score_batch(requests(ROW, "Paris", "Lyon"))
    assert len(client.calls) == 2  # both from the cache
    assert again.scores == [1.0, 0.2]
    assert again.metrics["reward/judge_cached/mean"] == 1.0
    other = await rewards.score_batch(requests(OTHER_ROW, "Paris"))  # another prompt
    assert len(client.calls) == 3
    assert other.metrics["reward/judge_cached/mean"] == 0.0


async def test_cache_is_bounded_and_can_be_off(tokenizer):
    client = judge_model(tokenizer, grade_by_response)
    rewards = manager(tokenizer, client, cache_size=1)
    await rewards.score_batch(requests(ROW, "Paris"))
    await rewards.score_batch(requests(ROW, "Lyon"))  # evicts Paris
    await rewards.score_batch(requests(ROW, "Paris"))
    assert len(client.calls) == 3
    client = judge_model(tokenizer, grade_by_response)
    rewards = manager(tokenizer, client, cache_size=0)
    await rewards.score_batch(requests(ROW, "Paris"))
    await rewards.score_batch(requests(ROW, "Paris"))
    assert len(client.calls) == 2


async def test_garbage_answers_are_failed_rewards_and_not_cached(tokenizer):
    client = judge_model(tokenizer, grade_by_response)
    rewards = manager(tokenizer, client)
    batch = await rewards.score_batch(requests(ROW, "garbage", "too high", "Paris"))
    garbage, too_high, ok = batch.results
    assert garbage.score == 0.0 and not garbage.timed_out
    assert garbage.error == "judge: no <score> in the judge's answer"
    assert garbage.info == {"judge_output": "I cannot decide."}
    assert too_high.error == "judge: <score> holds 12, outside 0..10"
    assert ok.error is None and ok.score == 1.0
    assert batch.metrics["reward/errors"] == 2
    assert batch.metrics["reward/judge/mean"] == 1.0  # only the verdicts that were read
    await rewards.score_batch(requests(ROW, "garbage"))
    assert len(client.calls) == 4  # asked again: a failure is not remembered


class SlowJudge(ScriptedClient):
    """A judge model that takes ``delay_s`` for a response containing 'slow'."""

    def __init__(self, tokenizer, delay_s: float) -> None:
        super().__init__(
            lambda sid, turn, ids: tokenizer.encode("<score>5</score>", add_special_tokens=False)
        )
        self._tokenizer = tokenizer
        self.delay_s = delay_s

    async def generate(self, session_id, prompt_ids, sampling=None):
        if "slow" in self._tokenizer.decode(prompt_ids):
            await asyncio.sleep(self.delay_s)
        return await super().generate(session_id, prompt_ids, sampling)


async def test_a_judge_past_its_timeout_is_a_recorded_timeout_not_a_hang(tokenizer):
    rewards = manager(tokenizer, SlowJudge(tokenizer, delay_s=30), timeout_s=0.3)
    start = time.perf_counter()
    batch = await rewards.score_batch(requests(ROW, "slow answer", "quick answer"))
    assert time.perf_counter() - start < 5
    slow, quick = batch.results
    assert slow.timed_out and slow.score == 0.0
    assert slow.error == "judge: judge timed out after 0.3s"
    assert quick.score == 0.5 and quick.error is None
    assert batch.metrics["reward/timeouts"] == 1 and batch.metrics["reward/errors"] == 0


async def test_a_failing_judge_call_is_a_recorded_failure(tokenizer):
    class Broken(ScriptedClient):
        async def generate(self, session_id, prompt_ids, sampling=None):
            raise RolloutError("prompt is longer than max_model_len")

    batch = await manager(tokenizer, Broken(lambda *a: [])).score_batch(requests(ROW, "x"))
    assert batch.results[0].error == (
        "judge: judge call failed: RolloutError: prompt is longer than max_model_len"
    )
    assert batch.metrics["reward/errors"] == 1


async def test_judge_weighted_with_the_reward_function(tokenizer):
    calls = []

    def exact(data_source, solution_str, ground_truth, extra_info):
        calls.append(solution_str)
        return {"score": float(solution_str == ground_truth), "acc": 1.0}

    client = judge_model(tokenizer, grade_by_response)
    combined = manager(tokenizer, client, exact, weight=0.5, fn_weight=2.0)
    batch = await combined.score_batch(requests(ROW, "Paris", "Lyon"))
    assert batch.scores == [pytest.approx(0.5 * 1.0 + 2.0), pytest.approx(0.5 * 0.2)]
    assert batch.results[0].info == {"acc": 1.0, "fn_score": 1.0, "judge": 1.0, "judge_cached": 0}
    assert batch.metrics["reward/acc/mean"] == 1.0
    judge_alone = manager(tokenizer, client, exact)  # fn_weight 0: the function is not called
    await judge_alone.score_batch(requests(ROW, "Paris"))
    assert calls == ["Paris", "Lyon"]


async def test_a_failing_reward_function_fails_the_combined_reward(tokenizer):
    def broken(data_source, solution_str, ground_truth, extra_info):
        raise ValueError("no")

    client = judge_model(tokenizer, grade_by_response)
    batch = await manager(tokenizer, client, broken, fn_weight=1.0).score_batch(
        requests(ROW, "Paris")
    )
    assert batch.results[0].error == "ValueError: no" and batch.scores == [0.0]


def test_verdict_parsing():
    last = "first <score>3</score> then <score> 6/10 </score>"
    assert parse_verdict(last, "score", "number", 10) == 0.6
    assert parse_verdict("<score>8/10</score>", "score", "number", 10) == 0.8
    assert parse_verdict("<SCORE>**7.5**</SCORE>", "score", "number", 10) == 0.75
    assert parse_verdict("<ok>True.</ok>", "ok", "yes_no", 1) == 1.0
    assert parse_verdict("<score>\n 4 \n</score>", "score", "number", 10) == 0.4
    assert parse_verdict("<score>yes</score</score>", "score", "yes_no", 10) == 1.0
    assert parse_verdict("<score>3\n\nbecause...", "score", "number", 10) == 0.3
    with pytest.raises(ValueError, match="not a number"):
        parse_verdict("<score>seven</score>", "score", "number", 10)
    with pytest.raises(ValueError, match=r"holds -1, outside 0\.\.5"):
        parse_verdict("<score>-1</score>", "score", "number", 5)


def test_default_rubrics_fit_their_mode():
    assert "{response}" in default_rubric("pointwise", "number", "score")
    group = default_rubric("group", "yes_no", "ok")
    assert "{responses}" in group and "<ok_1>yes or no</ok_1>" in group


# -- configuration --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.judge.mdoe=group", "did you mean reward.judge.mode?"),
        ("reward.judge.mode=grup", "'grup' is not allowed; did you mean group?"),
        ("reward.judge.verdict=yes", "one of: number, yes_no"),
        ("reward.judge.max_score=0", "reward.judge.max_score"),
        ("reward.judge.timeout_s=-1", "reward.judge.timeout_s"),
        ("reward.judge.tag=<score>", "reward.judge.tag"),
        ("reward.judge.rubric=rate {respnse}", "unknown placeholder {respnse}; did you mean"),
        ("reward.judge.rubric=rate it", "a pointwise rubric must contain {response}"),
        (
            "reward.judge.server={engine: {backnd: hf}}",
            "reward.judge.server.engine.backnd: unknown key; did you mean "
            "reward.judge.server.engine.backend?",
        ),
        (
            "reward.judge.server={num_replicas: 0}",
            "reward.judge.server.num_replicas: must be greater than or equal to 1, got 0",
        ),
        ("reward.judge.server={name: rollout}", "the policy's application"),
    ],
)
def test_bad_judge_config_is_a_config_error(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, ["reward.judge.enabled=true", override])


def test_group_rubric_needs_the_responses():
    with pytest.raises(ConfigError, match=re.escape("a group rubric must contain {responses}")):
        load_config(None, ["reward.judge.mode=group", "reward.judge.rubric=rate {response}"])
    with pytest.raises(ConfigError, match="not both"):
        load_config(None, ["reward.judge.rubric='{response}'", "reward.judge.rubric_path=r.txt"])


def test_rubric_file_is_read_and_checked(tmp_path, tiny_checkpoint):
    good = tmp_path / "rubric.txt"
    good.write_text('Task {prompt}. Answer {response}. JSON like {"a": 1} stays. <score>')
    config = JudgeConfig(enabled=True, rubric_path=str(good), model_path=str(tiny_checkpoint))
    judge = RewardJudge.from_config(config, load_config().model, load_config().server)
    assert judge.rubric == good.read_text()
    bad = tmp_path / "bad.txt"
    bad.write_text("Answer {answer}")
    config = config.model_copy(update={"rubric_path": str(bad)})
    with pytest.raises(ConfigError, match=r"bad\.txt: unknown placeholder \{answer\}"):
        RewardJudge.from_config(config, load_config().model, load_config().server)
    config = config.model_copy(update={"rubric_path": str(tmp_path / "missing.txt")})
    with pytest.raises(ConfigError, match=r"missing\.txt is not a file"):
        RewardJudge.from_config(config, load_config().model, load_config().server)


def test_from_config_serves_the_frozen_initial_policy_by_default(tiny_checkpoint):
    cfg = load_config(
        None,
        [
            f"model.path={tiny_checkpoint}",
            "server.engine.backend=hf",
            "server.num_replicas=3",
            "reward.judge.enabled=true",
            "reward.judge.server={engine: {max_model_len: 4096}}",
        ],
    )
    rewards = RewardManager.from_config(cfg.reward, cfg.model, cfg.server)
    served = rewards.judge._server
    assert isinstance(served, ServedJudge)
    assert served.model.path == str(tiny_checkpoint)  # the policy's initial weights
    assert served.server.name == "judge" and served.server.num_replicas == 1
    assert served.server.engine.backend == "hf"  # the policy's engine ...
    assert served.server.engine.max_model_len == 4096  # ... with the judge's changes
    rewards.close()  # never started: nothing to stop


def test_judge_needs_a_model():
    config = RewardConfig(judge=JudgeConfig(enabled=True))
    with pytest.raises(ConfigError, match=r"reward\.judge\.model_path is required"):
        RewardManager.from_config(config)


def test_request_from_a_row_carries_its_prompt():
    request = RewardRequest.from_row(ROW, "Paris")
    assert request.prompt == ROW["prompt"]


async def test_a_training_step_judges_each_rows_episodes_as_a_group(tokenizer):
    """The trainer's scoring (score_episodes) hands the judge each row's prompt: the
    episodes of one row are one group, failed episodes are not judged."""
    from agentrl.core.trajectory import AgentLoopOutput
    from agentrl.rollout.episode import EpisodeResult
    from agentrl.trainer.steps import score_episodes

    def episode(name, group, text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        output = AgentLoopOutput([1], ids, [1] * len(ids), [0.0] * len(ids), [0] * len(ids))
        return EpisodeResult(name, group, 0, 0, "single_turn", outputs=[output])

    client = judge_model(tokenizer, lambda text: "<score_1>10</score_1><score_2>0</score_2>")
    episodes = [
        episode("a", "france", "Paris"),
        episode("b", "sum", "4"),
        episode("c", "france", "Lyon"),
        episode("d", "sum", "5"),
        EpisodeResult("e", "sum", 0, 1, "single_turn", error="worker died"),
    ]
    samples, metrics = await score_episodes(
        episodes,
        {"france": ROW, "sum": OTHER_ROW},
        manager(tokenizer, client, mode="group"),
        tokenizer,
    )
    assert {s.episode_id: s.score for s in samples} == {"a": 1.0, "b": 1.0, "c": 0.0, "d": 0.0}
    prompts = sorted(tokenizer.decode(c.prompt_ids) for c in client.calls)
    assert len(prompts) == 2
    assert "What is 2 + 2?" in prompts[0] and "Response 1:\n4\n\nResponse 2:\n5" in prompts[0]
    assert "France" in prompts[1] and "Response 1:\nParis\n\nResponse 2:\nLyon" in prompts[1]
    assert metrics["reward/judge/mean"] == 0.5 and metrics["rollout/failed_episodes"] == 1
