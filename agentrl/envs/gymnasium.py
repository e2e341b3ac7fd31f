"""``gymnasium:ID``: a Gymnasium environment as a text environment.

An observation renderer writes each observation as text and an action parser reads the
model's action from its turn. The toy-text environments (FrozenLake, Taxi, Blackjack,
CliffWalking, and any map of theirs) have their own renderers and action names; any other
environment with a discrete action space reads ``Observation: ...`` and answers with an
action's number. Both are replaceable (``render``, ``parse``: callables or import paths
``pkg.module:fn``), as is the opening text (``instructions``).

``render(observation, env) -> str`` gets the unwrapped environment; ``parse(text, env)``
returns the action, or None when the turn names none (the model is told, the turn earns
``invalid_action_reward`` and the episode goes on).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium

from agentrl.envs.base import EnvError, Message, StepResult
from agentrl.envs.registry import import_callable

Render = Callable[[Any, Any], str]
Parse = Callable[[str, Any], Any]


def available_ids() -> list[str]:
    """Every registered Gymnasium environment id."""
    return sorted(gymnasium.registry)


def make(env_id: str, **kwargs: Any) -> GymnasiumEnv:
    """The factory behind ``gymnasium:ID`` (``kwargs``: see ``GymnasiumEnv``)."""
    return GymnasiumEnv(env_id, **kwargs)


@dataclass(frozen=True)
class TextForm:
    """How one kind of environment reads as text: the task, the action names (action
    ``i`` is ``actions[i]``) and the observation renderer."""

    task: str
    actions: tuple[str, ...]
    render: Render


def _grid(cells: list[list[str]], row: int, col: int) -> str:
    cells = [list(line) for line in cells]
    cells[row][col] = "P"
    return "\n".join("".join(line) for line in cells)


def render_frozen_lake(observation: Any, env: Any) -> str:
    """The map with the player as ``P`` and the player's row and column."""
    row, col = divmod(int(observation), env.ncol)
    cells = [[c.decode() for c in line] for line in env.desc]
    return f"{_grid(cells, row, col)}\nYou are at row {row}, column {col}."


def render_cliff_walking(observation: Any, env: Any) -> str:
    """The grid (``C`` cliff, ``S`` start, ``G`` goal) with the player as ``P``."""
    rows, cols = env.shape
    cells = [["C" if env._cliff[r, c] else "." for c in range(cols)] for r in range(rows)]
    cells[rows - 1][0], cells[rows - 1][cols - 1] = "S", "G"
    row, col = divmod(int(observation), cols)
    return f"{_grid(cells, row, col)}\nYou are at row {row}, column {col}."


_TAXI_STOPS = "RGYB"


def render_taxi(observation: Any, env: Any) -> str:
    """The map with the taxi as ``T``, where the passenger waits and where they go."""
    row, col, passenger, destination = (int(v) for v in env.decode(int(observation)))
    cells = [[c.decode() for c in line] for line in env.desc]
    cells[1 + row][2 * col + 1] = "T"
    where = "in the taxi" if passenger == 4 else f"waiting at {_TAXI_STOPS[passenger]}"
    return (
        "\n".join("".join(line) for line in cells)
        + f"\nThe taxi is at row {row}, column {col}. The passenger is {where}; the "
        f"destination is {_TAXI_STOPS[destination]}."
    )


def render_blackjack(observation: Any, env: Any) -> str:
    """The player's sum (and a usable ace) and the dealer's showing card."""
    total, dealer, ace = (int(v) for v in observation)
    ace_text = " with a usable ace" if ace else ""
    return f"Your cards sum to {total}{ace_text}. The dealer shows {dealer}."


TOY_TEXT = "gymnasium.envs.toy_text"
TEXT_FORMS: dict[str, TextForm] = {
    f"{TOY_TEXT}.frozen_lake:FrozenLakeEnv": TextForm(
        "You walk on a frozen lake from S to the goal G. F is frozen ice, H is a hole you "
        "fall into. Move one square per turn.",
        ("left", "down", "right", "up"),
        render_frozen_lake,
    ),
    f"{TOY_TEXT}.cliffwalking:CliffWalkingEnv": TextForm(
        "Walk from S to the goal G without stepping onto the cliff C (which sends you back "
        "to S). Each move costs a point.",
        ("up", "right", "down", "left"),
        render_cliff_walking,
    ),
    f"{TOY_TEXT}.taxi:TaxiEnv": TextForm(
        "You drive a taxi (T) on this map. Pick the passenger up at their stop and drop "
        "them off at the destination. Each move costs a point; a wrong pickup or dropoff "
        "costs ten.",
        ("south", "north", "east", "west", "pickup", "dropoff"),
        render_taxi,
    ),
    f"{TOY_TEXT}.blackjack:BlackjackEnv": TextForm(
        "You play blackjack against the dealer: get closer to 21 than the dealer without "
        "going over.",
        ("stick", "hit"),
        render_blackjack,
    ),
}
"""The text forms of environments by entry point (``module:Class``)."""


