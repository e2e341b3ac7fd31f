"""The TextArena adapter against the real textarena package: a single-player game, a
two-player game against a scripted opponent (either side opening), whole episodes."""

from __future__ import annotations

import re
import textwrap

import pytest

from agentrl.core.types import SamplingParams
from agentrl.envs import EnvError, UnknownEnvError, env_factory

SAMPLING = SamplingParams(max_tokens=32)
OPPONENT = textwrap.dedent(
    """
    import re

    def first_free(observation):
        # The last board's moves: the opponent takes the lowest free cell.
        moves = re.findall(r"'\\[(\\d)\\]'", observation.rsplit("Available Moves:", 1)[-1])
        return f"[{moves[0]}]"
    """
)


def _first_free(observation: str) -> str:
    moves = re.findall(r"'\[(\d)\]'", observation.rsplit("Available Moves:", 1)[-1])
    return f"[{moves[0]}]"


def _say(text: str) -> dict:
    return {"role": "assistant", "content": text, "tool_calls": []}


def test_guess_the_number_hints_until_the_guess_is_right():
    env = env_factory("textarena:GuessTheNumber-v0")(min_number=1, max_number=20)
    messages, _ = env.reset(seed=3)
    assert "You are playing Guess The Number" in messages[0]["content"]
    target = env._game.state.game_state["game_number"]
    wrong = 1 if target != 1 else 2
    result = env.step(_say(f"My guess: [{wrong}]"))
    assert result.messages == [{"role": "user", "content": "[GAME] The target number is higher."}]
    assert (result.reward, result.done) == (0.0, False)
    result = env.step(_say(f"[{target}]"))
    assert result.terminated and result.reward == 1.0
    assert "guessed the correct number" in result.info["reason"]


def test_a_seed_gives_the_same_game():
    make = env_factory("textarena:GuessTheNumber-v0")
    games = []
    for _ in range(2):
        env = make()
        env.reset(seed=11)
        games.append(env._game.state.game_state["game_number"])
    assert games[0] == games[1]


