"""A run names the input files it lacks, and refuses an algorithm the trainer cannot run,
before anything starts (``agentrl.preflight``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from agentrl.algos.advantages import register_adv_estimator
from agentrl.cli import main
from agentrl.config import load_config
from agentrl.preflight import (
    TRAINER_LACKS,
    MissingInputs,
    UnknownAgentLoop,
    UnsupportedAlgorithm,
    agent_loop_rows,
    check_agent_loops,
    check_algorithm,
    check_inputs,
    missing_inputs,
)
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


def test_a_missing_file_names_the_closest_file_next_to_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(MissingInputs, match=r"data trian\.jsonl \(did you mean train\.jsonl\?\)"):
        check_inputs(load_config(), ["trian.jsonl"])


def _rows(path, *agent_names):
    prompt = [{"role": "user", "content": "hi"}]
    rows = [{"prompt": prompt, **({"agent_name": n} if n else {})} for n in agent_names]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_the_rows_agent_loops_are_counted_with_their_first_row(tmp_path):
    data = _rows(tmp_path / "d.jsonl", "tool_agent", None, "tool_agent", None, None)
    assert agent_loop_rows(load_config(), [data, "hf:org/set@train"]) == {
        "tool_agent": (f"{data} line 1", 2),
        "single_turn": (f"rollout.agent_name, the loop of {data} line 2", 3),
    }


def test_a_row_naming_an_unknown_agent_loop_is_refused_naming_the_row(tmp_path):
    data = _rows(tmp_path / "d.jsonl", None, "singel_turn", "singel_turn", "singel_turn")
    with pytest.raises(UnknownAgentLoop) as error:
        check_agent_loops(load_config(), [data])
    message = str(error.value)
    assert f"{data} line 2 (and 2 more rows): unknown agent_name 'singel_turn'" in message
    assert "did you mean single_turn?" in message and "registered: " in message
    with pytest.raises(UnknownAgentLoop, match=r"rollout\.agent_name, the loop of .*line 1"):
        check_agent_loops(load_config(None, ["rollout.agent_name=nope"]), [data])


def test_registered_and_importable_agent_loops_pass(tmp_path):
    data = _rows(tmp_path / "d.jsonl", "tool_agent", "agentrl.testing.loops:FixedLengthLoop")
    check_agent_loops(load_config(), [data])
    bad = _rows(tmp_path / "b.jsonl", "agentrl.testing.loops:NoSuchLoop")
    with pytest.raises(UnknownAgentLoop, match=r"b\.jsonl line 1: cannot import agent loop"):
        check_agent_loops(load_config(), [bad])


def test_a_custom_dataset_reads_its_sources_its_own_way(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["data.custom_cls_path=my_data.py", "data.custom_cls_name=Rows"])
    assert missing_inputs(cfg, ["table-name"]) == []
    assert agent_loop_rows(cfg, ["table-name"]) == {}


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


def test_gae_names_a_missing_critic_checkpoint_and_other_estimators_ignore_it(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    critic = "workers.critic.model_path=./critic"
    gae = load_config(None, ["algorithm.adv_estimator=gae", critic])
    assert missing_inputs(gae, []) == ["workers.critic.model_path ./critic"]
    assert missing_inputs(load_config(None, ["algorithm.adv_estimator=grpo", critic]), []) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.adv_estimator=grpo_typo", r"unknown advantage estimator 'grpo_typo'"),
        ("algorithm.policy_loss.loss_mode=ppo", r"unknown policy loss 'ppo'"),
        ("algorithm.adv_estimator=remax", r"remax cannot run in the trainer: .*reward_baselines"),
    ],
)
def test_an_algorithm_the_trainer_cannot_run_is_refused(override, message):
    with pytest.raises(UnsupportedAlgorithm, match=message):
        check_algorithm(load_config(None, [override]))


def test_every_estimator_registered_by_agentrl_runs_in_the_trainer_but_those_it_lacks():
    for name in ["grpo", "rloo", "gae", "dr_grpo", "opo", "reinforce_plus_plus"]:
        check_algorithm(load_config(None, [f"algorithm.adv_estimator={name}"]))
    assert set(TRAINER_LACKS) == {"remax"}


def test_an_unknown_algorithm_is_refused_without_loading_torch():
    """No plugin imported the registries, so the built-in names are all there are."""
    script = (
        "import sys\n"
        "from agentrl.config import load_config\n"
        "from agentrl.preflight import UnsupportedAlgorithm, check_algorithm\n"
        "try:\n"
        "    check_algorithm(load_config(None, ['algorithm.adv_estimator=grop']))\n"
        "except UnsupportedAlgorithm as exc:\n"
        "    print(exc)\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    message, torch_loaded = done.stdout.strip().splitlines()
    assert "algorithm.adv_estimator: unknown advantage estimator 'grop'; did you mean grpo?" in (
        message
    )
    assert torch_loaded == "False"


def test_an_estimator_a_plugin_registers_passes(monkeypatch):
    from agentrl.algos import advantages

    # A copy of the registry, restored after the test.
    monkeypatch.setattr(advantages, "_REGISTRY", dict(advantages._REGISTRY))
    register_adv_estimator("mine")(lambda inputs, cfg: None)
    check_algorithm(load_config(None, ["algorithm.adv_estimator=mine"]))


def test_train_with_remax_stops_before_anything_starts(tiny_checkpoint, tmp_path, caplog):
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": [{"role": "user", "content": "hi"}]}\n')
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.ERROR, logger="agentrl"):
        code = main(
            [
                "train",
                f"model.path={tiny_checkpoint}",
                f"data.train_files=[{train}]",
                f"trainer.run_dir={run_dir}",
                "algorithm.adv_estimator=remax",
            ]
        )
    assert code == 2
    assert "remax cannot run in the trainer" in caplog.text
    assert not run_dir.exists()  # nor Ray, servers or ranks: setup checks first
