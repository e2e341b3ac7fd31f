"""The ``reward`` section of the configuration tree."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from agentrl.config_help import did_you_mean
from agentrl.core.config import Section
from agentrl.server.config import ServerConfig

__all__ = [
    "JUDGE_PLACEHOLDERS",
    "JUDGE_SERVER",
    "JudgeConfig",
    "RewardConfig",
    "judge_server",
    "rubric_problems",
]

JUDGE_PLACEHOLDERS = {
    "pointwise": ("prompt", "response", "ground_truth", "max_score"),
    "group": ("prompt", "responses", "count", "ground_truth", "max_score"),
}
"""The placeholders a rubric of each judge mode may hold; the second is required."""

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def rubric_problems(rubric: str, mode: Literal["pointwise", "group"]) -> list[str]:
    """What is wrong with ``rubric`` as a template of judge ``mode``: a placeholder it does
    not know (with a did-you-mean), or the response placeholder missing."""
    known = JUDGE_PLACEHOLDERS[mode]
    problems = []
    for name in dict.fromkeys(_PLACEHOLDER.findall(rubric)):
        if name not in known:
            hint = did_you_mean(name, known)
            problems.append(
                f"unknown placeholder {{{name}}}{f'; {hint}' if hint else ''} "
                f"({mode} rubrics know {', '.join(f'{{{k}}}' for k in known)})"
            )
    if f"{{{known[1]}}}" not in rubric:
        problems.append(f"a {mode} rubric must contain {{{known[1]}}}")
    return problems


def merge_server(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a ``server`` section as a dict) with ``changes`` written over it, nested
    mappings merged key by key."""
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_server(merged[key], value)
        else:
            merged[key] = value
    return merged


JUDGE_SERVER = {"name": "judge", "num_replicas": 1}
"""What the judge's replicas change of the policy's ``server`` section, before
``reward.judge.server``."""


def judge_server(policy: ServerConfig, changes: Mapping[str, Any]) -> ServerConfig:
    """The judge's ``server`` section: the policy's, with ``JUDGE_SERVER`` and then
    ``changes`` over it. Raises ``ValueError`` naming each bad key (with a did-you-mean)."""
    tree = merge_server(merge_server(policy.model_dump(), JUDGE_SERVER), changes)
    try:
        server = ServerConfig.model_validate(tree)
    except ValidationError as exc:
        raise ValueError(_server_problems(exc)) from None
    if server.name == policy.name:
        raise ValueError(
            f"reward.judge.server.name={server.name!r} is the policy's application: the "
            "judge needs a Serve application of its own"
        )
    return server


def _server_problems(exc: ValidationError) -> str:
    # agentrl.config composes the tree this section is part of: imported when needed.
    from agentrl.config import key_problem

    problems = (
        ": ".join(key_problem(error, ServerConfig, "reward.judge.server"))
        for error in exc.errors(include_url=False)
    )
    return "; ".join(dict.fromkeys(problems))


class JudgeConfig(Section):
    """An LLM judge that scores responses from a rubric prompt (docs/guides/rewards.md).

    The judge model runs on rollout replicas of its own: a Serve application (named
    ``judge`` unless ``server`` says otherwise) that never receives weight pushes. Without
    ``model_path`` it serves the policy's initial weights (the frozen initial policy).
    """

    enabled: bool = Field(False, description="Score responses with the LLM judge.")
    mode: Literal["pointwise", "group"] = Field(
        "pointwise",
        description="`pointwise`: each response judged on its own. `group`: the responses "
        "of one prompt judged together, relative to each other (RULER-style), one score each.",
    )
    model_path: str | None = Field(
        None,
        description="The judge model (an HF id, a directory or builtin:<name>) and its "
        "tokenizer; None: the policy's `model.path`, its initial weights, never updated.",
    )
    server: dict[str, Any] = Field(
        default_factory=dict,
        description="Keys of the policy's `server` section to change for the judge's "
        "replicas, e.g. {num_replicas: 2, engine: {max_model_len: 4096}}; the judge starts "
        "from the policy's with name `judge` and 1 replica.",
    )
    rubric: str | None = Field(
        None,
        description="The judge's prompt template. pointwise: {prompt}, {response}, "
        "{ground_truth}, {max_score}; group: {prompt}, {responses} (numbered), {count}, "
        "{ground_truth}, {max_score}. None: the built-in rubric of the mode and verdict.",
    )
    rubric_path: str | None = Field(
        None, description="A text file holding the rubric template (instead of `rubric`)."
    )
    verdict: Literal["number", "yes_no"] = Field(
        "number",
        description="What the judge writes in its tag: a number from 0 to `max_score` "
        "(divided by it), or yes/no (1/0). Group mode numbers each response's tag: "
        "<score_1>, <score_2>, ...",
    )
    tag: str = Field(
        "score",
        pattern=r"^[A-Za-z][\w-]*$",
        description="The tag the verdict is read from: what follows the judge's last "
        "<score>, up to the next `<` (its closing tag) or the end of the line.",
    )
    max_score: float = Field(10.0, gt=0, description="The top of the judge's number scale.")
    prefill: str = Field(
        "",
        description="Text the judge's answer starts with, appended after its prompt and "
        "read as part of the answer; `<score>` makes a small judge write its verdict first.",
    )
    weight: float = Field(1.0, description="Weight of the judge's score in the reward.")
    fn_weight: float = Field(
        0.0,
        description="Weight of the reward function's score (`reward_fn_path` or the "
        "built-in scorers) in the reward: reward = weight x judge + fn_weight x function. "
        "0: the judge alone (the function is not called).",
    )
    max_tokens: int = Field(256, ge=1, description="Tokens the judge may write per verdict.")
    temperature: float = Field(0.0, ge=0, description="The judge's sampling temperature.")
    timeout_s: float = Field(
        60.0, gt=0, description="Limit of one judge call; past it the reward is a timeout."
    )
    max_concurrency: int = Field(16, ge=1, description="Judge calls running at once.")
    cache_size: int = Field(
        4096,
        ge=0,
        description="Verdicts kept, keyed by the judge's whole input (prompt, response, "
        "ground truth): an identical pair is judged once. 0: no cache.",
    )

    @model_validator(mode="after")
    def _rubric_fits_the_mode(self) -> JudgeConfig:
        if self.rubric is not None and self.rubric_path is not None:
            raise ValueError("reward.judge: set `rubric` or `rubric_path`, not both")
        judge_server(ServerConfig(), self.server)
        if self.rubric is not None:
            problems = rubric_problems(self.rubric, self.mode)
            if problems:
                raise ValueError(f"reward.judge.rubric: {'; '.join(problems)}")
        return self


class RewardConfig(Section):
    """Which reward function scores responses, and how calls to it are run."""

    reward_fn_path: str | None = Field(
        None,
        description="Python file or module defining the reward function; None = built-in "
        "scorers chosen by data_source (math: boxed answer or final number).",
    )
    reward_fn_name: str = Field(
        "compute_score",
        description="Function in `reward_fn_path`: (data_source, solution_str, ground_truth, "
        "extra_info) -> float | dict with 'score'.",
    )
    executor: Literal["thread", "process"] = Field(
        "thread",
        description="Where reward calls run: `thread` (cheap; a timed-out call is abandoned) "
        "or `process` (spawn pool; CPU-heavy scorers, hard timeouts).",
    )
    num_workers: int = Field(4, ge=1, description="Reward calls running at once.")
    timeout_s: float = Field(
        30.0, gt=0, description="Per-call limit in seconds; a call past it scores 0."
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig,
        description="An LLM judge as the reward, alone or weighted with the reward function.",
    )
