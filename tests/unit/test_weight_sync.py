"""Bucketing of weights for the object-store sync."""

from __future__ import annotations

import torch

from agentrl.server.weight_transport.base import bucketize, module_group


def _names(buckets):
    return [[name for name, _ in bucket] for bucket in buckets]


def test_buckets_respect_the_size_bound_and_keep_order():
    tensors = [(f"head{i}.weight", torch.zeros(10)) for i in range(10)]  # 40 B each
    buckets = list(bucketize(tensors, bucket_bytes=100))
    assert [len(b) for b in buckets] == [2, 2, 2, 2, 2]
    assert [n for b in _names(buckets) for n in b] == [f"head{i}.weight" for i in range(10)]


def test_a_decoder_layer_is_never_split_across_buckets():
    layer = [
        (f"model.layers.0.self_attn.{p}_proj.weight", torch.zeros(10)) for p in ("q", "k", "v")
    ]
    rest = [("model.norm.weight", torch.zeros(10))]
    buckets = _names(bucketize([*layer, *rest], bucket_bytes=50))
    assert buckets == [[n for n, _ in layer], ["model.norm.weight"]]


def test_module_groups():
    assert module_group("model.layers.12.mlp.up_proj.weight") == "model.layers.12"
    assert module_group("model.embed_tokens.weight") == "model.embed_tokens"
    assert module_group("lm_head.weight") == "lm_head"


def test_empty_input_gives_no_bucket():
    assert list(bucketize([], 64)) == []
