"""docs/guides/algorithms.md's Python API section runs as written and its numbers are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "algorithms.md"


@pytest.fixture(scope="module")
def namespace() -> dict:
    """The guide's Python blocks, run in order in one namespace."""
    scope: dict = {}
    for index, code in enumerate(
        re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.M | re.S)
    ):
        exec(compile(code, f"algorithms.md[{index}]", "exec"), scope)
    return scope


def test_grpo_example_unbiased_std_and_singleton_raw_score(namespace):
    adv = namespace["advantages"][:, 0]
    std = torch.tensor([1.0, 0.0, 1.0]).std()  # unbiased
    expected = (torch.tensor([1.0, 0.0, 1.0]) - 2 / 3) / (std + 1e-6)
    assert torch.allclose(adv[:3], expected)
    assert adv[:3].tolist() == pytest.approx([0.5773, -1.1547, 0.5773], abs=1e-4)
    assert adv[3].item() == pytest.approx(0.5, rel=1e-5)  # the singleton keeps its score
    assert (namespace["advantages"][namespace["mask"] == 0] == 0).all()


def test_dual_clip_example_caps_the_loss(namespace):
    assert namespace["loss"].item() == pytest.approx(3.0)
    assert namespace["metrics"]["clipfrac_lower"].item() == 1.0


def test_aggregation_example_skips_the_empty_row(namespace):
    assert namespace["token_mean"].item() == pytest.approx(2.5)
    assert namespace["seq_mean"].item() == pytest.approx(3.0)
    assert namespace["seq_sum"].item() == pytest.approx(5.0)


def test_rollout_is_example_metrics_are_before_truncation_and_veto(namespace):
    assert namespace["weights"][0].tolist() == pytest.approx([2.0, 1.0, 0.5])
    assert namespace["is_metrics"]["mismatch/rollout_is_mean"].item() == pytest.approx(6.5 / 3)
    assert namespace["vetoed"].tolist() == [[0.0, 0.0, 0.0]]
