"""Shared fixtures: environment for CPU vLLM / Ray, and the tiny offline checkpoint."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentrl.local_env import use_local_defaults

use_local_defaults(Path(__file__).resolve().parents[1] / ".cache")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# A new local Ray node waits 30 s for its GCS to write its port file; on a loaded 2-core
# CI machine (the previous module's engine processes still exiting) that wait ran out and
# failed a whole module. Ray reads this knob at every local start, subprocesses included.
os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    """A tiny random Qwen2 checkpoint + tokenizer, built once and cached on disk."""
    from agentrl.testing import default_tiny_checkpoint

    return default_tiny_checkpoint()


@pytest.fixture(scope="session")
def load_script():
    """Imports a script of this repository by its path from the root (``bench/`` and
    ``recipes/`` are not packages): its functions are what a unit test checks."""

    def load(relative_path: str) -> ModuleType:
        path = Path(__file__).resolve().parents[1] / relative_path
        spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(autouse=True)
def _forget_plugins_after_each_test():
    """Drop the plugins a test imported from ``$AGENTRL_PLUGINS`` when it ends.

    ``import_plugins`` records them there for the processes this one starts later; left
    set, a later test's Ray workers, Serve replicas and reward pools would try to import
    modules that only existed in that test's temporary folder.
    """
    from agentrl.plugins import PLUGINS_ENV

    before = os.environ.get(PLUGINS_ENV)
    yield
    if before is None:
        os.environ.pop(PLUGINS_ENV, None)
    else:
        os.environ[PLUGINS_ENV] = before


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Exit without interpreter teardown once pytest has reported.

    After a full run, native threads left by in-process vLLM engines, Ray and torch can
    crash CPython's final teardown (SIGSEGV, exit 139) although every test passed; the
    verdict is pytest's, so exit with it directly.
    """
    if _EXIT_STATUS in config.stash:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[_EXIT_STATUS])
