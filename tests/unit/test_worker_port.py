"""worker_port: the integration modules' fixed ports, apart per pytest-xdist worker."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_no_two_integration_modules_bind_the_same_fixed_port():
    """scripts/test.sh runs two integration modules at once: a fixed port written in two
    modules would collide (a shared one goes through ``worker_port``, as the toy task's)."""
    root = Path(__file__).resolve().parents[2]
    owners: dict[int, list[str]] = {}
    for module in sorted([*root.glob("tests/integration/*.py"), *root.glob("tests/e2e/*.py")]):
        for port in set(map(int, re.findall(r"\b18[5-9]\d\d\b", module.read_text()))):
            owners.setdefault(port, []).append(module.name)
    assert owners, "no fixed ports found: the pattern no longer matches the modules"
    shared = {port: names for port, names in owners.items() if len(names) > 1}
    assert not shared, shared
