"""Environment sources and the checks on what environments return."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from agentrl.envs import (
    EnvError,
    StepResult,
    UnknownEnvError,
    available_envs,
    env_factory,
    register_env,
    registry,
)
from agentrl.envs.base import check_step


def test_importing_agentrl_envs_loads_no_environment_package():
    code = textwrap.dedent(
        """
        import sys
        import agentrl.envs
        from agentrl.agent_loops.registry import get_agent_loop
        get_agent_loop("env")
        loaded = [m for m in ("gymnasium", "textarena", "reasoning_gym") if m in sys.modules]
        assert not loaded, loaded
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_user_factory_is_named_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_envs.py").write_text(
        textwrap.dedent(
            """
            class Echo:
                def __init__(self, greeting="hi"):
                    self.greeting = greeting

                async def reset(self, row=None, seed=None):
                    return [{"role": "user", "content": self.greeting}], {}

                async def step(self, message):
                    return [], 1.0, True, False, {}

            NOT_A_FACTORY = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = env_factory("my_envs:Echo")(greeting="hello")
    assert env.greeting == "hello"
    with pytest.raises(UnknownEnvError, match="is a int, not a callable"):
        env_factory("my_envs:NOT_A_FACTORY")
    with pytest.raises(UnknownEnvError, match="has no attribute 'Missing'"):
        env_factory("my_envs:Missing")


def test_an_unknown_module_says_it_is_no_adapter_either():
    with pytest.raises(UnknownEnvError) as raised:
        env_factory("verifiers_like_thing:load_environment")
    message = str(raised.value)
    assert "does not import" in message
    assert "'verifiers_like_thing' is no adapter (reasoning_gym, gymnasium, textarena, " in message


def test_an_unknown_registered_name_lists_the_registered_ones():
    register_env("test_listed")(lambda: None)
    with pytest.raises(
        UnknownEnvError, match=r"unknown env 'test_lsted'; registered: \[.*'test_listed'"
    ):
        env_factory("test_lsted")
    assert "test_listed" in available_envs() and "gymnasium:" in available_envs()


def test_a_small_registry_lists_every_id(monkeypatch):
    monkeypatch.setattr(registry, "LIST_ALL_UP_TO", 1000)
    with pytest.raises(UnknownEnvError) as raised:
        env_factory("gymnasium:NoSuchEnv-v0")
    assert "available: Acrobot-v1, " in str(raised.value) and "Taxi-v4" in str(raised.value)


def test_available_envs_lists_an_adapters_ids():
    ids = available_envs("textarena")
    assert "textarena:TicTacToe-v0" in ids and len(ids) > 100
    with pytest.raises(UnknownEnvError, match="unknown env adapter 'skyrl'"):
        available_envs("skyrl")


def test_an_adapter_whose_package_is_missing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(
        registry.ADAPTERS, "fakepkg", ("agentrl.envs.no_such_adapter", "fakepkg==1.0")
    )
    with pytest.raises(
        EnvError,
        match=r"fakepkg: environments need fakepkg .*pip install 'agentrl\[envs\]' "
        r"\(or fakepkg==1.0\)",
    ):
        env_factory("fakepkg:Thing-v0")


def test_names_register_once_and_never_with_a_colon():
    def factory():
        return None

    register_env("test_once")(factory)
    register_env("test_once")(factory)  # the same factory again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_env("test_once")(lambda: None)
    with pytest.raises(ValueError, match="may not contain ':'"):
        register_env("a:b")


def test_a_gymnasium_style_tuple_with_numpy_values_is_a_step():
    result = check_step(("Next.", np.float32(0.5), np.bool_(True), False, None))
    assert result == StepResult([{"role": "user", "content": "Next."}], 0.5, True, False, {})
    assert type(result.reward) is float and type(result.terminated) is bool


def test_an_array_flag_is_malformed_not_ambiguous():
    with pytest.raises(EnvError, match=r"terminated=array\(\[ True, False\]\); expected a bool"):
        check_step(([], 1.0, np.array([True, False]), False, {}))


def test_info_must_be_a_dict():
    with pytest.raises(EnvError, match="returned info of type list"):
        check_step(([], 1.0, True, False, ["x"]))
