"""``Trainer.setup`` starts the rollout servers and the FSDP ranks at once, and a failure
of either side leaves no training rank running. Ray, Serve and the ranks are faked: what
is tested is the order of ``setup`` itself."""

from __future__ import annotations

import json
import threading
import time

import pytest

from agentrl.config import load_config
from agentrl.server.launch import DeploymentError
from agentrl.trainer import trainer as trainer_module
from agentrl.trainer.group import WorkerGroupError


@pytest.fixture
def cfg(tiny_checkpoint, tmp_path):
    train = tmp_path / "train.jsonl"
    row = {"prompt": [{"role": "user", "content": "hi"}], "data_source": "toy"}
    train.write_text("\n".join(json.dumps(row) for _ in range(4)) + "\n")
    return load_config(
        None,
        [
            f"model.path={tiny_checkpoint}",
            f"data.train_files=[{train}]",
            "data.train_batch_size=2",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )


@pytest.fixture
def events(monkeypatch):
    log: list[object] = []
    monkeypatch.setattr(trainer_module, "init_ray", lambda ray_cfg: None)
    return log


def test_servers_start_beside_the_ranks_and_a_server_failure_stops_the_ranks(
    cfg, events, monkeypatch
):
    ranks_up = threading.Event()

    class FakeActorGroup:
        def __init__(self, *args, **kwargs) -> None:
            events.append("ranks up")
            ranks_up.set()

        def shutdown(self) -> None:
            events.append("ranks down")

    def servers_that_fail(*args, **kwargs):
        # Started before the ranks: sees them come up only if both start at once.
        events.append(("servers saw the ranks start", ranks_up.wait(timeout=30)))
        raise DeploymentError("rollout", "engine failed", "")

    monkeypatch.setattr(trainer_module, "ActorGroup", FakeActorGroup)
    monkeypatch.setattr(trainer_module, "start_rollout_servers", servers_that_fail)
    with pytest.raises(DeploymentError, match="engine failed"):
        trainer_module.Trainer(cfg).setup()
    assert events == ["ranks up", ("servers saw the ranks start", True), "ranks down"]


def test_a_rank_failure_is_raised_once_the_servers_have_started(cfg, events, monkeypatch):
    class FailingActorGroup:
        def __init__(self, *args, **kwargs) -> None:
            raise WorkerGroupError("ActorWorker: a rank failed, group stopped")

    def slow_servers(*args, **kwargs):
        time.sleep(0.3)
        events.append("servers up")
        return object()

    monkeypatch.setattr(trainer_module, "ActorGroup", FailingActorGroup)
    monkeypatch.setattr(trainer_module, "start_rollout_servers", slow_servers)
    with pytest.raises(WorkerGroupError, match="a rank failed"):
        trainer_module.Trainer(cfg).setup()
    # Not abandoned half-started: the servers' start ran to its end first.
    assert events == ["servers up"]
