"""Which Ray cluster ``agentrl train/serve/eval`` joins: --address, ray.address, $RAY_ADDRESS."""

from __future__ import annotations

import pytest

from agentrl.cli import _compose, build_parser

EXTRA = {"eval": ["--checkpoint", "ckpt"]}


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("trainer: {total_steps: 1}\n")
    return str(path)


def _config(command: str, config_file: str, *args: str):
    return _compose(
        build_parser().parse_args([command, config_file, *args, *EXTRA.get(command, [])])
    )


@pytest.mark.parametrize("command", ["train", "serve", "eval"])
def test_address_flag_wins_over_config_and_environment(command, config_file, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    cfg = _config(command, config_file, "ray.address=10.0.0.2:6379", "--address", "10.0.0.1:6379")
    assert cfg.ray.address == "10.0.0.1:6379"


def test_ray_address_env_is_used_when_neither_flag_nor_config_names_a_cluster(
    config_file, monkeypatch
):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert _config("train", config_file).ray.address == "10.0.0.9:6379"
    assert _config("train", config_file, "ray.address=auto").ray.address == "auto"


def test_without_flag_config_or_env_ray_starts_locally(config_file, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _config("train", config_file).ray.address is None
