"""TrajectoryBuilder: token ids turn by turn, each model turn kept as a span."""

from __future__ import annotations

import pytest

from agentrl.agent_loops.output import ENV_TOKEN_VERSION, TrajectoryError
from agentrl.agent_loops.trajectory import TrajectoryBuilder
from agentrl.server.types import TokenOutput


def _turn(ids, logprobs=None, versions=None, version=3) -> TokenOutput:
    logprobs = [-0.5 - i for i in range(len(ids))] if logprobs is None else logprobs
    versions = [version] * len(ids) if versions is None else versions
    return TokenOutput(list(ids), logprobs, "stop", 0, version, versions)


def test_model_and_environment_turns_line_up_token_by_token():
    builder = TrajectoryBuilder([1, 2, 3])
    builder.add_model_turn(_turn([10, 11], version=4))
    builder.add_env_tokens([20, 21, 22])
    builder.add_model_turn(_turn([12], versions=[5]))
    builder.add_model_turn(_turn([]))
    builder.add_env_tokens([23])
    assert builder.ids == [1, 2, 3, 10, 11, 20, 21, 22, 12, 23]
    assert builder.response_length == 7
    out = builder.build()
    assert out.prompt_ids == [1, 2, 3]
    assert out.response_ids == [10, 11, 20, 21, 22, 12, 23]
    assert out.response_mask == [1, 1, 0, 0, 0, 1, 0]
    assert out.response_logprobs == [-0.5, -1.5, 0.0, 0.0, 0.0, -0.5, 0.0]
    e = ENV_TOKEN_VERSION
    assert out.response_versions == [4, 4, e, e, e, 5, e]
    assert out.num_turns == 5
    out.validate()  # the full per-token rules hold


def test_the_output_keeps_model_tokens_compactly():
    builder = TrajectoryBuilder([1])
    builder.add_env_tokens([7])
    builder.add_model_turn(_turn([8, 9]))
    builder.add_env_tokens([6])
    builder.add_model_turn(_turn([5], version=4))
    out = builder.build()
    assert out.model_spans == [(1, 3), (4, 5)]
    assert out.model_logprobs == [-0.5, -1.5, -0.5] and out.model_versions == [3, 3, 4]
    assert out.num_model_tokens == 3 and out.min_version == 3


def test_ids_is_a_new_list_each_time():
    builder = TrajectoryBuilder([1, 2])
    ids = builder.ids
    ids.append(99)
    builder.add_env_tokens([3])
    assert builder.ids == [1, 2, 3]


def test_build_cuts_every_list_to_the_response_budget():
    builder = TrajectoryBuilder([1])
    builder.add_model_turn(_turn([10, 11, 12]))
    builder.add_env_tokens([20, 21])
    out = builder.build(max_response_length=4, metrics={"m": 1}, extra={"x": 2})
    assert out.response_ids == [10, 11, 12, 20]
    assert out.response_mask == [1, 1, 1, 0]
    assert len(out.response_logprobs) == len(out.response_versions) == 4
    assert out.metrics == {"m": 1} and out.extra == {"x": 2}


@pytest.mark.parametrize(
    ("logprobs", "versions", "message"),
    [
        ([-0.1], [1, 1], "token 2 has 2 tokens, 1 logprobs and 2 versions"),
        ([-0.1, -0.2, -0.3], [1, 1], "2 tokens, 3 logprobs and 2 versions"),
        ([-0.1, -0.2], [1], "2 tokens, 2 logprobs and 1 versions"),
    ],
)
def test_an_engine_turn_whose_counts_disagree_is_rejected_and_named(logprobs, versions, message):
    builder = TrajectoryBuilder([1])
    builder.add_model_turn(_turn([10]))
    builder.add_env_tokens([20])
    with pytest.raises(TrajectoryError, match=message):
        builder.add_model_turn(_turn([30, 31], logprobs, versions))


def test_a_model_token_without_a_policy_version_is_rejected_by_build():
    builder = TrajectoryBuilder([1])
    builder.add_model_turn(_turn([10]))
    builder.add_model_turn(_turn([30, 31], versions=[1, -1]))
    with pytest.raises(TrajectoryError, match=r"model token 2 .* has no policy version"):
        builder.build()
