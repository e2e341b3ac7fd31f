"""A run names the input files it lacks before anything starts (``agentrl.preflight``)."""

from __future__ import annotations

import logging

import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.preflight import MissingInputs, check_inputs, missing_inputs
from tests.unit.test_docs_examples import ROOT


def test_missing_inputs_names_each_missing_file_and_skips_hub_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text("")
    cfg = load_config(
        None,
        [
            "model.path=./ckpt",
            "rollout.tool_config_path=tools.yaml",
            "reward.reward_fn_path=my_reward.py",
        ],
    )
    data = ["train.jsonl", "val.jsonl", "hf:org/set@train"]
    assert missing_inputs(cfg, data) == [
        "data val.jsonl",
        "model.path ./ckpt",
        "rollout.tool_config_path tools.yaml",
        "reward.reward_fn_path my_reward.py",
    ]
    hub = load_config(None, ["model.path=Org/Model", "reward.reward_fn_path=my_pkg.rewards"])
    assert missing_inputs(hub, ["train.jsonl"]) == []
    with pytest.raises(MissingInputs, match=r"data val\.jsonl"):
        check_inputs(cfg, data)


def test_a_custom_dataset_reads_its_sources_its_own_way(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["data.custom_cls_path=my_data.py", "data.custom_cls_name=Rows"])
    assert missing_inputs(cfg, ["table-name"]) == []


@pytest.mark.parametrize("command", [["train"], ["rollout", "--split", "val"]])
def test_the_cpu_recipe_without_its_prepared_files_says_what_to_run(
    command, tmp_path, monkeypatch, caplog
):
    """A fresh clone: .cache/retool is made by run_cpu.sh; nothing starts without it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    with caplog.at_level(logging.ERROR, logger="agentrl"):
        code = main([command[0], "recipes/retool/cpu.yaml", *command[1:]])
    assert code == 2
    assert "model.path .cache/retool/warm-start" in caplog.text
    assert "data .cache/retool/val.jsonl" in caplog.text
    assert "the comments at the top of recipes/retool/cpu.yaml" in caplog.text
    assert "run_cpu.sh" in (ROOT / "recipes/retool/cpu.yaml").read_text().split("model:")[0]
    assert not (tmp_path / "runs").exists()