def test_two_players_against_a_scripted_opponent_named_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "ttt_opponents.py").write_text(OPPONENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = env_factory("textarena:TicTacToe-v0")(opponent="ttt_opponents:first_free")
    messages, _ = env.reset(seed=0)
    assert "You are Player 0 in Tic Tac Toe" in messages[0]["content"]
    first = env.step(_say("[4]"))
    text = first.messages[0]["content"]
    # The model's own move is not echoed back; the opponent's move is.
    assert "[Player 0] [4]" not in text and "[Player 1] [0]" in text
    assert "placed their symbol (O) in cell 4" in text
    # O at 3, 4, 5 wins: the opponent, taking 0 then 1, never blocks.
    results = [first, env.step(_say("[3]")), env.step(_say("[5]"))]
    assert [r.reward for r in results] == [0.0, 0.0, 1.0]
    assert results[-1].terminated and "Player 0 has won" in results[-1].info["reason"]


def test_the_model_can_play_second_after_the_opponent_opens():
    env = env_factory("textarena:TicTacToe-v0")(opponent=_first_free, player_id=1)
    messages, _ = env.reset(seed=0)
    assert "You are Player 1" in messages[0]["content"]
    assert "[Player 0] [0]" in messages[0]["content"]


def test_losing_to_the_opponent_costs_one():
    env = env_factory("textarena:TicTacToe-v0")(opponent=_first_free)
    env.reset(seed=0)
    results = [env.step(_say(move)) for move in ("[4]", "[8]", "[6]")]
    assert [r.reward for r in results] == [0.0, 0.0, -1.0]
    assert "Player 1 has won" in results[-1].info["reason"]


def test_a_two_player_game_without_an_opponent_is_a_clear_error():
    with pytest.raises(EnvError, match="with two players needs an opponent"):
        env_factory("textarena:TicTacToe-v0")(num_players=2)


def test_an_unknown_id_lists_the_closest_of_the_hundreds():
    with pytest.raises(UnknownEnvError, match=r"closest: TicTacToe-v0.*\d{3} available"):
        env_factory("textarena:TicTacToe")


async def test_the_env_loop_plays_guess_the_number_to_the_win(make_loop):
    # Numbers 1-3 guessed in order: the game is won within three turns.
    loop = make_loop(
        ["[1]", "[2]", "[3]"],
        source="textarena:GuessTheNumber-v0",
        kwargs={"min_number": 1, "max_number": 3},
    )
    out = await loop.run({"prompt": [], "extra_info": {"env_seed": 5}}, SAMPLING)
    assert out.extra["stop_reason"] == "terminated" and out.reward == 1.0
    assert out.extra["turn_rewards"][-1] == 1.0 and set(out.extra["turn_rewards"][:-1]) <= {0.0}
    assert out.metrics["tokenization_drift"] == 0


async def test_the_env_loop_plays_tic_tac_toe_against_the_opponent(make_loop):
    loop = make_loop(
        ["[4]", "[3]", "[5]"], source="textarena:TicTacToe-v0", kwargs={"opponent": _first_free}
    )
    out = await loop.run({"prompt": [], "extra_info": {"env_seed": 0}}, SAMPLING)
    assert out.extra["turn_rewards"] == [0.0, 0.0, 1.0]
    assert out.metrics["tokenization_drift"] == 0
    user_turns = [m["content"] for m in out.extra["messages"] if m["role"] == "user"]
    # The opening, two answers, and the final board (kept with the messages, not shown).
    assert len(user_turns) == 4 and "[Player 1] [1]" in user_turns[2]
    assert " O | O | O " in user_turns[3]
    assert out.response_mask[-1] == 1


def _user_turns(out) -> list[str]:
    return [m["content"] for m in out.extra["messages"] if m["role"] == "user"]


async def test_self_play_the_policy_plays_the_opponent_from_its_own_chat(make_loop):
    # One script for both seats, in move order: X 4, O 0, X 3, O 1, X 5 (X wins).
    loop = make_loop(
        ["[4]", "[0]", "[3]", "[1]", "[5]"],
        source="textarena:TicTacToe-v0",
        kwargs={"opponent": "self"},
    )
    out = await loop.run({"prompt": [], "extra_info": {"env_seed": 0}}, SAMPLING)
    assert not isinstance(out, list)  # self_play_trained: player (the default)
    assert out.extra["turn_rewards"] == [0.0, 0.0, 1.0]
    assert "[Player 1] [0]" in _user_turns(out)[1] and "[Player 1] [1]" in _user_turns(out)[2]
    assert out.metrics["tokenization_drift"] == 0


async def test_self_play_trains_both_seats_each_with_its_reward(make_loop, tokenizer):
    loop = make_loop(
        ["[4]", "[0]", "[3]", "[1]", "[5]"],
        source="textarena:TicTacToe-v0",
        kwargs={"opponent": "self"},
        self_play_trained="both",
    )
    player, opponent = await loop.run({"prompt": [], "extra_info": {"env_seed": 0}}, SAMPLING)
    assert (player.reward, opponent.reward) == (1.0, -1.0)
    assert opponent.extra["self_play_seat"] == 1
    assert opponent.extra["turn_rewards"] == [0.0, -1.0]
    # The opponent's chat: its opening (X's first move in it), then X's second move.
    turns = _user_turns(opponent)
    assert "You are Player 1" in turns[0] and "[Player 0] [4]" in turns[0]
    assert "[Player 0] [3]" in turns[1]
    # Its model turns are its own moves, kept token-exact with mask 1.
    pairs = zip(opponent.response_ids, opponent.response_mask, strict=True)
    said = tokenizer.decode([token for token, mask in pairs if mask])
    assert "[0]" in said and "[1]" in said and "[4]" not in said
    assert sum(opponent.response_mask) < len(opponent.response_mask)  # env tokens: mask 0
    assert opponent.extra["turn_ends"][-1] <= len(opponent.response_ids)


async def test_self_play_where_the_opponent_opens(make_loop):
    loop = make_loop(
        ["[0]", "[4]", "[1]", "[3]", "[8]", "[5]"],
        source="textarena:TicTacToe-v0",
        kwargs={"opponent": "self", "player_id": 1},
        self_play_trained="both",
    )
    player, opponent = await loop.run({"prompt": [], "extra_info": {"env_seed": 0}}, SAMPLING)
    assert (
        "You are Player 1" in _user_turns(player)[0] and "[Player 0] [0]" in _user_turns(player)[0]
    )
    assert opponent.extra["self_play_seat"] == 0
    assert (player.reward, opponent.reward) == (1.0, -1.0)  # O takes 3, 4, 5


async def test_self_play_on_the_event_loop_is_a_recorded_error_not_a_hang(make_loop):
    loop = make_loop(
        ["[4]", "[0]"],
        source="textarena:TicTacToe-v0",
        kwargs={"opponent": "self"},
        sync_in_thread=False,
    )
    with pytest.raises(EnvError, match="sync_in_thread: true"):
        await loop.run({"prompt": [], "extra_info": {"env_seed": 0}}, SAMPLING)


def test_self_play_outside_the_env_loop_opens_but_cannot_move_the_opponent():
    env = env_factory("textarena:TicTacToe-v0")(opponent="self")
    messages, _ = env.reset(seed=0)  # the rows command reads the opening this way
    assert "You are Player 0" in messages[0]["content"]
    with pytest.raises(EnvError, match="in the `env` agent loop only"):
        env.step(_say("[4]"))
    with pytest.raises(EnvError, match="policy for seat 0"):
        env_factory("textarena:TicTacToe-v0")(opponent="self", player_id=1).reset(seed=0)
