"""``textarena:ID``: a TextArena game as a text environment.

The model plays ``player_id`` (default 0). Single-player games need nothing else; a
two-player game needs an ``opponent``: a callable ``opponent(observation) -> action``
(a ``textarena.Agent`` is one), given as the object or as an import path
``pkg.module:name`` (a class there is instantiated without arguments), or ``"self"``: the
policy being trained (self-play, :mod:`agentrl.envs.self_play`). A callable opponent sees
what TextArena's LLM agents see: its whole history as one text. The model, and the
policy in the opponent's seat, see a chat:
each turn's user message holds only what happened since its last move (the game's
messages and the opponent's moves, as ``[SENDER] text`` lines), never its own move again.

The game's reward for the model's player comes when the game ends (TextArena scores at
the end); every earlier turn earns 0. The last step's ``info["player_rewards"]`` holds
every player's reward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import textarena
from textarena.core import ObservationType
from textarena.envs.registration import ENV_REGISTRY

from agentrl.envs.base import EnvError, Message, StepResult
from agentrl.envs.registry import import_callable
from agentrl.envs.self_play import SelfPlayPolicy

Opponent = Callable[[str], str]

SELF = "self"
"""``opponent: self``: the policy being trained plays the other seat."""

# TextArena seeds Python's global random in reset: resets of concurrent episodes take turns,
# so that a seed gives the same game (randomness drawn later in a game may interleave).
_RESET_LOCK = threading.Lock()


def available_ids() -> list[str]:
    """Every registered TextArena game id (its ``-raw`` and ``-train`` variants included)."""
    return sorted(ENV_REGISTRY)


def make(env_id: str, **kwargs: Any) -> TextArenaEnv:
    """The factory behind ``textarena:ID`` (``kwargs``: see ``TextArenaEnv``)."""
    return TextArenaEnv(env_id, **kwargs)


class TextArenaEnv:
    """A TextArena game behind the ``SyncTextEnv`` methods.

    ``player_id``: the model's player. ``opponent``: the other player's policy (see the
    module docstring); ``num_players``: default 1 without an opponent, 2 with one.
    ``system_prompt``: a system message first, if given. Other keyword arguments go to
    ``textarena.make`` (the game's own settings).
    """

    def __init__(
        self,
        env_id: str,
        *,
        player_id: int = 0,
        opponent: str | Opponent | None = None,
        num_players: int | None = None,
        system_prompt: str | None = None,
        **make_kwargs: Any,
    ) -> None:
        self.env = textarena.make(env_id, **make_kwargs)
        self.env_id = env_id
        self.num_players = num_players or (1 if opponent is None else 2)
        if not 0 <= player_id < self.num_players:
            raise EnvError(
                f"textarena:{env_id} player_id {player_id} is not one of {self.num_players} players"
            )
        if self.num_players > 2:
            raise EnvError(
                f"textarena:{env_id} with {self.num_players} players: one opponent policy "
                "plays one player; games of more than two players are not supported"
            )
        if self.num_players == 2 and opponent is None:
            raise EnvError(
                f"textarena:{env_id} with two players needs an opponent "
                "(rollout.env.kwargs.opponent: pkg.module:policy, policy(observation) -> action)"
            )
        self.player_id = player_id
        self.self_play = opponent == SELF
        self.opponent = None if opponent is None or self.self_play else _opponent(opponent)
        self._policy: SelfPlayPolicy | None = None
        self.system_prompt = system_prompt
        # The innermost game: its observations are the raw (sender, text, type) messages.
        game = self.env
        while isinstance(game, textarena.Wrapper):
            game = game.env
        self._game = game
        self._opponent_history = ""
        self._opened: set[int] = set()  # the seats the policy has had its opening for

    def bind_policy(self, policy: SelfPlayPolicy) -> None:
        """Take the policy for the opponent's seat (used with ``opponent: self`` only)."""
        if self.self_play:
            self._policy = policy

    def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A new game (``seed`` seeds it); the opponent moves first if it opens."""
        with _RESET_LOCK:
            self.env.reset(num_players=self.num_players, seed=seed)
        self._opponent_history = ""
        self._opened.clear()
        done = self._opponent_moves()
        if done:
            raise EnvError(f"textarena:{self.env_id} ended before the model's first move")
        return self._opening(self._observation(self.player_id)), {}

    def _opening(self, observation: str) -> list[Message]:
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": observation})
        return messages

    def step(self, message: Message) -> StepResult:
        """The model's move, then the opponent's until it is the model's turn again."""
        done, info = self.env.step(message.get("content") or "")
        done = done or self._opponent_moves()
        observation = self._observation(self.player_id)
        messages = [{"role": "user", "content": observation}] if observation else []
        if not done:
            return StepResult(messages, 0.0, info=dict(info or {}))
        rewards, game_info = self.env.close()
        rewards = {pid: float(r) for pid, r in (rewards or {}).items()}
        return StepResult(
            messages,
            rewards.get(self.player_id, 0.0),
            terminated=True,
            info={**(game_info or {}).get(self.player_id, {}), "player_rewards": rewards},
        )

    def _opponent_moves(self) -> bool:
        """Let the opponent play while it is its turn; whether the game ended."""
        while (seat := self._game.state.current_player_id) != self.player_id:
            if self._game.state.done or (self.opponent is None and not self.self_play):
                return bool(self._game.state.done)
            done, _ = self.env.step(self._opponent_move(seat))
            if done:
                return True
        return bool(self._game.state.done)

    def _opponent_move(self, seat: int) -> str:
        if self.self_play:
            if self._policy is None:
                raise EnvError(
                    f"textarena:{self.env_id} with opponent: self needs the policy for seat "
                    f"{seat}: it plays in the `env` agent loop only"
                )
            observation = self._observation(seat)
            first = seat not in self._opened
            self._opened.add(seat)
            messages = (
                self._opening(observation) if first else [{"role": "user", "content": observation}]
            )
            return self._policy.move_blocking(seat, messages)
        assert self.opponent is not None
        _, observation = self._game.get_observation()
        self._opponent_history += "".join(f"\n{self._line(m)}" for m in observation)
        return self.opponent(self._opponent_history)

    def _observation(self, seat: int) -> str:
        """What reached ``seat`` since its last move, its own move left out."""
        state = self._game.state
        queue = state.observations.get(seat, [])
        state.observations[seat] = []
        lines = [
            self._line(m)
            for m in queue
            if not (m[0] == seat and m[2] == ObservationType.PLAYER_ACTION)
        ]
        return "\n".join(lines).strip()

    def _line(self, message: tuple[int, str, Any]) -> str:
        sender, text, _ = message
        if sender == textarena.GAME_ID:
            name = "GAME"
        else:
            name = self._game.state.role_mapping.get(sender, f"Player {sender}")
        return f"[{name}] {text}"


def _opponent(spec: str | Opponent) -> Opponent:
    if isinstance(spec, str):
        policy = import_callable(spec, "textarena opponent")
        return policy() if isinstance(policy, type) else policy
    if not callable(spec):
        raise EnvError(f"textarena opponent {spec!r} is not callable")
    return spec
