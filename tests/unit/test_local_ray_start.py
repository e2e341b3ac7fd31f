"""``init_ray``'s local start: a node that times out starting, or whose GCS never writes
its port, is killed and started again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.core.config import RayConfig
from agentrl.server import launch

TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the "
    "raylet failed to startup or the GCS has become overloaded."
)


class FakeRayInit:
    """``ray.init`` whose first ``failures`` calls start a child process (the failed
    node's leftover GCS) and raise ``error``; later calls succeed."""

    def __init__(self, failures: int, error: Exception = TIMEOUT) -> None:
        self.failures = failures
        self.error = error
        self.calls: list[dict] = []
        self.leftovers: list[subprocess.Popen] = []

    def __call__(self, **kwargs) -> None:
        self.calls.append(kwargs)
        if len(self.calls) <= self.failures:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            self.leftovers.append(child)
            raise self.error


@pytest.fixture
def fake_init(monkeypatch):
    installed: list[FakeRayInit] = []

    def install(failures: int, error: Exception = TIMEOUT) -> FakeRayInit:
        fake = FakeRayInit(failures, error)
        monkeypatch.setattr(launch.ray, "init", fake)
        monkeypatch.setattr(launch.ray, "is_initialized", lambda: False)
        installed.append(fake)
        return fake

    yield install
    for fake in installed:  # whatever init_ray did not kill
        for process in fake.leftovers:
            process.kill()
            process.wait()


def _alive(process: subprocess.Popen) -> bool:
    return process.poll() is None


def test_a_node_that_times_out_is_killed_and_started_again(fake_init, caplog):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        fake = fake_init(failures=1)
        launch.init_ray(RayConfig(num_cpus=2))
        assert len(fake.calls) == 2
        assert fake.calls[0] == fake.calls[1]
        assert fake.calls[0]["address"] == "local" and fake.calls[0]["num_cpus"] == 2
        assert not _alive(fake.leftovers[0])
        assert _alive(bystander)  # started before: not the failed node's
        assert "attempt 2 of 3" in caplog.text
    finally:
        bystander.kill()
        bystander.wait()


def _gcs_port_wait_error(tmp_path) -> Exception:
    """The error the installed Ray raises when a GCS never writes its port file."""
    from ray._raylet import wait_for_persisted_port

    try:
        wait_for_persisted_port(str(tmp_path), "ab" * 28, "gcs_server_port", timeout_ms=50)
    except Exception as exc:  # Ray raises RuntimeError; whatever it is, init_ray sees it
        return exc
    raise AssertionError("wait_for_persisted_port returned without a port file")


def test_a_gcs_that_never_writes_its_port_is_killed_and_started_again(fake_init, tmp_path):
    never_started = _gcs_port_wait_error(tmp_path)
    fake = fake_init(failures=2, error=never_started)
    launch.init_ray(RayConfig(num_cpus=2))
    assert len(fake.calls) == 3
    assert not any(_alive(process) for process in fake.leftovers)


def test_the_last_attempt_raises_the_timeout(fake_init):
    fake = fake_init(failures=launch.LOCAL_START_ATTEMPTS)
    with pytest.raises(Exception, match="timed out during startup"):
        launch.init_ray(RayConfig(num_cpus=2))
    assert len(fake.calls) == launch.LOCAL_START_ATTEMPTS
    for process in fake.leftovers[:-1]:
        assert not _alive(process)


def test_other_start_errors_are_not_retried(fake_init):
    fake = fake_init(failures=1, error=ValueError("bad num_cpus"))
    with pytest.raises(ValueError, match="bad num_cpus"):
        launch.init_ray(RayConfig(num_cpus=2))
    assert len(fake.calls) == 1


def test_connecting_to_a_cluster_is_not_retried(fake_init):
    fake = fake_init(failures=1)
    with pytest.raises(Exception, match="timed out during startup"):
        launch.init_ray(RayConfig(address="10.0.0.1:6379"))
    assert len(fake.calls) == 1
    assert fake.calls[0]["num_cpus"] is None
