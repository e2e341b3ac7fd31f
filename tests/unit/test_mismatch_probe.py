"""The mismatch probe: compare the actor with the rollout on one policy version only,
on fresh answers of the replicas after a push."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentrl.config import load_config
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import SamplingParams, TokenOutput
from agentrl.server.client import ReplicaFailure
from agentrl.trainer.batch import Sample
from agentrl.trainer.steps import mismatch_metrics, mismatch_probe
from agentrl.trainer.trainer import Trainer


def _batch() -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.arange(12).reshape(3, 4),
        "attention_mask": torch.ones(3, 4, dtype=torch.long),
        "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]]),
        "response_versions": torch.tensor([[2, 2, -1], [1, 1, 1], [1, 2, 2]]),
        "rollout_log_probs": torch.tensor(
            [[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0], [-9.0, -1.0, -1.0]]
        ),
    }


def test_the_probe_keeps_rows_and_tokens_of_the_current_version_only():
    probe = mismatch_probe(_batch(), version=2, max_rows=8)
    assert probe["input_ids"].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert probe["response_mask"].tolist() == [[1, 1, 0], [0, 1, 1]]
    assert mismatch_probe(_batch(), version=2, max_rows=1)["input_ids"].shape[0] == 1
    assert mismatch_probe(_batch(), version=3, max_rows=8) is None


def test_tokens_of_an_older_version_do_not_count_as_mismatch():
    probe = mismatch_probe(_batch(), version=2, max_rows=8)
    # The actor agrees with the rollout on every version-2 token; the version-1 token of
    # row 3 differs a lot (the policy changed) and must not show up.
    actor = probe["rollout_log_probs"].clone()
    actor[1, 0] = -1.0
    metrics = mismatch_metrics(probe, actor)
    assert metrics["mismatch/mismatch_kl"] == 0.0
    assert metrics["mismatch/probe_tokens"] == 4.0
    actor[0, 1] = -2.5  # the trainer finds a version-2 token less likely than the engine did
    assert mismatch_metrics(probe, actor)["mismatch/mismatch_kl"] > 0.1


class _Client:
    """Answers every prompt with three tokens of ``version``; the prompt ``[13]`` fails and
    the prompt ``[12]`` is answered by a replica that missed the push (version 0)."""

    def __init__(self, version: int) -> None:
        self.version, self.prompts = version, []

    async def generate(self, session_id, prompt_ids, sampling) -> TokenOutput:
        self.prompts.append(prompt_ids)
        if prompt_ids == [13]:
            raise ReplicaFailure("rollout replica failed")
        version = 0 if prompt_ids == [12] else self.version
        return TokenOutput(
            token_ids=[5, 6, 7],
            logprobs=[-0.5, -1.0, -1.5],
            finish_reason="length",
            num_cached_tokens=0,
            weight_version=version,
            token_versions=[version] * 3,
        )


class _Actor:
    world_size = 2

    def __init__(self, shift: float) -> None:
        self.shift, self.batches = shift, []

    def compute_log_prob(self, batch):
        self.batches.append(batch)
        return {"log_probs": batch["rollout_log_probs"] + self.shift}


def _trainer(shift: float, rows: int) -> Trainer:
    cfg = load_config(
        None, ["trainer.old_log_probs=rollout", f"trainer.mismatch_probe_rows={rows}"]
    )
    trainer = Trainer(cfg)
    trainer.version = 4
    trainer.processes.client = SimpleNamespace(data=_Client(trainer.version))
    trainer.processes.actor = _Actor(shift)
    trainer.processes.manager = SimpleNamespace(default_sampling=SamplingParams)
    trainer.tokenizer = SimpleNamespace(pad_token_id=0)
    return trainer


def _samples(prompts: list[list[int]]) -> list[Sample]:
    """Two samples per prompt (a group), as a step's batch has them."""
    return [
        Sample(
            AgentLoopOutput(prompt, [9], [1], [-1.0], [3]),
            group_id=f"g{i}",
            score=1.0,
        )
        for i, prompt in enumerate(prompts)
        for _ in range(2)
    ]


async def test_the_probe_scores_fresh_answers_of_the_pushed_version_only():
    trainer = _trainer(shift=0.0, rows=6)
    metrics = await trainer.probe_mismatch(_samples([[10], [11], [12], [13]]))
    # One request per row, the groups' prompts in turn; the failed one and the answer of
    # the replica that missed the push are left out, the rest scored by the actor.
    assert trainer.processes.client.data.prompts == [[10], [11], [12], [13], [10], [11]]
    assert trainer.processes.actor.batches[0]["input_ids"][:, 0].tolist() == [10, 11, 10, 11]
    assert metrics["mismatch/probe_tokens"] == 12.0
    assert metrics["mismatch/mismatch_kl"] == 0.0
    assert (await _trainer(shift=-0.2, rows=6).probe_mismatch(_samples([[10]])))[
        "mismatch/mismatch_kl"
    ] == pytest.approx(0.2)


async def test_the_probe_asks_one_answer_per_rank_at_least_and_skips_when_too_few():
    trainer = _trainer(shift=0.0, rows=1)
    assert "mismatch/mismatch_kl" in await trainer.probe_mismatch(_samples([[10]]))
    assert trainer.processes.client.data.prompts == [[10], [10]]
    # Only one usable answer for two ranks: no probe this step, and no error.
    lagging = _trainer(shift=0.0, rows=1)
    assert await lagging.probe_mismatch(_samples([[10], [12]])) == {}
    assert lagging.processes.actor.batches == []
