"""build_batch lays samples out as padded tensors; render_sample marks masked spans."""

from __future__ import annotations

import torch

from agentrl.core.trajectory import ENV_TOKEN_VERSION, AgentLoopOutput
from agentrl.trainer.batch import Sample, build_batch
from agentrl.trainer.samples import render_sample

E = ENV_TOKEN_VERSION


class _Tokenizer:
    def decode(self, ids, **_):
        return " ".join(map(str, ids))


def _samples() -> list[Sample]:
    two_turns = AgentLoopOutput(
        [1, 2, 3],
        [10, 11, 20, 21, 12],
        [1, 1, 0, 0, 1],
        [-0.1, -0.2, 0.0, 0.0, -0.3],
        [4, 4, E, E, 5],
        extra={"sample_weight": 0.5},
    )
    from_lists = AgentLoopOutput([7], [30, 31], [0, 1], [0.0, -0.7], [E, 6])
    return [Sample(two_turns, "g0", 1.0), Sample(from_lists, "g1", -1.0)]


def test_build_batch_pads_prompts_left_and_responses_right():
    batch, groups = build_batch(_samples(), pad_token_id=0)
    assert groups == ["g0", "g1"]
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 10, 11, 20, 21, 12],
        [0, 0, 7, 30, 31, 0, 0, 0],
    ]
    assert batch["attention_mask"].tolist() == [[1] * 8, [0, 0, 1, 1, 1, 0, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 1, 0, 0, 1], [0, 1, 0, 0, 0]]
    expected = torch.tensor([[-0.1, -0.2, 0, 0, -0.3], [0, -0.7, 0, 0, 0]])
    assert torch.allclose(batch["rollout_log_probs"], expected)
    assert batch["response_versions"].tolist() == [[4, 4, E, E, 5], [E, 6, E, E, E]]
    assert batch["scores"].tolist() == [1.0, -1.0]
    assert batch["sample_weight"].tolist() == [0.5, 1.0]
    for sample, mask in zip(_samples(), batch["response_mask"], strict=True):
        assert mask[: len(sample.output.response_ids)].tolist() == sample.output.response_mask


def test_render_sample_marks_the_tokens_the_model_did_not_produce():
    rendered = [render_sample(s, _Tokenizer()) for s in _samples()]
    assert rendered == ["1 2 310 11⟦20 21⟧12", "7⟦30⟧31"]
