"""The mismatch probe: compare the actor with the rollout on one policy version only."""

from __future__ import annotations

import torch

from agentrl.trainer.steps import mismatch_metrics, mismatch_probe


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
