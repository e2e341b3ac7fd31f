"""AgentLoopOutput: per-token lists and model spans are two views of the same sample."""

from __future__ import annotations

import pickle

import pytest

from agentrl.agent_loops.output import (
    ENV_TOKEN_VERSION,
    AgentLoopOutput,
    TrajectoryError,
    truncate_spans,
)

E = ENV_TOKEN_VERSION


def _lists_output(**overrides) -> AgentLoopOutput:
    fields = {
        "prompt_ids": [1, 2],
        "response_ids": [10, 11, 20, 12, 21],
        "response_mask": [1, 1, 0, 1, 0],
        "response_logprobs": [-0.1, -0.2, 0.0, -0.3, 0.0],
        "response_versions": [4, 5, E, 5, E],
    } | overrides
    return AgentLoopOutput(**fields)


def test_per_token_lists_become_spans_and_read_back_unchanged():
    out = _lists_output()
    assert out.model_spans == [(0, 2), (3, 4)]
    assert out.model_logprobs == [-0.1, -0.2, -0.3] and out.model_versions == [4, 5, 5]
    assert out.response_mask == [1, 1, 0, 1, 0]
    assert out.response_logprobs == [-0.1, -0.2, 0.0, -0.3, 0.0]
    assert out.response_versions == [4, 5, E, 5, E]
    assert out.num_model_tokens == 3 and out.min_version == 4


def test_spans_and_lists_of_the_same_sample_are_equal_however_the_spans_are_split():
    compact = AgentLoopOutput(
        [1, 2],
        [10, 11, 20, 12, 21],
        model_spans=[(0, 1), (1, 2), (3, 4)],
        model_logprobs=[-0.1, -0.2, -0.3],
        model_versions=[4, 5, 5],
    )
    assert compact == _lists_output()
    assert compact != _lists_output(response_logprobs=[-0.1, -0.2, 0.0, -0.4, 0.0])


def test_a_response_without_model_tokens_has_no_spans_and_no_min_version():
    out = AgentLoopOutput([1], [7, 8], [0, 0], [0.0, 0.0], [E, E])
    assert out.model_spans == [] and out.min_version is None and out.num_model_tokens == 0


def test_an_output_survives_pickling_as_ray_ships_it():
    out = _lists_output(num_turns=3, reward=0.5, metrics={"m": 1}, extra={"x": [1]})
    copy = pickle.loads(pickle.dumps(out))
    assert copy == out and copy.model_spans == out.model_spans and copy.num_turns == 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"response_mask": [1, 1, 0, 1]}, r"5 tokens but \{'response_mask': 4\}"),
        ({"response_mask": [1, 2, 0, 1, 0]}, r"response_mask\[1\] = 2"),
        ({"response_logprobs": [-0.1, -0.2, -0.5, -0.3, 0.0]}, "masked token 2"),
        ({"response_versions": [4, 5, 3, 5, E]}, "masked token 2"),
        ({"response_versions": [4, -1, E, 5, E]}, r"model token 1 has no policy version"),
        ({"prompt_ids": []}, "prompt_ids is empty"),
    ],
)
def test_inconsistent_per_token_lists_are_rejected_with_the_position(overrides, message):
    with pytest.raises(TrajectoryError, match=message):
        _lists_output(**overrides)


@pytest.mark.parametrize(
    ("spans", "logprobs", "versions", "message"),
    [
        ([(0, 2)], [-0.1], [1, 1], "hold 2 tokens but there are 1 logprobs and 2 versions"),
        ([(2, 3), (0, 1)], [-0.1, -0.1], [1, 1], "out of order"),
        ([(2, 4)], [-0.1, -0.1], [1, 1], "outside the 3-token response"),
        ([(0, 2)], [-0.1, -0.1], [1, -1], r"model token 1 .* has no policy version"),
    ],
)
def test_inconsistent_compact_fields_are_rejected(spans, logprobs, versions, message):
    with pytest.raises(TrajectoryError, match=message):
        AgentLoopOutput(
            [1], [5, 6, 7], model_spans=spans, model_logprobs=logprobs, model_versions=versions
        )


def test_either_the_lists_or_the_compact_fields_must_be_given_not_both():
    with pytest.raises(TrajectoryError, match="either"):
        AgentLoopOutput([1], [5], [1])
    with pytest.raises(TrajectoryError, match="either"):
        AgentLoopOutput([1], [5], model_spans=[(0, 1)], model_logprobs=[-0.1])
    with pytest.raises(TrajectoryError, match="either"):
        AgentLoopOutput(
            [1],
            [5],
            [1],
            [-0.1],
            [1],
            model_spans=[(0, 1)],
            model_logprobs=[-0.1],
            model_versions=[1],
        )


def test_truncate_spans_drops_and_cuts_spans_past_the_limit_without_changing_them():
    spans = [(0, 2), (3, 6), (7, 8)]
    assert truncate_spans(spans, 5) == ([(0, 2), (3, 5)], 4)
    assert truncate_spans(spans, 3) == ([(0, 2)], 2)
    assert spans == [(0, 2), (3, 6), (7, 8)]