def render_plain(observation: Any, env: Any) -> str:
    """Any observation: ``Observation: <repr>``."""
    return f"Observation: {observation}"


def parse_named_action(text: str, names: Sequence[str]) -> int | None:
    """The index of the action named last in ``text`` (whole words, any case), or None."""
    pattern = r"\b(" + "|".join(re.escape(n) for n in names) + r")\b"
    found = re.findall(pattern, text, flags=re.IGNORECASE)
    if not found:
        return None
    lowered = [n.lower() for n in names]
    return lowered.index(found[-1].lower())


def _entry_point(spec: Any) -> str:
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry
    return f"{entry.__module__}:{entry.__qualname__}"


class GymnasiumEnv:
    """A Gymnasium environment behind the ``SyncTextEnv`` methods.

    ``render``, ``parse``: replace the observation renderer and the action parser
    (callables, or import paths ``pkg.module:fn``). ``instructions``: the text before the
    first observation (default: the task and the action names). ``system_prompt``: a
    system message first, if given. ``invalid_action_reward``: the reward of a turn that
    names no action. Other keyword arguments go to ``gymnasium.make`` (``is_slippery``,
    ``map_name``, ...).
    """

    def __init__(
        self,
        env_id: str,
        *,
        render: str | Render | None = None,
        parse: str | Parse | None = None,
        instructions: str | None = None,
        system_prompt: str | None = None,
        invalid_action_reward: float = 0.0,
        **make_kwargs: Any,
    ) -> None:
        self.env = gymnasium.make(env_id, **make_kwargs)
        self.env_id = env_id
        form = TEXT_FORMS.get(_entry_point(self.env.spec))
        space = self.env.action_space
        if form is None and parse is None and not isinstance(space, gymnasium.spaces.Discrete):
            raise EnvError(
                f"gymnasium:{env_id} has a {space} action space: give an action parser "
                "(rollout.env.kwargs.parse: pkg.module:fn, fn(text, env) -> action)"
            )
        if form is None:
            names = tuple(str(space.start + i) for i in range(space.n)) if parse is None else ()
            form = TextForm("", names, render_plain)
        self.action_names = form.actions
        self._render = import_callable(render, "gymnasium render") if render else form.render
        self._parse = import_callable(parse, "gymnasium parse") if parse else self._parse_name
        if instructions is None:
            choices = f"Answer with one action: {', '.join(form.actions)}." if form.actions else ""
            instructions = " ".join(part for part in (form.task, choices) if part)
        self.instructions = instructions
        self.system_prompt = system_prompt
        self.invalid_action_reward = invalid_action_reward

    def _parse_name(self, text: str, env: Any) -> Any:
        index = parse_named_action(text, self.action_names)
        if index is None:
            return None
        space = self.env.action_space
        return space.start + index if isinstance(space, gymnasium.spaces.Discrete) else index

    def _observation(self, observation: Any) -> str:
        return self._render(observation, self.env.unwrapped)

    def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The instructions and the first observation (``seed`` seeds ``env.reset``)."""
        observation, info = self.env.reset(seed=seed)
        text = self._observation(observation)
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        content = f"{self.instructions}\n\n{text}" if self.instructions else text
        messages.append({"role": "user", "content": content})
        return messages, dict(info)

    def step(self, message: Message) -> StepResult:
        """The action the turn names, applied; the next observation as a user message."""
        action = self._parse(message.get("content") or "", self.env.unwrapped)
        if action is None:
            names = ", ".join(self.action_names)
            hint = f" Answer with one of: {names}." if names else ""
            return StepResult(
                [{"role": "user", "content": f"That is not an action.{hint}"}],
                self.invalid_action_reward,
                info={"invalid_action": True},
            )
        observation, reward, terminated, truncated, info = self.env.step(action)
        content = self._observation(observation)
        return StepResult(
            [{"role": "user", "content": content}],
            reward,
            bool(terminated),
            bool(truncated),
            dict(info),
        )

    def close(self) -> None:
        self.env.close()
