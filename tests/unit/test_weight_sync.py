"""Bucketing of weights for the object-store sync."""

from __future__ import annotations

import torch

from agentrl.weight_sync import bucketize


def test_buckets_respect_the_size_bound_and_keep_order():
    tensors = [(f"w{i}", torch.zeros(10, dtype=torch.float32)) for i in range(10)]  # 40 B each
    buckets = list(bucketize(tensors, bucket_bytes=100))
    assert [len(b) for b in buckets] == [2, 2, 2, 2, 2]
    assert [name for b in buckets for name, _ in b] == [f"w{i}" for i in range(10)]


def test_a_tensor_larger_than_the_bound_travels_alone():
    tensors = [("small", torch.zeros(2)), ("big", torch.zeros(100)), ("tail", torch.zeros(2))]
    assert [[n for n, _ in b] for b in bucketize(tensors, 64)] == [["small"], ["big"], ["tail"]]


def test_empty_input_gives_no_bucket():
    assert list(bucketize([], 64)) == []
