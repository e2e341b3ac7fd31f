"""``Trainer.setup`` (``RunProcesses.start``) starts the rollout servers and the FSDP
ranks at once, and a failure anywhere in it stops what had started: no training rank,
Serve application or agent-loop worker outlives a failed setup. ``shutdown`` tries every
stop. Ray, Serve, the ranks and the workers are faked: what is tested is the order of
``setup`` and ``shutdown`` themselves."""

from __future__ import annotations

import json
import logging
import threading
import time
from types import SimpleNamespace

import pytest

from agentrl.config import load_config
from agentrl.server.launch import DeploymentError
from agentrl.trainer import ledger as ledger_module
from agentrl.trainer import processes as processes_module
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
    monkeypatch.setattr(processes_module, "init_ray", lambda ray_cfg: None)
    monkeypatch.setattr(
        processes_module, "stop_rollout_servers", lambda server: log.append("servers down")
    )
    monkeypatch.setattr(
        processes_module, "stop_gateway", lambda gateway: log.append("gateway down")
    )
    return log


class Part:
    """A fake started part: its stop is logged, and fails when ``fails``."""

    def __init__(self, events: list[object], name: str, fails: bool = False) -> None:
        self.events, self.name, self.fails = events, name, fails

    def stop(self) -> None:
        self.events.append(f"{self.name} down")
        if self.fails:
            raise RuntimeError(f"{self.name} would not stop")

    close = shutdown = stop


@pytest.fixture
def fake_parts(events, monkeypatch):
    """Every part ``setup`` starts, faked; ``failing`` names parts whose stop fails."""
    failing: set[str] = set()

    def part(name: str):
        def start(*args, **kwargs) -> Part:
            events.append(f"{name} up")
            return Part(events, name, fails=name in failing)

        return start

    monkeypatch.setattr(processes_module, "ActorGroup", part("ranks"))
    monkeypatch.setattr(
        processes_module,
        "start_rollout_servers",
        lambda *args: events.append("servers up") or SimpleNamespace(control=None),
    )
    monkeypatch.setattr(processes_module, "start_gateway", part("gateway"))
    monkeypatch.setattr(processes_module, "AgentLoopManager", part("agent loops"))
    monkeypatch.setattr(
        processes_module, "RewardManager", SimpleNamespace(from_config=part("rewards"))
    )
    monkeypatch.setattr(processes_module, "make_weight_sync", lambda *args: object())
    monkeypatch.setattr(
        processes_module, "MetricsLogger", SimpleNamespace(from_config=part("tracker"))
    )
    monkeypatch.setattr(ledger_module, "RowAudit", part("audit"))
    return failing


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

    monkeypatch.setattr(processes_module, "ActorGroup", FakeActorGroup)
    monkeypatch.setattr(processes_module, "start_rollout_servers", servers_that_fail)
    with pytest.raises(DeploymentError, match="engine failed"):
        trainer_module.Trainer(cfg).setup()
    # The rollout application is deleted too: a deployment that failed half-way may
    # have left replicas holding their devices.
    assert events == [
        "ranks up",
        ("servers saw the ranks start", True),
        "ranks down",
        "servers down",
    ]


def test_a_rank_failure_is_raised_once_the_servers_have_started(cfg, events, monkeypatch):
    class FailingActorGroup:
        def __init__(self, *args, **kwargs) -> None:
            raise WorkerGroupError("ActorWorker: a rank failed, group stopped")

    def slow_servers(*args, **kwargs):
        time.sleep(0.3)
        events.append("servers up")
        return object()

    monkeypatch.setattr(processes_module, "ActorGroup", FailingActorGroup)
    monkeypatch.setattr(processes_module, "start_rollout_servers", slow_servers)
    with pytest.raises(WorkerGroupError, match="a rank failed"):
        trainer_module.Trainer(cfg).setup()
    # Not abandoned half-started: the servers' start ran to its end first, then stopped.
    assert events == ["servers up", "servers down"]


def test_a_late_failure_stops_everything_started_in_reverse_dependency_order(
    cfg, events, fake_parts, monkeypatch
):
    cfg.gateway.enabled = True

    def tracker_that_fails(*args, **kwargs):
        raise OSError("run directory is read-only")

    monkeypatch.setattr(
        processes_module, "MetricsLogger", SimpleNamespace(from_config=tracker_that_fails)
    )
    trainer = trainer_module.Trainer(cfg)
    with pytest.raises(OSError, match="read-only"):
        trainer.setup()
    started = ["ranks up", "servers up", "gateway up", "agent loops up", "rewards up"]
    assert sorted(events[:3]) == sorted(started[:3])  # servers and ranks start at once
    assert events[3:] == [
        *started[3:],
        "rewards down",
        "agent loops down",
        "ranks down",
        "gateway down",
        "servers down",
    ]
    events.clear()
    trainer.shutdown()  # a second stop (a caller's finally) finds nothing left to stop
    assert events == []


def test_a_stop_that_fails_is_logged_and_the_setup_error_raised(
    cfg, events, fake_parts, monkeypatch, caplog
):
    fake_parts.add("agent loops")

    def rewards_that_fail(*args, **kwargs):
        raise ValueError("reward.reward_fn_path: no compute_score")

    monkeypatch.setattr(
        processes_module, "RewardManager", SimpleNamespace(from_config=rewards_that_fail)
    )
    with caplog.at_level(logging.ERROR), pytest.raises(ValueError, match="no compute_score"):
        trainer_module.Trainer(cfg).setup()
    assert events[-3:] == ["agent loops down", "ranks down", "servers down"]
    assert "agent loops would not stop" in caplog.text


def test_shutdown_tries_every_stop_and_raises_the_first_failure(cfg, events, fake_parts, caplog):
    fake_parts.update({"tracker", "ranks"})
    trainer = trainer_module.Trainer(cfg)
    trainer.setup()
    events.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="tracker would"):
        trainer.shutdown()
    assert events == [
        "audit down",
        "tracker down",
        "rewards down",
        "agent loops down",
        "ranks down",
        "servers down",
    ]
    assert "ranks would not stop" in caplog.text
