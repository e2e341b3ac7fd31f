"""Config loading, dotted overrides and validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.cli import build_parser
from agentrl.config import AgentRLConfig, ConfigError, describe_config, load_config


def test_defaults_load_without_a_file():
    cfg = load_config()
    assert cfg.server.num_replicas == 2
    assert cfg.server.router.policy == "affinity"


def test_yaml_then_dotted_overrides_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  num_replicas: 4\n  engine:\n    max_model_len: 512\n")
    cfg = load_config(path, ["server.num_replicas=3", "server.router.max_sessions=500"])
    assert cfg.server.num_replicas == 3
    assert cfg.server.engine.max_model_len == 512
    assert cfg.server.router.max_sessions == 500


def test_override_values_are_parsed_as_yaml():
    cfg = load_config(None, ["server.engine.kv_cache_memory_bytes=null", "ray.num_cpus=2"])
    assert cfg.server.engine.kv_cache_memory_bytes is None
    assert cfg.ray.num_cpus == 2


def test_unknown_key_is_rejected_with_its_name():
    with pytest.raises(ValidationError, match="num_replica"):
        load_config(None, ["server.num_replica=2"])


def test_invalid_value_is_rejected():
    with pytest.raises(ValidationError, match="num_replicas"):
        load_config(None, ["server.num_replicas=0"])


@pytest.mark.parametrize("item", ["server.num_replicas", "=3"])
def test_malformed_override_is_a_config_error(item):
    with pytest.raises(ConfigError):
        load_config(None, [item])


def test_override_cannot_descend_into_a_value(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  num_replicas: 2\n")
    with pytest.raises(ConfigError, match="num_replicas"):
        load_config(path, ["server.num_replicas.x=1"])


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


def test_every_field_has_a_description():
    lines = describe_config(AgentRLConfig)
    assert len(lines) > 20
    assert all(not line.endswith(": None") for line in lines), [
        line for line in lines if line.endswith(": None")
    ]


def test_shipped_configs_validate():
    from pathlib import Path

    root = Path(__file__).parents[2]
    paths = sorted([*root.glob("configs/*.yaml"), *root.glob("recipes/*/*.yaml")])
    configs = [p for p in paths if p.name != "tools.yaml"]
    assert len(configs) >= 4
    for path in configs:
        load_config(path)


def test_cli_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    assert "server.router.max_sessions" in out
    assert "server.engine.backend" in out


def test_the_gateway_takes_the_rollout_tool_prompt_settings_unless_given_its_own():
    cfg = load_config(
        None, ["rollout.tools_in_system_prompt=true", "rollout.tools_prompt_template=T {tools}"]
    )
    assert (cfg.gateway.tools_in_system_prompt, cfg.gateway.tools_prompt_template) == (
        True,
        "T {tools}",
    )
    own = load_config(
        None, ["rollout.tools_in_system_prompt=true", "gateway.tools_in_system_prompt=false"]
    )
    assert own.gateway.tools_in_system_prompt is False
