"""Driver-side batching of the FSDP workers: DP shards, micro-batch plans, packing, LR."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentrl.trainer.config import OptimConfig
from agentrl.trainer.dispatch import (
    MINI_BATCH_KEY,
    balanced_partition,
    gather_rows,
    shard_mini_batches,
    shard_rows,
    validate_batch,
)
from agentrl.trainer.micro_batch import count_micro_batches, pack_rows, plan_micro_batches
from agentrl.trainer.optim import lr_factor


def padded_batch(lengths: list[tuple[int, int]], prompt: int = 6, response: int = 5):
    """Rows with (prompt_len, response_len): prompt left-padded, response right-padded."""
    ids = torch.arange(1, len(lengths) * (prompt + response) + 1).view(len(lengths), -1)
    attn = torch.zeros_like(ids)
    for row, (p, r) in enumerate(lengths):
        attn[row, prompt - p : prompt + r] = 1
    return {"input_ids": ids * attn, "attention_mask": attn, "response_mask": attn[:, prompt:]}


def test_balanced_partition_gives_equal_counts_and_near_equal_tokens():
    rng = random.Random(0)
    for _ in range(200):
        n, parts = rng.randint(1, 40), rng.randint(1, 8)
        if n < parts:
            continue
        weights = [rng.randint(1, 500) for _ in range(n)]
        groups = balanced_partition(weights, parts)
        assert sorted(i for g in groups for i in g) == list(range(n))
        sizes = [len(g) for g in groups]
        assert max(sizes) - min(sizes) <= 1
        loads = [sum(weights[i] for i in g) for g in groups]
        assert max(loads) - min(loads) <= max(weights)


def test_batch_smaller_than_world_size_is_rejected_with_counts():
    with pytest.raises(ValueError, match=r"3 ranks.*has 2"):
        balanced_partition([5, 5], 3)


def test_mini_batches_do_not_depend_on_world_size():
    batch = padded_batch([(p % 6 + 1, p % 5 + 1) for p in range(12)])
    single, count = shard_mini_batches(batch, 1, 4)
    double, _ = shard_mini_batches(batch, 2, 4)
    assert count == 3
    for m in range(count):
        rows = {tuple(r.tolist()) for r in single[0]["input_ids"][single[0][MINI_BATCH_KEY] == m]}
        split = [s["input_ids"][s[MINI_BATCH_KEY] == m] for s in double]
        assert all(len(s) == 2 for s in split)
        assert {tuple(r.tolist()) for s in split for r in s} == rows


def test_gather_rows_restores_batch_order():
    batch = padded_batch([(6, 5), (1, 1), (3, 2), (2, 4), (5, 5)])
    shards, rows = shard_rows(batch, 2)
    restored = gather_rows([s["input_ids"] for s in shards], rows, 5)
    assert torch.equal(restored, batch["input_ids"])


def test_micro_batch_plan_keeps_budget_and_matches_requested_count():
    rng = random.Random(1)
    for _ in range(200):
        lengths = [rng.randint(1, 50) for _ in range(rng.randint(1, 30))]
        need = count_micro_batches(lengths, 60)
        for count in range(need, len(lengths) + 1):
            plan = plan_micro_batches(lengths, 60, count)
            assert len(plan) == count
            assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
            assert all(sum(lengths[i] for i in b) <= 60 for b in plan)


def test_packing_drops_padding_and_maps_outputs_to_response_columns():
    batch = padded_batch([(2, 3), (6, 1), (1, 5)])
    packed = pack_rows(batch["input_ids"], batch["attention_mask"], 5)
    assert packed.input_ids.shape == (1, int(batch["attention_mask"].sum()))
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5]]
    assert packed.cu_seq_lens.tolist() == [0, 5, 12, 18]
    assert packed.attention_kwargs()["max_length_q"] == 7
    # Output k predicts the next packed token, which is the target response token.
    assert torch.equal(packed.input_ids[0, packed.output_index + 1], packed.target_ids)
    scattered = packed.scatter(packed.target_ids.float())
    expected = (batch["input_ids"][:, 6:] * batch["response_mask"]).float()
    assert torch.equal(scattered, expected)


def test_validate_batch_names_the_problem():
    batch = padded_batch([(2, 3), (6, 1)])
    validate_batch(batch)
    with pytest.raises(ValueError, match=r"lacks \[.response_mask.\]"):
        validate_batch({k: v for k, v in batch.items() if k != "response_mask"})
    bad = dict(batch, response_mask=torch.ones_like(batch["response_mask"]))
    with pytest.raises(ValueError, match="padding"):
        validate_batch(bad)


def test_lr_schedule_warms_up_then_decays_to_min_ratio():
    cfg = OptimConfig(warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg, total_steps=6) for s in range(7)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert factors[4] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert factors[6] == pytest.approx(0.1)
    assert lr_factor(100, OptimConfig(), total_steps=None) == 1.0
