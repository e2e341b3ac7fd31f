"""build_batch lays samples out as padded tensors; render_sample marks masked spans."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos.turns import turn_layout
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


def _reference_batch(samples: list[Sample], pad: int) -> dict[str, torch.Tensor]:
    """The layout row by row, as the docstring states it."""
    prompt_len = max(len(s.output.prompt_ids) for s in samples)
    response_len = max(max(len(s.output.response_ids) for s in samples), 1)
    rows = len(samples)
    want = {
        "input_ids": torch.full((rows, prompt_len + response_len), pad, dtype=torch.long),
        "attention_mask": torch.zeros((rows, prompt_len + response_len), dtype=torch.long),
        "response_mask": torch.zeros((rows, response_len)),
        "rollout_log_probs": torch.zeros((rows, response_len)),
        "response_versions": torch.full((rows, response_len), -1, dtype=torch.long),
        "turn_index": torch.full((rows, response_len), -1, dtype=torch.long),
        "turn_rewards": torch.zeros((rows, response_len)),
    }
    for i, s in enumerate(samples):
        out, p, r = s.output, len(s.output.prompt_ids), len(s.output.response_ids)
        want["input_ids"][i, prompt_len - p : prompt_len] = torch.tensor(out.prompt_ids)
        want["attention_mask"][i, prompt_len - p : prompt_len + r] = 1
        if not r:
            continue
        want["input_ids"][i, prompt_len : prompt_len + r] = torch.tensor(out.response_ids)
        want["response_mask"][i, :r] = torch.tensor(out.response_mask, dtype=torch.float32)
        want["rollout_log_probs"][i, :r] = torch.tensor(out.response_logprobs)
        want["response_versions"][i, :r] = torch.tensor(out.response_versions)
        want["turn_index"][i, :r], want["turn_rewards"][i, :r] = turn_layout(
            want["response_mask"][i, :r],
            s.score,
            out.extra.get("turn_ends"),
            out.extra.get("turn_rewards"),
        )
    return want


@st.composite
def _sample(draw: st.DrawFn) -> Sample:
    prompt = draw(st.lists(st.integers(1, 99), max_size=5))
    mask = draw(st.lists(st.sampled_from([0, 1]), max_size=8))
    versions = [draw(st.integers(0, 3)) if m else E for m in mask]
    logprobs = [-draw(st.floats(0, 5)) if m else 0.0 for m in mask]
    extra = {}
    if mask and draw(st.booleans()):
        ends = sorted(draw(st.lists(st.integers(0, len(mask)), min_size=1, max_size=3)))
        extra = {"turn_ends": ends, "turn_rewards": [draw(st.floats(-1, 1)) for _ in ends]}
    ids = [draw(st.integers(1, 99)) for _ in mask]
    output = AgentLoopOutput(prompt or [5], ids, mask, logprobs, versions, extra=extra)
    return Sample(output, "g", draw(st.floats(-2, 2)))


@given(st.lists(_sample(), min_size=1, max_size=6), st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_build_batch_matches_the_row_by_row_layout(samples, pad):
    batch, _ = build_batch(samples, pad_token_id=pad)
    for key, want in _reference_batch(samples, pad).items():
        assert batch[key].dtype == want.dtype, key
        assert torch.equal(batch[key], want), key
