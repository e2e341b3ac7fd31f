"""``reasoning_gym:NAME``: reasoning-gym's procedural datasets as rows, its scorers as the
reward, and a single-turn text environment.

- ``reasoning_gym_rows(name, size, seed)``: the dataset's problems as dataset rows
  (``prompt``, ``data_source: reasoning_gym/NAME``, ``reward_model.ground_truth``,
  ``extra_info.reasoning_gym``: where the problem comes from);
- ``compute_score``: the reward function of those rows (``reward.reward_fn_path:
  agentrl.envs.reasoning_gym``): the answer between ``<answer>`` tags, scored by the
  dataset's own ``score_answer``;
- ``ReasoningGymEnv`` (``rollout.env.source: reasoning_gym:NAME``): one turn, the same
  prompt and the same score as the step's reward.

A row names its problem by (dataset, config, seed, size, index), and scoring draws the
problem again from the same dataset, so the scorer sees exactly the entry (metadata
included) it was written for.
"""

from __future__ import annotations

import functools
import json
import random
from typing import Any

import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

from agentrl.envs.base import EnvError, Message, StepResult

DATA_SOURCE_PREFIX = "reasoning_gym/"
ANSWER_TAG = "answer"


def available_ids() -> list[str]:
    """Every reasoning-gym dataset name."""
    return sorted(reasoning_gym.factory.DATASETS)


def make(env_id: str, **kwargs: Any) -> ReasoningGymEnv:
    """The factory behind ``reasoning_gym:NAME`` (``kwargs``: see ``ReasoningGymEnv``)."""
    return ReasoningGymEnv(env_id, **kwargs)


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


@functools.lru_cache(maxsize=4096)
def _entry(name: str, config_json: str, seed: int, size: int, index: int) -> dict[str, Any]:
    # Some generators take a second per problem: the n samples of a group share one draw.
    return _dataset(name, config_json, seed, size)[index]


def _config_json(config: dict[str, Any] | None) -> str:
    return json.dumps(config or {}, sort_keys=True)


def system_prompt_text(system_prompt: str | None) -> str | None:
    """A reasoning-gym system prompt by name (``default``, ``simple``, ``direct``, ...),
    else ``system_prompt`` itself as the text (None: no system message)."""
    if system_prompt is None:
        return None
    return SYSTEM_PROMPTS.get(system_prompt, system_prompt)


def _prompt(question: str, system_prompt: str | None) -> list[Message]:
    text = system_prompt_text(system_prompt)
    system = [{"role": "system", "content": text}] if text else []
    return [*system, {"role": "user", "content": question}]


def reasoning_gym_rows(
    name: str,
    size: int,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    system_prompt: str | None = "default",
) -> list[dict[str, Any]]:
    """``size`` problems of dataset ``name`` (drawn from ``seed``, the generator's
    ``config``) as dataset rows.

    ``system_prompt``: a reasoning-gym prompt name (``default`` asks for the answer in
    ``<answer>`` tags), a text, or None. The rows carry ``extra_info.env_source``, so they
    also run in the ``env`` loop.
    """
    if name not in reasoning_gym.factory.DATASETS:
        raise EnvError(f"unknown reasoning_gym dataset {name!r}")
    config_json = _config_json(config)
    rows = []
    for index in range(size):
        entry = _dataset(name, config_json, seed, size)[index]
        where = {
            "dataset": name,
            "config": json.loads(config_json),
            "seed": seed,
            "size": size,
            "index": index,
            "system_prompt": system_prompt,
        }
        rows.append(
            {
                "prompt": _prompt(entry["question"], system_prompt),
                "data_source": f"{DATA_SOURCE_PREFIX}{name}",
                "reward_model": {"ground_truth": str(entry["answer"]), "style": "rule"},
                "extra_info": {"reasoning_gym": where, "env_source": f"reasoning_gym:{name}"},
            }
        )
    return rows


def _row_problem(where: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """(dataset name, dataset, entry) of a row's ``extra_info.reasoning_gym``."""
    name = where["dataset"]
    key = (name, _config_json(where.get("config")), int(where["seed"]), int(where["size"]))
    return name, _dataset(*key), _entry(*key, int(where["index"]))


def score(dataset: Any, entry: dict[str, Any], solution_str: str) -> dict[str, float]:
    """``score``: ``dataset``'s ``score_answer`` of the answer in ``solution_str`` (between
    ``<answer>`` tags; none scores 0); ``answer_found``: 1 when there was one."""
    answer = extract_answer(solution_str, tag_name=ANSWER_TAG)
    value = dataset.score_answer(answer=answer, entry=entry)
    return {"score": float(value), "answer_found": float(answer is not None)}


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
) -> dict[str, float]:
    """The reward function of ``reasoning_gym_rows`` rows (see ``score``)."""
    where = (extra_info or {}).get("reasoning_gym")
    if not where:
        raise ValueError(
            f"row of {data_source!r} has no extra_info.reasoning_gym (make rows with "
            "agentrl.envs.reasoning_gym.reasoning_gym_rows)"
        )
    _, dataset, entry = _row_problem(where)
    return score(dataset, entry, solution_str)


class ReasoningGymEnv:
    """One reasoning-gym problem per episode, answered in one turn (``SyncTextEnv``).

    The problem is the row's (``reasoning_gym_rows``), else one drawn from ``seed``
    with the generator's ``config``. The step's reward is ``score``'s.
    """

    def __init__(
        self,
        name: str,
        *,
        config: dict[str, Any] | None = None,
        system_prompt: str | None = "default",
    ) -> None:
        self.name = name
        self.config_json = _config_json(config)
        self.system_prompt = system_prompt
        self.dataset: Any = None
        self.entry: dict[str, Any] | None = None

    def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The problem's prompt; ``info["answer"]`` is its reference answer."""
        where = ((row or {}).get("extra_info") or {}).get("reasoning_gym")
        if where:
            name, self.dataset, self.entry = _row_problem(where)
            if name != self.name:
                raise EnvError(f"the row holds a {name} problem, not a {self.name} one")
            system_prompt = where.get("system_prompt", self.system_prompt)
        else:
            drawn = seed if seed is not None else random.SystemRandom().randrange(2**31)
            key = (self.name, self.config_json, drawn, 1)
            self.dataset, self.entry = _dataset(*key), _entry(*key, 0)
            system_prompt = self.system_prompt
        return _prompt(self.entry["question"], system_prompt), {"answer": self.entry["answer"]}

    def step(self, message: Message) -> StepResult:
        """The answer scored; the episode ends (``info``: ``score``'s dict)."""
        if self.entry is None:
            raise EnvError("step before reset")
        scored = score(self.dataset, self.entry, message.get("content") or "")
        return StepResult([], scored["score"], terminated=True, info=scored)
