"""use_local_defaults: fills the local-machine environment without overriding the user."""

from __future__ import annotations

import os
from pathlib import Path

from agentrl.local_env import use_local_defaults

NAMES = [
    "AGENTRL_CACHE",
    "VLLM_CACHE_ROOT",
    "VLLM_CPU_OMP_THREADS_BIND",
    "HF_HUB_OFFLINE",
    "TOKENIZERS_PARALLELISM",
]


def test_unset_variables_get_the_local_defaults(monkeypatch, tmp_path):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    assert use_local_defaults(tmp_path) == tmp_path
    assert os.environ["AGENTRL_CACHE"] == str(tmp_path)
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm")
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_values_already_set_win_and_the_vllm_cache_follows_agentrl_cache(monkeypatch, tmp_path):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert use_local_defaults(Path("/elsewhere")) == tmp_path / "mine"
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "mine" / "vllm")
    assert os.environ["HF_HUB_OFFLINE"] == "0"
