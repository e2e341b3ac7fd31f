"""`plugins:` — user modules imported in the driver, agent-loop workers and reward pools.

The Ray-worker side is in tests/integration/test_rollout_run.py; here: the loader's
rules, its errors, the CLI's error, and a reward process pool that imports them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.agent_loops.registry import get_agent_loop
from agentrl.cli import main
from agentrl.config import load_config
from agentrl.plugins import (
    PLUGINS_ENV,
    PluginError,
    import_plugins,
    import_plugins_from_env,
    plugin_runtime_env,
)
from agentrl.reward.manager import RewardManager, RewardRequest

LOOP_MODULE = """
from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.registry import register_agent_loop


@register_agent_loop("{name}")
class Loop(AgentLoopBase):
    async def run(self, sample, sampling):
        raise NotImplementedError
"""

SCORER_MODULE = """
from agentrl.reward.builtin import register_scorer


@register_scorer("{source}")
def length_score(data_source, solution_str, ground_truth, extra_info):
    import os
    return {{"score": len(solution_str) / 10, "pid": os.getpid()}}
"""


@pytest.fixture(autouse=True)
def no_recorded_plugins(monkeypatch):
    """Each test starts with no plugins recorded; what it records is undone after."""
    monkeypatch.setenv(PLUGINS_ENV, "[]")


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_dotted_module_on_the_path_registers_its_loop_by_name(tmp_path, monkeypatch):
    _write(tmp_path, "plug_dotted_loops.py", LOOP_MODULE.format(name="plug_dotted"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="under `plugins:`"):
        get_agent_loop("plug_dotted")
    assert import_plugins(["plug_dotted_loops"]) == ["plug_dotted_loops"]
    assert get_agent_loop("plug_dotted").__module__ == "plug_dotted_loops"
    assert import_plugins(["plug_dotted_loops"]) == ["plug_dotted_loops"]  # a no-op
    assert json.loads(plugin_runtime_env()["env_vars"][PLUGINS_ENV]) == ["plug_dotted_loops"]


def test_file_outside_the_path_is_imported_by_absolute_path(tmp_path, monkeypatch):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    _write(folder, "loops.py", LOOP_MODULE.format(name="plug_file"))
    monkeypatch.chdir(tmp_path)
    (resolved,) = import_plugins(["elsewhere/loops.py"])
    assert resolved == str((folder / "loops.py").resolve())
    cls = get_agent_loop("plug_file")
    assert cls.__module__.startswith("agentrl_plugin_loops_")
    # Another process (or a second import) given the resolved path finds the same module.
    monkeypatch.chdir(folder)
    assert import_plugins([resolved]) == [resolved]
    assert get_agent_loop("plug_file") is cls
    assert json.loads(__import__("os").environ[PLUGINS_ENV]) == [resolved]


def test_processes_started_later_get_the_latest_config_s_plugins_only(tmp_path, monkeypatch):
    """Two configs in one process (a notebook): the second one's processes import its
    plugins, not the first one's as well."""
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    _write(tmp_path, "plug_first_loops.py", LOOP_MODULE.format(name="plug_first"))
    _write(tmp_path, "plug_second_loops.py", LOOP_MODULE.format(name="plug_second"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import_plugins(["plug_first_loops"])
    assert json.loads(plugin_runtime_env()["env_vars"][PLUGINS_ENV]) == ["plug_first_loops"]
    import_plugins(["plug_second_loops"])
    assert json.loads(plugin_runtime_env()["env_vars"][PLUGINS_ENV]) == ["plug_second_loops"]
    import_plugins([])
    assert plugin_runtime_env() == {} and PLUGINS_ENV not in __import__("os").environ


def test_file_on_the_path_is_the_module_a_later_import_finds(tmp_path, monkeypatch):
    """Listing `my_loops.py` and importing `my_loops` must not register the loop twice."""
    _write(tmp_path, "plug_same_loops.py", LOOP_MODULE.format(name="plug_same"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import_plugins(["plug_same_loops.py"])
    import plug_same_loops  # noqa: F401  (would raise "already registered" if re-executed)

    assert get_agent_loop("plug_same") is sys.modules["plug_same_loops"].Loop


def test_a_plugin_that_fails_names_the_module_and_the_cause(tmp_path, monkeypatch):
    _write(tmp_path, "plug_broken.py", "import not_a_module_anywhere\n")
    _write(tmp_path, "plug_raising.py", "raise RuntimeError('needs API_KEY')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"importing plug_broken failed: ModuleNotFound.*"):
        import_plugins(["plug_broken"])
    with pytest.raises(PluginError, match=r"plug_raising.py failed: RuntimeError: needs API_KEY"):
        import_plugins([str(tmp_path / "plug_raising.py")])
    with pytest.raises(PluginError, match=r"cannot import module 'no_such_pkg.loops'.*PYTHONPATH"):
        import_plugins(["no_such_pkg.loops"])
    with pytest.raises(PluginError, match=r"plugin file .*missing\.py does not exist"):
        import_plugins(["missing.py"])
    assert import_plugins_from_env() == []  # nothing that failed was recorded


def test_a_missing_plugin_file_names_the_closest_file_next_to_it(tmp_path):
    _write(tmp_path, "my_loops.py", "")
    with pytest.raises(PluginError, match=r"my_loop\.py does not exist .*did you mean .*my_loops"):
        import_plugins([str(tmp_path / "my_loop.py")])


def test_cli_reports_a_broken_plugin_before_starting_anything(tmp_path, monkeypatch, caplog):
    config = tmp_path / "run.yaml"
    config.write_text("plugins: [my_pkg_that_is_not_installed.loops]\n")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.ERROR, logger="agentrl"):
        code = main(["train", str(config), "model.path=unused", f"trainer.run_dir={tmp_path}/run"])
    assert code == 2
    assert "cannot import module 'my_pkg_that_is_not_installed.loops'" in caplog.text
    assert f"plugins (config file {config})" in caplog.text
    assert not (tmp_path / "run").exists()


def test_plugins_field_validates_as_a_list_of_names():
    cfg = load_config(None, ["plugins=[my_pkg.loops, tools/extra.py]"])
    assert cfg.plugins == ["my_pkg.loops", "tools/extra.py"]
    assert load_config(None, []).plugins == []


def test_reward_process_pool_imports_the_plugins_of_its_parent(tmp_path, monkeypatch):
    _write(tmp_path, "plug_scorers.py", SCORER_MODULE.format(source="plug_len"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    import_plugins([str(tmp_path / "plug_scorers.py")])
    manager = RewardManager(executor="process", num_workers=1, timeout_s=30)
    try:
        result = asyncio.run(manager.score(RewardRequest("plug_len", "x" * 25, "unused")))
    finally:
        manager.close()
    assert result.error is None
    assert result.score == 2.5  # the plugin's scorer, not the math fallback (0.0)
    assert result.info["pid"] != __import__("os").getpid()


def test_gateway_application_hands_the_driver_plugins_to_its_replica(tmp_path, monkeypatch):
    """The gateway replica imports `$AGENTRL_PLUGINS` at start; its app must carry them."""
    from agentrl.server.gateway.deployment import build_gateway_app

    _write(tmp_path, "plug_parsers.py", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_plugins(["plug_parsers"])
    cfg = load_config(None, ["model.path=unused"])
    app = build_gateway_app(cfg.gateway, cfg.model, cfg.server, namespace="test")
    runtime_env = app._bound_deployment.ray_actor_options["runtime_env"]
    assert json.loads(runtime_env["env_vars"][PLUGINS_ENV]) == ["plug_parsers"]


def test_a_config_is_resolved_the_same_from_python_as_from_the_cli(tmp_path, monkeypatch):
    """`resolve_user_config` (the CLI, rollout(), Trainer and AgentLoopManager start with
    it): the plugins are imported and recorded, builtin: model names become directories,
    and the caller's config is left as it was."""
    from agentrl.config import resolve_user_config

    _write(tmp_path, "plug_resolved.py", LOOP_MODULE.format(name="plug_resolved"))
    cfg = load_config(
        None, ["model.path=builtin:tiny-qwen2", f"plugins=[{tmp_path}/plug_resolved.py]"]
    )
    resolved = resolve_user_config(cfg)
    assert get_agent_loop("plug_resolved").__name__ == "Loop"
    assert resolved.plugins == [str((tmp_path / "plug_resolved.py").resolve())]
    assert json.loads(plugin_runtime_env()["env_vars"][PLUGINS_ENV]) == resolved.plugins
    assert Path(resolved.model.path, "config.json").is_file()
    assert cfg.model.path == "builtin:tiny-qwen2"
    assert resolve_user_config(resolved) == resolved


def test_the_serve_config_gateway_app_carries_the_configs_plugins(tmp_path, monkeypatch):
    """`agentrl.server.apps:gateway_app` (Serve config files, KubeRay): the replica gets
    the plugins the config names, not only those the building process had imported."""
    from agentrl.server.apps import gateway_app

    _write(tmp_path, "plug_app_parsers.py", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = gateway_app({"overrides": ["model.path=unused", "plugins=[plug_app_parsers]"]})
    runtime_env = app._bound_deployment.ray_actor_options["runtime_env"]
    assert json.loads(runtime_env["env_vars"][PLUGINS_ENV]) == ["plug_app_parsers"]
