"""TrajectoryBuilder: token ids turn by turn, per-token mask/logprobs/versions laid out once."""

from __future__ import annotations

import pytest

from agentrl.core.trajectory import ENV_TOKEN_VERSION, TrajectoryBuilder, TrajectoryError
from agentrl.core.types import TokenOutput


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


def test_per_token_lists_can_be_read_before_build():
    builder = TrajectoryBuilder([1])
    builder.add_env_tokens([7])
    builder.add_model_turn(_turn([8, 9]))
    assert builder.response_mask == [0, 1, 1]
    assert builder.response_versions == [ENV_TOKEN_VERSION, 3, 3]
    assert builder.response_logprobs == [0.0, -0.5, -1.5]


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
        ([-0.1, -0.2], [1, -1], "without a policy version"),
    ],
)
def test_an_inconsistent_engine_turn_is_named_when_the_lists_are_laid_out(
    logprobs, versions, message
):
    builder = TrajectoryBuilder([1])
    builder.add_model_turn(_turn([10]))
    builder.add_env_tokens([20])
    builder.add_model_turn(_turn([30, 31], logprobs, versions))
    with pytest.raises(TrajectoryError, match=message):
        builder.build()
