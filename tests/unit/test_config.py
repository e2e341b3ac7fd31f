"""Config loading, dotted overrides and validation."""

from __future__ import annotations

import pytest

from agentrl.algos.config import BUILTIN_ADV_ESTIMATORS, BUILTIN_POLICY_LOSSES
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


def test_unknown_key_is_rejected_with_its_name_and_the_closest_key():
    with pytest.raises(
        ConfigError,
        match=r"server\.num_replica \(override server\.num_replica=2\): unknown key; "
        r"did you mean server\.num_replicas\?",
    ):
        load_config(None, ["server.num_replica=2"])


def test_invalid_value_is_rejected():
    with pytest.raises(
        ConfigError, match=r"server\.num_replicas .*greater than or equal to 1, got 0"
    ):
        load_config(None, ["server.num_replicas=0"])


def _error(tmp_path, text: str, overrides: list[str] | None = None) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path, overrides)
    return str(error.value)


def test_a_config_error_is_one_block_naming_the_file_each_key_and_its_line(tmp_path):
    message = _error(
        tmp_path,
        "model:\n  path: /m\nrollout:\n  agent_nmae: x\n  n: two\nserver:\n  engine:\n"
        "    backend: vlm\n",
    )
    assert message.splitlines() == [
        f"invalid config file {tmp_path / 'run.yaml'} (3 errors):",
        "  rollout.agent_nmae (line 4): unknown key; did you mean rollout.agent_name?",
        "  rollout.n (line 5): expected int, got 'two'",
        "  server.engine.backend (line 8): 'vlm' is not allowed; did you mean vllm? one of: "
        "vllm, hf, null, sim",
    ]
    assert "pydantic" not in message and "http" not in message


def test_a_key_in_the_wrong_section_names_where_it_belongs(tmp_path):
    message = _error(tmp_path, "rollout:\n  num_replicas: 2\n")
    assert "rollout.num_replicas (line 2): unknown key; did you mean server.num_replicas?" in (
        message
    )


def test_a_wrong_type_names_the_expected_type_and_the_override_that_set_it(tmp_path):
    message = _error(tmp_path, "ray:\n  num_cpus: 2\n", ["ray.num_cpus=1.5"])
    assert "ray.num_cpus (override ray.num_cpus=1.5): expected int | None, got 1.5" in message
    assert "with overrides" in message.splitlines()[0]


def test_a_section_given_a_value_says_so(tmp_path):
    message = _error(tmp_path, "trainer: 3\n")
    assert "trainer (line 1): is a section: expected a mapping of its keys, got 3" in message


def test_invalid_yaml_is_a_config_error_naming_the_file(tmp_path):
    message = _error(tmp_path, "rollout:\n  n: [1, 2\n")
    assert message.startswith(f"config file {tmp_path / 'run.yaml'} is not valid YAML")


def test_a_missing_file_names_a_close_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"config file rnu\.yaml not found .*did you mean run"):
        load_config("rnu.yaml")
    with pytest.raises(ConfigError, match=r"an override needs `=`: rollout\.n=VALUE"):
        load_config("rollout.n")


@pytest.mark.parametrize("item", ["server.num_replicas", "=3"])
def test_malformed_override_is_a_config_error(item):
    with pytest.raises(ConfigError):
        load_config(None, [item])


def test_an_override_without_equals_says_how_to_write_it():
    with pytest.raises(ConfigError, match=r"has no `=`: write rollout\.n=VALUE"):
        load_config(None, ["rollout.n"])
    with pytest.raises(ConfigError, match=r"did you mean rollout\.agent_name\?"):
        load_config(None, ["rollout.agent_nmae"])


def test_the_builtin_algorithm_names_are_the_registered_ones():
    """The config names them without torch; the registries are the truth."""
    from agentrl.algos.advantages import registered_adv_estimators
    from agentrl.algos.policy_losses import registered_policy_losses

    assert sorted(BUILTIN_ADV_ESTIMATORS) == registered_adv_estimators()
    assert sorted(BUILTIN_POLICY_LOSSES) == registered_policy_losses()


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
        build_parser().parse_args(["serve", "--help", "all"])
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
