"""worker_port: the integration modules' fixed ports, apart per pytest-xdist worker."""

from __future__ import annotations

from agentrl.testing.serving import worker_port


def test_outside_xdist_and_on_its_first_worker_the_port_is_unchanged(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert worker_port(18768) == 18768
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert worker_port(18768) == 18768


def test_each_later_worker_gets_its_own_block_of_ports(monkeypatch):
    ports = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ports[worker] = [worker_port(p) for p in (18765, 18797)]
    assert ports == {"gw0": [18765, 18797], "gw1": [18865, 18897], "gw2": [18965, 18997]}
